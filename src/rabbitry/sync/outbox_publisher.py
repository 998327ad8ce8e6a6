"""OutboxPublisher: the thread-safe twin of :class:`rabbitry.AsyncOutboxPublisher`.

Same methods and parameters as the async twin (a test checks it). Every call is one
round trip to the IO thread (``portal.call``): ``publish()`` waits for a commit to disk
anyway, and publishes from many threads share commits (group commit) on the IO thread.
The writer thread of the outbox does the disk work; neither the IO thread nor the
caller's thread runs SQLite.
"""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING

from ..exceptions import InvalidStateError
from ..outbox_publisher import release_store
from ._connection import portal_of
from .channel import caller_timeout

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import timedelta

    from ..outbox import Outbox
    from ..outbox_publisher import AsyncOutboxPublisher, OutboxStats
    from ..protocol import spec
    from ..publisher import AsyncPublisher, Body, OutgoingMessage
    from ._connection import Connection

__all__ = ["OutboxPublisher"]


class OutboxPublisher:
    """Publishes through a durable outbox from any thread.

    Get one with ``connection.publisher(outbox=SQLiteOutbox(path))``; usable as ``with``.
    See :class:`rabbitry.AsyncOutboxPublisher` for the guarantees.
    """

    def __init__(self, connection: Connection, publisher: AsyncOutboxPublisher) -> None:
        self._connection = connection
        self._async = publisher
        self._portal = portal_of(connection)

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncOutboxPublisher", "OutboxPublisher", 1)

    def __enter__(self) -> OutboxPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def outbox(self) -> Outbox:
        """The store (and its policy: bound, confirm timeout, backoff)."""
        return self._async.outbox

    @property
    def publisher(self) -> AsyncPublisher:
        """The inner (asyncio) confirmed publisher that delivers the stored rows."""
        return self._async.publisher

    @property
    def timeout(self) -> float | None:
        """The default deadline of ``publish()`` for room in a full outbox."""
        return self._async.timeout

    @property
    def is_closed(self) -> bool:
        """``close()`` was called."""
        return self._async.is_closed

    def stats(self) -> OutboxStats:
        """Metrics (a snapshot taken on the IO thread); see the async twin."""
        if self._portal.in_io_thread():
            return self._async.stats()
        result: concurrent.futures.Future[OutboxStats] = concurrent.futures.Future()

        def snapshot() -> None:
            result.set_result(self._async.stats())

        self._portal.submit(snapshot)
        return result.result()

    def publish(
        self,
        body: Body,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> str:
        """Store one message durably (blocks until committed).

        As :meth:`AsyncOutboxPublisher.publish`; blocks while the outbox is full, up to
        ``timeout`` (then :class:`OutboxFull`).

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties; ``message_id`` is generated when absent.
            mandatory: ask the broker to return the message when no queue gets it
                (``None``: the publisher's default).
            persistent: ``True`` sets delivery mode 2 (persistent), ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.
            timeout: how long to wait for room while the outbox is at its bound
                (``None``: the publisher's default).

        Returns:
            The message's ``message_id``; every send of it carries the same one.
        """
        self._check_thread()
        if timeout is None:
            timeout = self._async.timeout
        return self._portal.call(
            self._async.publish,
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            mandatory=mandatory,
            persistent=persistent,
            expiration=expiration,
            timeout=timeout,
            wait=None,  # the IO thread bounds the wait for room; the commit is not bounded
        )

    def publish_many(
        self,
        messages: Iterable[OutgoingMessage | Body],
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> list[str]:
        """Store many messages in one transaction (all or none).

        As :meth:`AsyncOutboxPublisher.publish_many`.

        Args:
            messages: :class:`OutgoingMessage` objects, or bodies that use the arguments
                below; ``None`` fields of an ``OutgoingMessage`` use them too.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties; ``message_id`` is generated when absent.
            mandatory: ask the broker to return the message when no queue gets it
                (``None``: the publisher's default).
            persistent: ``True`` sets delivery mode 2 (persistent), ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.
            timeout: how long to wait for room for the whole batch.

        Returns:
            Their ``message_id``, in order.
        """
        self._check_thread()
        return self._portal.call(
            self._async.publish_many,
            list(messages),
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            mandatory=mandatory,
            persistent=persistent,
            expiration=expiration,
            timeout=timeout,
            wait=None,
        )

    def flush(self, *, timeout: float | None = None) -> None:
        """Block until the outbox is empty (see the async twin).

        Args:
            timeout: seconds to wait (``None``: no limit).

        Raises:
            PublishTimeout: messages were still pending after ``timeout`` seconds.
        """
        self._check_thread()
        self._portal.call(self._async.flush, timeout=timeout, wait=caller_timeout(timeout))

    def close(self, *, timeout: float | None = None) -> None:
        """Stop sending and release the outbox (see the async twin). Idempotent.

        Args:
            timeout: seconds to wait for the confirms of the messages in flight
                (``None``: no limit); what is not confirmed stays in the outbox.
        """
        if self._async.is_closed:
            return
        self._check_thread()
        if self._portal.stopped:
            # The connection (and its IO thread) is gone: nothing is in flight any more,
            # but the outbox file must still be released.
            release_store(self._async)
            return
        self._portal.call(self._async.close, timeout=timeout, wait=caller_timeout(timeout))

    def _check_thread(self) -> None:
        if self._portal.in_io_thread():
            raise InvalidStateError("called from the IO thread; it would deadlock")
