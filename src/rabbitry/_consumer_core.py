"""The machinery under :class:`rabbitry.consumer.AsyncConsumer`, and its stores.

:class:`DedupStore`, :class:`MemoryDedupStore` and :class:`ConsumerStats` (exported by
:mod:`rabbitry.consumer` and :mod:`rabbitry`), and the consumer's loop-thread half:
subscribing, taking deliveries in, handing them to the handler (one at a time or in
batches, skipping duplicates), settling them, the retry policy's moves of failed
messages, and the broker's and the channel's events (cancel, close, resubscribe).
:class:`AsyncConsumer` derives from :class:`ConsumerCore`, which declares the
attributes ``AsyncConsumer.__init__`` sets and this half uses.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ._batch_consume import EnvelopeHandling
from .aio._recovery import redeclare_queue
from .aio.channel import Subscription
from .batching import BATCH_FORMAT_HEADER
from .exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConfigurationError,
    ConsumerCancelled,
    InvalidStateError,
    NotFound,
    PreconditionFailed,
    Reject,
    Requeue,
    Retry,
)
from .observability import _state as _obs
from .protocol.message import Message

if TYPE_CHECKING:
    from ._failure_log import FailureLog
    from .aio.channel import AsyncChannel
    from .aio.connection import AsyncConnection
    from .topology._retry import RetryDecision, RetryPolicy

logger = logging.getLogger("rabbitry.consumer")

#: ``_dead_letter`` before start() has looked (or when it cannot know).
UNKNOWN = object()

_ACK_TIMEOUT_TEXT = "delivery acknowledgement"
_RESUBSCRIBE_BACKOFF = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: What may wait for a handler when the broker's prefetch does not bound it (auto ack,
#: or prefetch 0): messages (with prefetch 0) and body bytes, before the connection stops
#: reading the socket.
_INBOX_MESSAGES = 1024
_INBOX_BYTES = 16 * 1024 * 1024
#: Seconds to wait before requeueing a message whose retry/parking move failed.
_FAILED_MOVE_PAUSE = 1.0


class DedupStore(Protocol):
    """Remembers processed message ids so redelivered duplicates skip the handler."""

    def seen(self, key: str) -> bool:
        """Whether ``key`` was processed before (and is still remembered).

        Args:
            key: a message id.

        Returns:
            ``True`` if it was.
        """
        ...

    def add(self, key: str) -> None:
        """Remember that ``key`` was processed.

        Args:
            key: a message id.
        """
        ...


class MemoryDedupStore:
    """An in-memory LRU of message ids with a time to live.

    Args:
        max_size: ids remembered at most (least recently used go first).
        ttl: seconds an id is remembered.
        clock: monotonic time source (tests pass a fake one).
    """

    def __init__(
        self,
        max_size: int = 100_000,
        ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_size < 1:
            raise ConfigurationError(f"max_size: must be >= 1, got {max_size}")
        if ttl <= 0:
            raise ConfigurationError(f"ttl: must be > 0 seconds, got {ttl}")
        self._entries: OrderedDict[str, float] = OrderedDict()
        self._max_size = max_size
        self._ttl = ttl
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def seen(self, key: str) -> bool:
        """Whether ``key`` was added less than ``ttl`` seconds ago.

        Args:
            key: a message id.

        Returns:
            ``True`` if it was (it becomes the most recently used).
        """
        stamp = self._entries.get(key)
        if stamp is None:
            return False
        if self._clock() - stamp > self._ttl:
            del self._entries[key]
            return False
        self._entries.move_to_end(key)
        return True

    def add(self, key: str) -> None:
        """Remember ``key`` now; evicts the oldest ids past ``max_size``.

        Args:
            key: a message id.
        """
        self._entries[key] = self._clock()
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_size:
            self._entries.popitem(last=False)


class ConsumerStats:
    """Counters of what the consumer did (read them any time)."""

    __slots__ = (
        "acked",
        "deduplicated",
        "delivered",
        "dropped",
        "dropped_records",
        "failed",
        "parked",
        "released",
        "requeued",
        "resubscribed",
        "retried",
    )

    def __init__(self) -> None:
        self.delivered = 0
        self.acked = 0
        self.failed = 0
        self.dropped = 0
        #: Records lost to drops: those of a dropped batch envelope, and 1 per plain
        #: message.
        self.dropped_records = 0
        self.retried = 0
        self.parked = 0
        self.requeued = 0
        self.released = 0
        self.deduplicated = 0
        self.resubscribed = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"ConsumerStats({self.as_dict()})"


class ConsumerCore(EnvelopeHandling):
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
    _channel: AsyncChannel | None
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
    _resubscribe_task: asyncio.Task[None] | None
    _background: set[asyncio.Future[Any]]
    _queue_gone: bool
    _release_on_cancel: bool
    _attempt: int
    _failures: FailureLog
    _dead_letter: object

    async def _subscribe(self, timeout: float | None) -> None:
        channel = await self._conn.channel(timeout=timeout)
        self._channel = channel
        try:
            if self._manual and self.prefetch:
                await channel.basic_qos(self.prefetch, timeout=timeout)
            subscription = Subscription(
                self.queue,
                self._on_delivery,
                no_ack=not self._manual,
                exclusive=self.exclusive,
                arguments=self.arguments,
                on_cancel=self._on_broker_cancel,
                on_close=self._on_channel_closed,
            )
            self.consumer_tag = await channel.start_consumer(subscription, timeout=timeout)
        except BaseException:
            if not channel.is_closed:
                await channel.close()
            raise

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
                self._settle(message, "nack", requeue=True)

    # ------------------------------------------------------------------ deliveries (loop)

    def _on_delivery(self, message: Message) -> None:
        self.stats.delivered += 1
        if self._stopping:
            self.stats.released += 1
            if self._manual:
                self._settle(message, "nack", requeue=True)
            return
        self._attempt = 0
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
                    self._handle_batch(work) if isinstance(work, list) else self._handle(work)
                )
                await traced.process(self, work, handling)
            elif isinstance(work, list):
                await self._handle_batch(work)
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
            await self._handle_envelope(message)
            return
        message_id = message.properties.message_id
        if self.dedup is not None and message_id and self.dedup.seen(message_id):
            # Already processed: ack it without calling the handler.
            self.stats.deduplicated += 1
            self._ack(message)
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
                self._settle(message, "nack", requeue=True)
                self.stats.released += 1
            raise
        except Exception as exc:
            await self._fail(message, exc)
            return
        self._ack(message)
        if self.dedup is not None and message_id:
            self.dedup.add(message_id)

    async def _handle_batch(self, batch: list[Message]) -> None:
        if self.dedup is not None:
            batch = self._drop_duplicates(batch)  # an envelope by its own message_id
            if not batch:
                return
        if any(m.properties.headers and BATCH_FORMAT_HEADER in m.properties.headers for m in batch):
            await self._handle_batch_with_envelopes(batch)  # records in the envelopes' place
            return
        failed: list[tuple[Message, BaseException]] = []
        try:
            result = self._handler(batch)
            if inspect.isawaitable(result):
                result = await result
            if result is not None:
                failed = self._failed_items(batch, result)
        except asyncio.CancelledError:
            if self._release_on_cancel:
                for message in batch:
                    self._settle(message, "nack", requeue=True)
            raise
        except Exception as exc:
            if isinstance(exc, InvalidStateError):
                logger.error("consumer %s: %s; treating the whole batch as failed", self, exc)
            failed = [(message, exc) for message in batch]
        failed_ids = {id(message) for message, _ in failed}
        for message, error in failed:
            await self._fail(message, error)
        remaining = [m for m in batch if id(m) not in failed_ids and not m.settled]
        if self.dedup is not None:
            for message in remaining:
                if message.properties.message_id:
                    self.dedup.add(message.properties.message_id)
        if not remaining or not self._manual:
            return
        if self.concurrency == 1 and all(m.settled for m, _ in failed):
            # One multiple-ack settles the rest of the batch: every earlier unsettled
            # delivery on this channel is in it (one batch at a time, failed ones already
            # moved), so it acks nothing else. A failed move stays unacked: no multiple.
            last = max(remaining, key=lambda m: m.delivery_tag)
            if self._settle(last, "ack", multiple=True):
                for message in remaining:
                    message.settled = True
                self.stats.acked += len(remaining)
            return
        for message in remaining:
            self._ack(message)

    def _drop_duplicates(self, batch: list[Message]) -> list[Message]:
        """Ack the messages the dedup store has seen; return the others."""
        assert self.dedup is not None
        fresh = []
        in_batch: set[str] = set()  # a second copy in the same batch is a duplicate too
        for message in batch:
            message_id = message.properties.message_id
            if message_id and (message_id in in_batch or self.dedup.seen(message_id)):
                self.stats.deduplicated += 1
                self._ack(message)
            else:
                if message_id:
                    in_batch.add(message_id)
                fresh.append(message)
        return fresh

    @staticmethod
    def _failed_items(batch: list[Message], result: object) -> list[tuple[Message, BaseException]]:
        """Validate what a batch handler returned; each failed message once, in order."""
        if not isinstance(result, Iterable) or isinstance(result, (str, bytes)):
            raise InvalidStateError(
                "a batch handler must return None or a collection of the messages that "
                f"failed, got {type(result).__name__}"
            )
        members = {id(m) for m in batch}
        failed: dict[int, tuple[Message, BaseException]] = {}
        for item in result:
            exc: BaseException | None = None
            if isinstance(item, tuple):
                if len(item) != 2 or not isinstance(item[1], BaseException | None):
                    raise InvalidStateError(
                        "a batch handler returned a malformed item: expected a message or "
                        "(message, exception)"
                    )
                message, exc = item
            else:
                message = item
            if not isinstance(message, Message) or id(message) not in members:
                raise InvalidStateError("a batch handler returned a message not in its batch")
            failed.setdefault(id(message), (message, exc or Retry("failed in a batch")))
        return list(failed.values())

    # ------------------------------------------------------------------ settling

    def _ack(self, message: Message) -> None:
        if self._manual and self._settle(message, "ack"):
            self.stats.acked += 1

    def _settle(self, message: Message, how: str, **options: Any) -> bool:
        """Ack/nack on the message's own channel once; False if that is not possible."""
        if message.settled:
            return False
        channel = message.channel
        if channel is not None and getattr(channel, "epoch", 0) != message.epoch:
            # The connection recovered since this delivery: its tag died with the old
            # connection (the broker redelivers the message). Sending it now would ack
            # whatever has that number on the new channel, or close it with 406.
            logger.warning(
                "consumer %s: not %sing delivery %s: it arrived before the connection "
                "recovered (the broker redelivers it)",
                self,
                how,
                message.delivery_tag,
            )
            message.settled = True
            return False
        if channel is None or channel.is_closed:
            # The channel (and its delivery tags) are gone: the broker requeues the
            # message itself; sending the tag on another channel would be a 406.
            logger.warning(
                "consumer %s: not %sing delivery %s: its channel is closed (the broker "
                "will redeliver it)",
                self,
                how,
                message.delivery_tag,
            )
            return False
        try:
            if how == "ack":
                channel.basic_ack(message.delivery_tag, options.get("multiple", False))
            elif how == "nack":
                channel.basic_nack(message.delivery_tag, False, options.get("requeue", True))
            else:
                channel.basic_reject(message.delivery_tag, options.get("requeue", False))
        except AMQPError as exc:
            logger.warning("consumer %s: %s of %s failed: %r", self, how, message.delivery_tag, exc)
            return False
        message.settled = True
        return True

    async def _fail(
        self, message: Message, exc: BaseException, records: tuple[int, int] | None = None
    ) -> None:
        """The handler failed on ``message``: retry, park, requeue or dead-letter it.

        Whatever happens is logged at ERROR with the handler's traceback (rate-limited,
        see :class:`~rabbitry._failure_log.FailureLog`), in words. ``records`` is
        ``(failed, total)`` for a batch envelope: the words and the counts say how many
        records went with it.
        """
        self.stats.failed += 1
        size = 1 if records is None else records[1]
        tag: Any = message.delivery_tag
        if records is not None:
            tag = f"{tag} (a batch envelope: {records[0]} of its {size} records failed)"
        if _obs.active is not None:
            _obs.active.handler_failed(self, message, exc)
        if not self._manual:
            self._failures.failure(
                tag, exc, "lost: auto-acked message (the broker forgot it when it sent it)",
                "lost",
            )  # fmt: skip
            return
        if isinstance(exc, Requeue):
            if self._settle(message, "nack", requeue=True):
                self.stats.requeued += 1
                self._failures.failure(
                    tag, exc, "requeued (the handler raised Requeue)", "requeued"
                )
            else:
                self._failures.failure(tag, exc, _NOT_SETTLED, "not settled")
            return
        policy = self.retry
        if policy is None:
            if not self._settle(message, "nack", requeue=False):
                self._failures.failure(tag, exc, _NOT_SETTLED, "not settled")
                return
            dead_letter = self._dead_letter
            if dead_letter is None:
                self.stats.dropped += 1
                self.stats.dropped_records += size
                action = "dropped: the queue has no dead-letter exchange"
                kind = "dropped"
            elif dead_letter is UNKNOWN:
                action = (
                    "rejected: dead-lettered if the queue has a dead-letter exchange "
                    "(by argument or policy), else dropped by the broker"
                )
                kind = "rejected"
            else:
                action = f"dead-lettered to exchange {dead_letter!r}"
                kind = "dead-lettered"
            self._failures.failure(tag, exc, action, kind)
            return
        from .topology._retry import handle_failure

        retryable = False if isinstance(exc, Reject) else None
        try:
            decision = policy.plan(message, exc, queue=self.queue, retryable=retryable)
        except ValueError:
            decision = None
        try:
            outcome = await handle_failure(
                message.channel,
                message,
                exc,
                policy,
                queue=self.queue,
                retryable=retryable,
            )
        except (AMQPError, ValueError) as failure:
            # The move was not confirmed, so the original must not be acked. Leaving it
            # unacked would hold a prefetch slot until the channel closes (a stalled
            # consumer) and a later batch's multiple-ack could cover it (a lost message):
            # put it back on its queue instead, after a pause so that a move that keeps
            # failing (retry topology deleted) is not a hot loop.
            self._failures.failure(
                tag,
                exc,
                f"requeued in {_FAILED_MOVE_PAUSE:.1f} s: moving it failed ({failure})",
                "requeued (move failed)",
            )
            await asyncio.sleep(_FAILED_MOVE_PAUSE)
            if self._settle(message, "nack", requeue=True):
                self.stats.requeued += 1
            return
        message.settled = True
        if _obs.active is not None:
            _obs.active.moved(self, message, outcome, decision)
        if outcome == "park":
            self.stats.parked += 1
        elif outcome == "retry":
            self.stats.retried += 1
        else:
            self.stats.dropped += 1
            self.stats.dropped_records += size
        self._failures.failure(tag, exc, _describe(outcome, decision), _KINDS[outcome])

    def _call_later(self, delay: float, callback: Callable[[], None]) -> object:
        return asyncio.get_running_loop().call_later(delay, callback)

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
        self._queue_gone = True
        if self.resubscribe and not self._stopping:
            self._schedule_resubscribe()
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
            self._schedule_resubscribe()
        elif not self.resubscribe:
            self._end(exc)

    def _spawn_background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _schedule_resubscribe(self) -> None:
        if self._resubscribe_task is None or self._resubscribe_task.done():
            self._resubscribe_task = asyncio.ensure_future(self._resubscribe_loop())

    async def _resubscribe_loop(self) -> None:
        old = self._channel
        if old is not None and old.is_open:
            try:
                await old.close()
            except AMQPError:
                pass
        while not self._stopping and self._conn.is_open:
            delay = _RESUBSCRIBE_BACKOFF[min(self._attempt, len(_RESUBSCRIBE_BACKOFF) - 1)]
            self._attempt += 1
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                if self._queue_gone:
                    await self._redeclare()
                    self._queue_gone = False
                await self._subscribe(timeout=30.0)
            except NotFound as exc:
                # The queue does not exist (any more): declare it from the record first.
                self._queue_gone = True
                logger.warning("consumer %s: resubscribe attempt %d: %r", self, self._attempt, exc)
                continue
            except AMQPError as exc:
                logger.warning(
                    "consumer %s: resubscribe attempt %d failed: %r", self, self._attempt, exc
                )
                continue
            self.stats.resubscribed += 1
            logger.info("consumer %s: subscribed again", self)
            return

    async def _redeclare(self) -> None:
        """Declare the queue again from the connection's topology record, if it has it."""
        record = self._conn.topology_record
        if record.queue(self.queue) is None:
            return
        channel = await self._conn.channel()
        try:
            name = await redeclare_queue(record, channel, self.queue)
            if isinstance(name, str) and name and name != self.queue:
                logger.info("consumer %s: queue re-declared as %r", self, name)
                self.queue = name  # a server-named queue got a new name
        finally:
            if channel.is_open:
                await channel.close()


_NOT_SETTLED = "not settled: its channel is closed (the broker delivers it again)"
_KINDS = {"retry": "retried", "park": "parked", "drop": "dropped"}


def _describe(outcome: str, decision: RetryDecision | None) -> str:
    """What a retry policy did with a failed message, in words."""
    if decision is None or decision.kind != outcome:
        return {"retry": "retried", "park": "parked", "drop": "dropped"}.get(outcome, outcome)
    if outcome == "retry":
        return (
            f"sent for a retry in {decision.delay:g} s via {decision.routing_key} "
            f"(attempt {decision.attempts} failed)"
        )
    if outcome == "park":
        return f"parked in {decision.routing_key} after {decision.attempts} attempt(s)"
    return f"dropped after {decision.attempts} attempt(s): the policy has no parking lot"
