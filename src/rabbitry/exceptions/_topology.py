"""The topology and management HTTP API errors.

Part of the :mod:`rabbitry.exceptions` package, whose ``__init__`` is its only face.
"""

from __future__ import annotations

from typing import Any

from ._base import AMQPError

# --------------------------------------------------------------------------- topology


class TopologyError(AMQPError):
    """Declaring, verifying or deleting topology, or moving a failed message, went wrong.

    The :mod:`rabbitry.topology` errors derive from it; it is also raised as it is, e.g.
    when a retry move was returned unroutable. Broker errors that caused it are chained
    as ``__cause__``.
    """


class TopologyValidationError(TopologyError, ValueError):
    """A declaration breaks a RabbitMQ rule; found before anything is sent.

    The message names the entity, the field and the rule, e.g. ``queue 'jobs':
    message_ttl (x-message-ttl): must be an integer in 0..4294967295 (milliseconds),
    got -1``.

    Attributes:
        entity: the entity, e.g. ``"queue 'jobs'"``.
        field: the offending field (or argument) name.
        rule: the rule that was broken, with the value given.
    """

    def __init__(self, entity: str, field: str, rule: str) -> None:
        super().__init__(f"{entity}: {field}: {rule}")
        self.entity = entity
        self.field = field
        self.rule = rule

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.entity, self.field, self.rule))


class TopologyConflict(TopologyError):
    """An entity already exists with other properties (406 PRECONDITION_FAILED).

    RabbitMQ refuses to re-declare an exchange or queue with different arguments and
    names the first one that differs; this carries it. The channel that got the 406 is
    closed, the connection stays usable, and the ``PreconditionFailed`` is ``__cause__``.

    Attributes:
        kind: ``"exchange"`` or ``"queue"``.
        name: the entity's name.
        argument: the differing argument (``"x-message-ttl"``, ``"durable"``, ``"type"``…),
            or ``None`` when the broker's reply did not name one.
        ours: the value we declared (``None``: not set by us).
        theirs: the value the existing entity has (``None``: not set there).
        reply_text: the broker's reply text, as received.
    """

    def __init__(
        self,
        kind: str,
        name: str,
        argument: str | None,
        ours: Any,
        theirs: Any,
        reply_text: str,
    ) -> None:
        if argument is None:
            text = f"{kind} {name!r} cannot be declared as given: {reply_text}"
        else:
            text = (
                f"{kind} {name!r} exists with {argument}={_show(theirs)}, "
                f"but the topology declares {argument}={_show(ours)}"
            )
        super().__init__(text)
        self.kind = kind
        self.name = name
        self.argument = argument
        self.ours = ours
        self.theirs = theirs
        self.reply_text = reply_text

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.kind, self.name, self.argument, self.ours, self.theirs, self.reply_text),
        )


class TopologyMissingExchange(TopologyError):
    """An alternate exchange or dead-letter exchange the topology names does not exist.

    Neither the topology declares it nor does the broker have it. RabbitMQ accepts such
    a name without complaint and then drops the messages that should go there: an
    unroutable message (alternate exchange) or a rejected, expired or overflowing one
    (dead-letter exchange) is lost.

    Attributes:
        missing: one ``(entity, field, exchange)`` per dangling reference, e.g.
            ``("queue 'jobs'", "dead_letter_exchange", "jobs.dlx")``.
    """

    def __init__(self, missing: tuple[tuple[str, str, str], ...]) -> None:
        lines = "; ".join(
            f"{entity}: {field} {exchange!r} does not exist" for entity, field, exchange in missing
        )
        super().__init__(
            f"{lines} (not in the topology, not on the broker): messages sent there would be "
            "dropped. Add the exchange to the topology, or pass missing_exchanges='warn'"
        )
        self.missing = missing

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.missing,))


def _show(value: Any) -> str:
    return "(not set)" if value is None else repr(value)


# --------------------------------------------------------------------------- management


class ManagementError(AMQPError):
    """The management HTTP API answered with an error, or could not be reached.

    Attributes:
        status: the HTTP status code (``None`` when no answer came: refused, timed out).
        reason: the API's own explanation (its JSON ``reason``), or the transport error.
        method: the HTTP method of the request.
        path: the request path (never carries credentials).
    """

    def __init__(self, status: int | None, reason: str, method: str = "", path: str = "") -> None:
        where = f"{method} {path}: " if method else ""
        code = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"{where}{code}: {reason}")
        self.status = status
        self.reason = reason
        self.method = method
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.reason, self.method, self.path))


class ManagementNotFound(ManagementError):
    """The management API says the queue, exchange, vhost, policy or connection does not
    exist: a 404, or a 400 whose reason is the broker's ``404 NOT_FOUND`` (what the API
    answers when publishing to a missing exchange; ``status`` is then 400)."""
