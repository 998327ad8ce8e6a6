"""Quorum and stream queues: client-side rules checked before ``basic.consume``.

RabbitMQ's replicated queue types accept a few AMQP 0-9-1 features only in a certain
form, and tell a client that got it wrong by closing its channel. These checks say the
same thing earlier, with the field and the rule, before anything goes on the wire:

* **Stream queues over AMQP 0-9-1** need manual acknowledgement and a prefetch
  (``basic.qos`` with a non-zero count) on the consuming channel; the acks only move
  the consumer's credit window, a stream never deletes what was read. Where to start
  reading is the consumer argument ``x-stream-offset``: ``"first"``, ``"last"`` (the
  last chunk), ``"next"`` (only new messages), an ``int`` offset, or a ``datetime``
  (sent as an AMQP timestamp: messages stored from that second on).
  :func:`stream_offset_argument` normalises and checks such a value. Each delivery
  carries its offset in the ``x-stream-offset`` header (``Message.stream_offset``).
* **Quorum and stream queues** do not support global QoS (``basic.qos`` with
  ``global_=True``), where the prefetch is shared by the channel's consumers.

The checks know a queue's type when it was declared on the same connection (the
topology record keeps its ``x-queue-type``); ``x-stream-offset`` in the consumer
arguments also marks a stream consumer.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["STREAM_OFFSET", "StreamOffset", "check_consume", "stream_offset_argument"]

#: The consumer argument (and delivery header) of a stream position.
STREAM_OFFSET: Final = "x-stream-offset"

#: What ``x-stream-offset`` may be.
StreamOffset = Literal["first", "last", "next"] | int | datetime

_SPECS: Final = ("first", "last", "next")
_MAX_OFFSET: Final = 2**63 - 1


def stream_offset_argument(offset: object, field: str = "x-stream-offset") -> StreamOffset:
    """Check ``offset`` as a value for the ``x-stream-offset`` consumer argument.

    Args:
        offset: the value.
        field: what the error message calls it.

    Returns:
        ``offset`` unchanged: ``"first"``, ``"last"``, ``"next"``, an ``int`` in
        0..2**63-1, or a ``datetime`` (naive means UTC; encoded as an AMQP timestamp).

    Raises:
        ConfigurationError: anything else, naming ``field`` and the rule.
    """
    if isinstance(offset, str):
        if offset in _SPECS:
            return offset  # type: ignore[return-value]
    elif isinstance(offset, datetime):
        return offset
    elif isinstance(offset, int) and not isinstance(offset, bool):
        if 0 <= offset <= _MAX_OFFSET:
            return offset
        raise ConfigurationError(f"{field}: an offset must be in 0..2**63-1, got {offset}")
    raise ConfigurationError(
        f"{field}: must be 'first', 'last', 'next', an int offset or a datetime, got {offset!r}"
    )


def _queue_type(record: Any, queue: str) -> str | None:
    """The ``x-queue-type`` the topology record knows for ``queue`` (or None)."""
    if record is None or not queue:
        return None
    recorded = record.queue(queue)
    if recorded is None:
        return None
    kind = recorded.arguments.get("x-queue-type")
    return kind if isinstance(kind, str) else None


def check_consume(
    queue: str,
    arguments: Mapping[str, Any] | None,
    *,
    no_ack: bool,
    qos: tuple[int, int, bool] | None,
    record: Any = None,
) -> None:
    """Refuse a ``basic.consume`` that a quorum or stream queue would reject.

    Args:
        queue: the queue consumed from.
        arguments: the consumer arguments.
        no_ack: automatic acknowledgement requested.
        qos: the channel's ``(prefetch_count, prefetch_size, global)`` or None.
        record: the connection's topology record, to look the queue's type up.

    Raises:
        ConfigurationError: a stream consumer without manual ack or without a
            prefetch, a bad ``x-stream-offset``, or global QoS on a quorum/stream queue.
    """
    kind = _queue_type(record, queue)
    stream = kind == "stream"
    if arguments and STREAM_OFFSET in arguments:
        stream_offset_argument(arguments[STREAM_OFFSET], f"arguments[{STREAM_OFFSET!r}]")
        if kind not in (None, "stream"):
            raise ConfigurationError(
                f"arguments[{STREAM_OFFSET!r}]: only stream queues take an offset, and "
                f"{queue!r} was declared as a {kind} queue"
            )
        stream = True
    if stream:
        what = f"consuming the stream queue {queue!r}"
        if no_ack:
            raise ConfigurationError(f"no_ack: {what} needs manual acknowledgement (ack='manual')")
        if qos is None or qos[0] == 0:
            raise ConfigurationError(
                f"prefetch: {what} needs a prefetch (basic.qos with a count of 1 or more) "
                "on the channel before basic.consume"
            )
    if qos is not None and qos[2] and (stream or kind == "quorum"):
        raise ConfigurationError(
            f"global_: {kind or 'stream'} queues do not support global QoS; "
            f"consume {queue!r} on a channel whose basic.qos has global_=False"
        )
