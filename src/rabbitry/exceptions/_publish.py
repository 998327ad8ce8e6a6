"""Publishing errors: a publish the broker refused, lost or never confirmed, and the outbox.

Part of the :mod:`rabbitry.exceptions` package, whose ``__init__`` is its only face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import AMQPError, Timeout

if TYPE_CHECKING:
    from ._base import Message


# --------------------------------------------------------------------------- publish


class PublishError(AMQPError):
    """A published message was not accepted by the broker."""


class Nacked(PublishError):
    """The broker answered basic.nack for this publish (confirm mode).

    Attributes:
        delivery_tag: the publish sequence number the broker nacked.
    """

    def __init__(self, delivery_tag: int, message: str = "") -> None:
        super().__init__(message or f"the broker nacked publish #{delivery_tag}")
        self.delivery_tag = delivery_tag


class Unroutable(PublishError):
    """A mandatory publish was returned by the broker (basic.return).

    Attributes:
        message: the returned message, with ``reply_code`` and ``reply_text``.
    """

    def __init__(self, message: Message) -> None:
        super().__init__(
            f"({message.reply_code}) {message.reply_text}: exchange={message.exchange!r} "
            f"routing_key={message.routing_key!r}"
        )
        self.message = message


class PublishOutcomeUnknown(PublishError):
    """The channel or connection ended before the broker confirmed this publish.

    The message may or may not have been routed: resend it (with the same message_id)
    if at-least-once is wanted. ``__cause__`` is why the channel ended.

    Attributes:
        delivery_tag: the publish sequence number on the channel that ended.
        discarded: ``True`` when the message cannot have been routed: it was sent on
            the channel after a publish the broker refused, and the broker discards
            everything that follows the offending method on a channel it closes. Sending
            it again cannot make a duplicate.
    """

    def __init__(self, delivery_tag: int, message: str = "", *, discarded: bool = False) -> None:
        super().__init__(message or f"publish #{delivery_tag}: outcome unknown, channel ended")
        self.delivery_tag = delivery_tag
        self.discarded = discarded


class PublishRefused(PublishError):
    """The broker refused this publish: it closed the channel because of it.

    A definite answer, unlike :class:`PublishOutcomeUnknown`: the message was not
    routed, and sending it again unchanged fails the same way. Typical causes: 404 (the
    exchange does not exist), 403 (no write permission, or an internal exchange) and 406
    (a body above the broker's ``max_message_size``, a ``user_id`` that is not the
    connection's user). ``__cause__`` is the :class:`ChannelClosedByBroker` the broker
    sent.

    Attributes:
        delivery_tag: the publish sequence number on the channel that was closed.
        reply_code: the broker's reply code (404, 403, 406...).
        reply_text: the broker's explanation, as received.
    """

    def __init__(self, delivery_tag: int, reply_code: int, reply_text: str) -> None:
        super().__init__(
            f"publish #{delivery_tag} refused by the broker: ({reply_code}) {reply_text}"
        )
        self.delivery_tag = delivery_tag
        self.reply_code = reply_code
        self.reply_text = reply_text

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.delivery_tag, self.reply_code, self.reply_text))


class UnobservedPublishFailures(PublishError):
    """A publisher ended (``close()``, or the end of its ``with`` / ``async with`` block)
    while it held failed publishes whose outcome nobody looked at.

    A future returned by ``publish`` (sync) or ``send`` (asyncio) counts as looked at
    once its ``result()`` or ``exception()`` was called, it was awaited, or a
    done-callback was added to it before it failed. The failures are logged at ERROR
    too; when the block already ends with an exception, they are only logged, so that
    exception is not replaced.

    Attributes:
        count: how many failed publishes nobody looked at.
        failures: the first of them (at most a thousand), oldest first: each the
            exception its future holds (:class:`Unroutable`, :class:`PublishRefused`...).
        first: ``failures[0]``.
        what: the kind of publisher that ended ("Publisher", "AsyncBatchingPublisher"...).
    """

    def __init__(self, count: int, failures: list[BaseException], what: str = "publisher") -> None:
        first = failures[0] if failures else None
        super().__init__(
            f"{what} ended with {count} failed publish{'es' if count != 1 else ''} nobody "
            f"looked at; the first: {type(first).__name__}: {first}"
        )
        self.count = count
        self.failures = failures
        self.first = first
        self.what = what

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.count, self.failures, self.what))


class PublishTimeout(PublishError, Timeout):
    """A publish did not complete before its deadline.

    Raised by ``publish()`` when the deadline passed before the message could be sent
    (the connection stayed blocked, or the in-flight window stayed full): nothing was
    sent. Set on the publish's future when the broker did not confirm in time: the
    message may still be confirmed later, and stays in flight until it is.
    """


class OutboxFull(PublishTimeout):
    """The durable outbox stayed at its bound (rows or bytes) until the publish's deadline.

    Nothing was stored. The outbox drains as the broker confirms what it holds; while the
    broker is unreachable it stays full.

    Attributes:
        rows: the rows stored when the deadline passed.
        size: the bytes stored when the deadline passed.
    """

    def __init__(self, message: str, *, rows: int = 0, size: int = 0) -> None:
        super().__init__(message)
        self.rows = rows
        self.size = size


# --------------------------------------------------------------------------- outbox


class OutboxError(AMQPError):
    """The durable publisher outbox cannot be opened, read or written.

    Attributes:
        path: where the outbox lives (a file path, or a store's description).
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"outbox {path}: {message}")
        self.path = path


class OutboxLocked(OutboxError):
    """Another publisher (in this or another process) holds the outbox.

    One outbox serves one publisher at a time: two would send each other's messages.
    """


class OutboxCorrupt(OutboxError):
    """The outbox file is damaged or is not a rabbitry outbox; nothing was read from it."""
