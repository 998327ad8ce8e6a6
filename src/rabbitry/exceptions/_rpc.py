"""The request/reply errors, and ``ServiceStopped``.

Part of the :mod:`rabbitry.exceptions` package, whose ``__init__`` is its only face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import AMQPError, Timeout

if TYPE_CHECKING:
    from ._base import Message

# --------------------------------------------------------------------------- services


class ServiceStopped(BaseException):
    """Raised in the main thread of a plain-function service by the first stop signal.

    A ``BaseException`` so that ``except Exception`` in application code does not
    swallow it. :func:`run` catches it; code that must clean up uses ``with`` or
    ``finally``.

    Attributes:
        signum: the signal received.
    """

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

    def __init__(self, routing_key: str, message: str) -> None:
        super().__init__(message)
        self.routing_key = routing_key

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, str(self)))


class RpcUnroutable(RpcError):
    """The broker returned the request: no queue is bound for its routing key."""

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

    def __init__(self, routing_key: str, error: str, reply: Message | None = None) -> None:
        super().__init__(routing_key, f"RPC handler for {routing_key!r} failed: {error}")
        self.error = error
        self.reply = reply

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, self.error))


class RpcTimeout(RpcError, Timeout):
    """No reply arrived within the call's timeout.

    Attributes:
        timeout: the call's timeout in seconds.
    """

    def __init__(self, routing_key: str, timeout: float | None) -> None:
        super().__init__(
            routing_key, f"no reply to the RPC call to {routing_key!r} within {timeout} s"
        )
        self.timeout = timeout

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.routing_key, self.timeout))
