"""The machinery under :class:`rabbitry.consumer.AsyncConsumer`: its loop-thread half.

Subscribing, taking deliveries in, handing them to the handler (one at a time, or
batches and envelopes through :class:`~rabbitry._batch_consume.BatchHandling`, skipping
duplicates), and the broker's and the channel's events (cancel, close, resubscribe).
Settling and the failure path are the :class:`~rabbitry._consumer_settle.Settler`'s.
:class:`AsyncConsumer` derives from :class:`ConsumerCore`, which declares the
attributes ``AsyncConsumer.__init__`` sets and this half uses.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import TYPE_CHECKING, Any

from .batching import BATCH_FORMAT_HEADER
from .exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConsumerCancelled,
    PreconditionFailed,
)
from .observability import _state as _obs

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Awaitable, Callable

    from ._batch_consume import BatchHandling
    from ._consumer_settle import Settler
    from ._consumer_stores import ConsumerStats, DedupStore
    from ._consumer_subscribe import Subscriber
    from .aio.connection import AsyncConnection
    from .protocol.message import Message
    from .topology._retry import RetryPolicy

logger = logging.getLogger("rabbitry.consumer")

_ACK_TIMEOUT_TEXT = "delivery acknowledgement"
#: What may wait for a handler when the broker's prefetch does not bound it (auto ack,
#: or prefetch 0): messages (with prefetch 0) and body bytes, before the connection stops
#: reading the socket.
_INBOX_MESSAGES = 1024
_INBOX_BYTES = 16 * 1024 * 1024


class ConsumerCore:
    """Deliveries, settling and the broker's events: the machinery under AsyncConsumer.

    The sync ``Consumer``'s engine (``ThreadedConsumer`` in
    ``rabbitry.sync._consumer_threads``) derives from AsyncConsumer and overrides
    ``_pump`` (messages go to its handler threads' queue), ``_release_waiting`` and
    ``_on_channel_closed`` (it takes back what those threads have not started); it
    counts the messages queued for them in ``_running`` and keeps ``_idle`` with it.
    """

    # Set by AsyncConsumer.__init__.
    _conn: AsyncConnection
    queue: str
    _handler: Callable[[Any], object]
    _manual: bool
    concurrency: int
    prefetch: int
    retry: RetryPolicy | None
    batch_size: int | None
    batch_timeout: float
    exclusive: bool
    arguments: dict[str, Any] | None
    dedup: DedupStore | None
    on_cancel: Callable[[str], Any] | None
    resubscribe: bool
    stats: ConsumerStats
    consumer_tag: str | None
    _inbox: deque[Message | list[Message]]
    _bounded: bool
    _waiting: int
    _waiting_bytes: int
    _reads_paused: bool
    _batch: list[Message]
    _batch_timer: asyncio.TimerHandle | None
    _running: int
    _tasks: set[asyncio.Task[None]]
    _idle: asyncio.Event | None
    _ended: asyncio.Event | None
    _end_reason: AMQPError | None
    _stopping: bool
    _background: set[asyncio.Future[Any]]
    _release_on_cancel: bool
    _subscriber: Subscriber
    _settler: Settler
    _batches: BatchHandling

    def _end(self, reason: AMQPError | None) -> None:
        if self._ended is not None and not self._ended.is_set():
            self._end_reason = reason
            self._ended.set()

    def _release_waiting(self) -> None:
        """Requeue what was prefetched but not handed to the handler."""
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        waiting: list[Message] = []
        for work in self._inbox:
            waiting.extend(work if isinstance(work, list) else [work])
        waiting += self._batch
        self._inbox.clear()
        self._batch = []
        self._forget_waiting()
        for message in waiting:
            self.stats.released += 1
            if self._manual:
                self._settler.settle(message, "nack", requeue=True)

    # ------------------------------------------------------------------ deliveries (loop)

    def _on_delivery(self, message: Message) -> None:
        self.stats.delivered += 1
        if self._stopping:
            self.stats.released += 1
            if self._manual:
                self._settler.settle(message, "nack", requeue=True)
            return
        self._subscriber.attempt = 0
        if self._bounded:
            self._waiting += 1
            self._waiting_bytes += len(message.body)
            if not self._reads_paused and (
                self._waiting >= (self.prefetch or _INBOX_MESSAGES)
                or self._waiting_bytes >= _INBOX_BYTES
            ):
                self._reads_paused = True
                self._conn.read_flow.pause()
        if self.batch_size is not None:
            self._batch.append(message)
            if len(self._batch) >= self.batch_size:
                self._flush_batch()
            elif self._batch_timer is None:
                loop = asyncio.get_running_loop()
                self._batch_timer = loop.call_later(self.batch_timeout, self._flush_batch)
            return
        self._inbox.append(message)
        self._pump()

    def _flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        # Batches wait for a handler slot like single messages: with concurrency 1 they
        # run one at a time, which is what makes their multiple-ack safe.
        self._inbox.append(batch)
        self._pump()

    def _pump(self) -> None:
        # Up to ``concurrency`` worker tasks, each draining the inbox. A handler that
        # does not suspend lets its worker take the next message in the same loop
        # iteration, so the acks of a burst leave in one write (not one send each).
        while self._inbox and self._running < self.concurrency:
            self._spawn(self._work())

    async def _work(self) -> None:
        inbox = self._inbox
        while inbox and not self._stopping:
            work = inbox.popleft()
            if self._bounded:
                self._handed_out(work)
            traced = _obs.active
            if traced is not None and traced.records_process():
                # rabbitry.observability: a process span and measurements around it
                handling = (
                    self._batches.handle_batch(work)
                    if isinstance(work, list)
                    else self._handle(work)
                )
                await traced.process(self, work, handling)
            elif isinstance(work, list):
                await self._batches.handle_batch(work)
            else:
                await self._handle(work)

    def _handed_out(self, work: Message | list[Message]) -> None:
        """A message (or batch) left the inbox for a handler: read again at half."""
        for message in work if isinstance(work, list) else (work,):
            self._waiting -= 1
            self._waiting_bytes -= len(message.body)
        if (
            self._reads_paused
            and self._waiting <= (self.prefetch or _INBOX_MESSAGES) // 2
            and self._waiting_bytes <= _INBOX_BYTES // 2
        ):
            self._reads_paused = False
            self._conn.read_flow.resume()

    def _forget_waiting(self) -> None:
        """The inbox was emptied (stop, or the channel ended): read again."""
        self._waiting = 0
        self._waiting_bytes = 0
        self._resume_reads()

    def _resume_reads(self) -> None:
        """Undo this consumer's pause of the connection's reading, if it paused it."""
        if self._reads_paused:
            self._reads_paused = False
            self._conn.read_flow.resume()

    def _spawn(self, work: Awaitable[None]) -> None:
        self._running += 1
        assert self._idle is not None
        self._idle.clear()
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._running -= 1
        if not task.cancelled() and task.exception() is not None:
            logger.error("consumer %s: handler task failed", self, exc_info=task.exception())
        if task.cancelled():
            pass
        if not self._stopping:
            self._pump()
        if self._running == 0 and self._idle is not None:
            self._idle.set()

    async def _handle(self, message: Message) -> None:
        headers = message.properties.headers
        if headers and BATCH_FORMAT_HEADER in headers:  # a batch envelope: its records
            await self._batches.handle_envelope(message)
            return
        message_id = message.properties.message_id
        if self.dedup is not None and message_id and self.dedup.seen(message_id):
            # Already processed: ack it without calling the handler.
            self.stats.deduplicated += 1
            self._settler.ack(message)
            return
        try:
            result = self._handler(message)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            # stop(drain=False) or a timed-out drain: hand the message back, unless a
            # thread still runs the handler on it (sync facade): then it stays unacked
            # and the broker requeues it when stop() closes the channel.
            if self._release_on_cancel:
                self._settler.settle(message, "nack", requeue=True)
                self.stats.released += 1
            raise
        except Exception as exc:
            await self._settler.fail(message, exc)
            return
        self._settler.ack(message)
        if self.dedup is not None and message_id:
            self.dedup.add(message_id)

    # ------------------------------------------------------------------ broker events

    def _on_broker_cancel(self, tag: str) -> None:
        logger.warning("consumer %s: the broker cancelled the subscription", self)
        if self.on_cancel is not None:
            try:
                result = self.on_cancel(tag)
                if inspect.isawaitable(result):
                    self._spawn_background(result)
            except Exception:
                logger.exception("on_cancel callback failed")
        self._release_waiting()
        # A broker cancel usually means the queue was deleted: declare it again (from
        # the topology record) before subscribing. Other resubscribes keep the queue:
        # re-declaring a server-named queue would move the consumer to a new, empty one.
        self._subscriber.queue_gone = True
        if self.resubscribe and not self._stopping:
            self._subscriber.schedule()
        elif not self._stopping:
            self._end(ConsumerCancelled(tag))

    def _on_channel_closed(self, exc: AMQPError) -> None:
        if self._stopping:
            return
        if isinstance(exc, PreconditionFailed) and _ACK_TIMEOUT_TEXT in exc.reply_text:
            logger.error(
                "consumer %s: the broker closed the channel because a delivery was not "
                "acknowledged within its consumer_timeout (%s); handlers must finish "
                "faster or the broker's consumer_timeout must be raised",
                self,
                exc.reply_text,
            )
        else:
            logger.warning("consumer %s: channel closed under the consumer: %r", self, exc)
        # What was waiting belongs to the dead channel; the broker requeues it.
        self._inbox.clear()
        self._batch = []
        self._forget_waiting()
        if isinstance(exc, AMQPConnectionError):
            return  # the connection is gone: recovery (not this consumer) brings it back
        if self.resubscribe and self._conn.is_open:
            self._subscriber.schedule()
        elif not self.resubscribe:
            self._end(exc)

    def _spawn_background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
