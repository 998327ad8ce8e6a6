"""What the broker tells of a classic/quorum queue: its depth and its type, and the
check that a read's ``queueType`` matches the type."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..exceptions import ConfigurationError, NotFound, PreconditionFailed

if TYPE_CHECKING:
    from ..sync.connection import Connection
    from ._options import ReadOptions

__all__ = ["broker_queue_type", "check_queue_type", "queue_depth"]


def queue_depth(options: ReadOptions) -> int:
    """Ready messages in the queue now (``queue.declare`` passive)."""
    conn = options.connect.connect(" [spark planner]")
    try:
        channel = conn.channel()
        try:
            return channel.queue_declare(options.queue, passive=True).message_count
        except NotFound:
            raise ConfigurationError(
                f"option queue: queue {options.queue!r} does not exist"
            ) from None
    finally:
        conn.close(timeout=5)


_REFUSED_TYPE = re.compile(r"of queue type rabbit_([a-z]+)_queue")


def broker_queue_type(conn: Connection, queue: str) -> str | None:
    """The type of ``queue`` as the broker states it: ``classic``, ``quorum``, ``stream``.

    AMQP 0-9-1 has no call that returns it, but a consumer with the ``x-stream-offset``
    argument is accepted by a stream only; classic and quorum queues refuse it with a
    406 naming their type (RabbitMQ 3.10 to 4.x). The probe runs on a channel of its
    own, closed afterwards (closing, not cancelling: nothing is rejected). None when the
    answer names no known type.
    """
    channel = conn.channel()
    try:
        channel.basic_qos(1)
        try:
            channel.basic_consume(
                queue, lambda message: None, arguments={"x-stream-offset": "next"}
            )
        except PreconditionFailed as exc:
            match = _REFUSED_TYPE.search(str(exc))
            return match.group(1) if match else None
        except ConfigurationError:
            # This connection declared the queue as a non-stream itself and refused the
            # argument before sending it: no answer from the broker.
            return None
        return "stream"
    finally:
        if channel.is_open:
            channel.close()


def check_queue_type(conn: Connection, options: ReadOptions) -> None:
    """Refuse a read whose ``queueType`` is not the queue's type.

    Raises:
        ConfigurationError: the queue does not exist, or the broker says it is of
            another type. A stream read as a queue would deliver only what is published
            after the read started; a quorum queue read as classic would skip the
            delivery-count refusal.
    """
    try:
        actual = broker_queue_type(conn, options.queue)
    except NotFound:
        raise ConfigurationError(f"option queue: queue {options.queue!r} does not exist") from None
    if actual is None or actual == options.queue_type:
        return
    why = {
        "stream": "read as a queue, a stream delivers only the messages published after "
        "the read started, so the rows would miss what it holds",
        "quorum": "every return raises a quorum queue's delivery count, which the read "
        "handles only when it knows (see acceptDeliveryCount)",
    }.get(actual, "the read depends on it")
    raise ConfigurationError(
        f"option queueType: queue {options.queue!r} is a {actual} queue (the broker says "
        f"so), got {options.queue_type!r}: {why}; set queueType={actual}"
    )
