"""The request/reply errors, and ``ServiceStopped``.

Part of :mod:`rabbitry.exceptions`, which re-exports every name; its classes say they
belong there (``__module__``), so their names, pickles and tracebacks are those of
``rabbitry.exceptions``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._errors_base import AMQPError

if TYPE_CHECKING:
    from ._errors_base import Message

# --------------------------------------------------------------------------- services


class ServiceStopped(BaseException):
    """Raised in the main thread of a plain-function service by the first stop signal.

    A ``BaseException`` so that ``except Exception`` in application code does not
    swallow it. :func:`run` catches it; code that must clean up uses ``with`` or
    ``finally``.

    Attributes:
        signum: the signal received.
    """

    __module__ = "rabbitry.exceptions"

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {_signal_name(signum)}")
        self.signum = signum


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# --------------------------------------------------------------------------- rpc


class RpcError(AMQPError):
    """A request/reply call of ``rabbitry.rpc`` failed.

    Attributes:
        routing_key: the routing key the request was sent with.
    """

    __module__ = "rabbitry.exceptions"

    def __init__(self, routing_key: str, message: str) -> None:
        super().__init__(message)
        self.routing_key = routing_key

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, str(self)))


class RpcUnroutable(RpcError):
    """The broker returned the request: no queue is bound for its routing key."""

    __module__ = "rabbitry.exceptions"

    def __init__(self, routing_key: str, reply_text: str = "NO_ROUTE") -> None:
        super().__init__(
            routing_key,
            f"RPC request to {routing_key!r} was returned by the broker ({reply_text}): "
            "is the server's queue declared?",
        )
        self.reply_text = reply_text

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, self.reply_text))


class RpcInterrupted(RpcError):
    """The connection or the client's channel was lost while the call waited for its
    reply; the server may or may not have handled the request.

    Attributes:
        reason: why (the connection's or the channel's close reason).
    """

    __module__ = "rabbitry.exceptions"

    def __init__(self, routing_key: str, reason: BaseException) -> None:
        super().__init__(
            routing_key,
            f"RPC call to {routing_key!r} interrupted before its reply: {reason!r} (the "
            "server may or may not have handled it)",
        )
        self.reason = reason
        self.__cause__ = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, self.reason))


class RpcRemoteError(RpcError):
    """The server's handler raised; its reply carried the error instead of a body.

    Attributes:
        error: ``"<exception type>: <text>"`` as the server reported it.
        reply: the error reply message.
    """

    __module__ = "rabbitry.exceptions"

    def __init__(self, routing_key: str, error: str, reply: Message | None = None) -> None:
        super().__init__(routing_key, f"RPC handler for {routing_key!r} failed: {error}")
        self.error = error
        self.reply = reply

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, self.error))
