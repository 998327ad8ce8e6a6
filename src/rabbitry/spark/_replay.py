"""Whether a planned micro-batch of a classic/quorum queue may be replayed empty.

A source session holds its deliveries unacknowledged on its connection, which declares
an exclusive marker queue (:func:`session_marker`) for as long as it lives; the replay
check asks the broker whether that marker still exists.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..exceptions import AMQPError, NotFound, ReplayUnavailable

if TYPE_CHECKING:
    from ._options import ReadOptions

__all__ = ["replay_check", "session_marker"]

logger = logging.getLogger("rabbitry.spark")

_MARKER_PREFIX = "rabbitry.spark.source."


def session_marker(session: str) -> str:
    """The exclusive queue that exists while the source session ``session`` is connected."""
    return f"{_MARKER_PREFIX}{session}"


def replay_check(options: ReadOptions, start: int, end: int, session: str | None) -> None:
    """Allow the empty replay of batch ``[start, end)`` only if its messages are requeued.

    Spark replays a planned but uncommitted batch after the source restarted. The
    messages of that batch were held unacknowledged by the session that read them; once
    that session's connection is gone the broker has requeued them and they arrive again
    in later batches (``redelivered``), so the replay is rightly empty. If the session
    still exists, they are not back in the queue: raise instead of committing an empty
    batch over them.

    Raises:
        ReplayUnavailable: the session still holds the messages, or it cannot be checked.
    """
    queue = options.queue
    if session is None:
        logger.warning(
            "rabbitmq source %r: replaying batch [%d, %d) as empty (offsets without a "
            "session, written by an older version); its messages were requeued when the "
            "previous source stopped",
            queue,
            start,
            end,
        )
        return
    try:
        conn = options.connect.connect(" [spark replay check]")
    except AMQPError as exc:
        raise ReplayUnavailable(
            f"rabbitmq source {queue!r}: cannot check whether batch [{start}, {end}) was "
            f"returned to the queue ({exc}); refusing to replay it as empty"
        ) from exc
    try:
        channel = conn.channel()
        try:
            channel.queue_declare(session_marker(session), passive=True)
        except NotFound:
            logger.warning(
                "rabbitmq source %r: batch [%d, %d) is replayed empty: the source that read "
                "it is gone, so the broker requeued its messages; they arrive in later "
                "batches flagged redelivered",
                queue,
                start,
                end,
            )
            return
        except AMQPError:  # 405 RESOURCE_LOCKED: the session's exclusive queue exists
            pass
        raise ReplayUnavailable(
            f"rabbitmq source {queue!r}: batch [{start}, {end}) is planned but its messages "
            f"are still held by the live source session {session}; an empty replay would "
            "let that session acknowledge them later (data loss)"
        )
    finally:
        conn.close(timeout=5)
