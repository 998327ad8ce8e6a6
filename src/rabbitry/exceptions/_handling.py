"""What a consumer's handler raises to settle its message, and a consumer the broker cancelled.

Part of the :mod:`rabbitry.exceptions` package, whose ``__init__`` is its only face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import AMQPError

if TYPE_CHECKING:
    from ._base import Message


class HandlerSignal(Exception):
    """Raised by a consumer handler to say what should happen to the message.

    Not an :class:`AMQPError`: nothing went wrong in the library, and an
    ``except AMQPError`` around client calls must not catch a handler's decision.
    """


class Retry(HandlerSignal):
    """Raise from a handler to send the message down the retry path."""


class Reject(HandlerSignal):
    """Raise from a handler to park (or dead-letter) the message without retrying."""


class BatchFormatError(Reject, AMQPError, ValueError):
    """A batch envelope (``springBatchFormat`` header) cannot be split into its records.

    Its body is truncated or malformed, or its format is not one rabbitry knows. Being a
    :class:`Reject`, a consumer parks (or dead-letters) the envelope without retrying and
    logs it at ERROR; the iterators (``channel.consume()``) raise it with the envelope
    unsettled, for the caller to reject.

    Attributes:
        message: the envelope as delivered, when there is one.
    """

    def __init__(self, text: str, message: Message | None = None) -> None:
        super().__init__(text)
        self.message = message


class Requeue(HandlerSignal):
    """Raise from a handler to put the message back on its queue.

    Use sparingly: a message that always fails this way loops through the broker.
    """


class ConsumerCancelled(AMQPError):
    """The broker cancelled the consumer (basic.cancel), e.g. because its queue was deleted.

    Attributes:
        consumer_tag: the cancelled consumer's tag.
    """

    def __init__(self, consumer_tag: str) -> None:
        super().__init__(f"the broker cancelled consumer {consumer_tag!r}")
        self.consumer_tag = consumer_tag
