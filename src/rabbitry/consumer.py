"""AsyncConsumer: handler-based consuming with acks, batches, concurrency and failure policy.

The application gives a handler; the consumer owns the acknowledgements:

* manual ack (default): the handler returns → ``basic.ack``. It raises
  :class:`Retry` or a retryable exception → the retry path of the
  :class:`~rabbitry.topology.RetryPolicy` (republished with confirms, then the original is
  acked) or, without a policy, ``basic.nack(requeue=False)`` so the queue's dead-letter
  exchange (if any) gets it. :class:`Reject`, a non-retryable exception, or exhausted
  attempts → the parking lot (or dead-letter/drop without a policy). :class:`Requeue` →
  ``basic.nack(requeue=True)``: a message is never requeued in a hot loop unless the
  handler asks for it.
* auto ack (``ack="auto"``): the broker forgets a message when it sends it
  (at-most-once); handler errors are logged.

Batches (``batch_size``): the handler gets a list of up to ``batch_size`` messages (or
what arrived within ``batch_timeout``); returning normally acks the whole batch with one
``multiple=True`` ack; returning a collection of messages marks those as failed, and only
they take the failure path. Concurrency (``concurrency=N``) runs up to N handlers at once;
``prefetch`` is raised to at least N. Stopping cancels the subscription, lets running
handlers finish and ack, and requeues what was prefetched but not started.

Theory of operation: deliveries arrive on the event loop (a plain channel callback) and
go to an inbox; its runner starts handler tasks while fewer than ``concurrency`` run.
Each delivery is settled exactly once: :attr:`Message.settled` guards against a handler
that acks by hand and a consumer that would ack again (a double ack is a 406 that closes
the channel). Acks for a channel that has since been replaced are dropped with a
warning, never sent on the new channel.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ._consumer.batches import Handling
from ._consumer.core import ConsumerCore
from ._consumer.flow import Flow, TaskRunner
from ._consumer.options import check_options
from ._consumer.settle import FailurePath, Settler, check_failure_path
from ._consumer.stores import ConsumerStats, DedupStore, MemoryDedupStore
from ._consumer.subscribe import Subscriber
from .exceptions import (
    AMQPError,
    InvalidStateError,
    Reject,
    Requeue,
    Retry,
    Timeout,
)
from .observability import _state as _obs
from .protocol.message import Message
from .protocol.streams import STREAM_OFFSET, check_consume

if TYPE_CHECKING:
    from .aio.channel import AsyncChannel
    from .aio.connection import AsyncConnection
    from .topology._retry import RetryPolicy

__all__ = [
    "AsyncConsumer",
    "AsyncHandler",
    "ConsumerStats",
    "DedupStore",
    "MemoryDedupStore",
    "Reject",
    "Requeue",
    "Retry",
    "SyncHandler",
]

logger = logging.getLogger("rabbitry.consumer")

#: What a batch handler may return: ``None`` (all succeeded) or the messages that failed.
BatchResult: TypeAlias = Iterable[Message | tuple[Message, BaseException | None]] | None
#: A handler for the asyncio consumer: ``async def handler(message)`` (or a plain
#: function, run on the event loop), or with batches ``handler(messages)``.
AsyncHandler: TypeAlias = (
    Callable[[Message], Awaitable[object]]
    | Callable[[Message], object]
    | Callable[[list[Message]], Awaitable[BatchResult]]
    | Callable[[list[Message]], BatchResult]
)
#: A handler for the thread-pool consumer (``rabbitry.Consumer``): a plain function.
#: Its return type excludes awaitables, so that type checkers reject ``async def``
#: handlers, which would never run there (the consumer also refuses them at runtime).
SyncHandler: TypeAlias = Callable[[Message], None] | Callable[[list[Message]], BatchResult]


class AsyncConsumer(ConsumerCore):
    """Consume ``queue`` with ``handler``; see the module docstring for the semantics.

    Create with ``connection.consumer(queue, handler, ...)``; start with ``await
    consumer.start()`` or ``async with``.

    Args:
        connection: an open :class:`AsyncConnection`.
        queue: the queue to consume from.
        handler: ``async def handler(message)`` (or ``handler(messages)`` with batches).
        ack: ``"manual"`` (at-least-once, default) or ``"auto"`` (at-most-once).
        prefetch: unacknowledged deliveries allowed (raised to ``concurrency``). With
            ``ack="auto"`` (the broker does not count those) or ``prefetch=0`` it bounds
            the messages waiting for a handler instead: past it (1,024 with
            ``prefetch=0``), or past 16 MiB of bodies, the connection stops reading the
            socket until half of them have been handed out.
        concurrency: handlers running at once.
        retry: a ``RetryPolicy`` (see ``rabbitry.topology``); ``None`` dead-letters.
            ``start()`` checks that the retry topology the policy needs exists.
        batch_size: deliver lists of up to this many messages.
        batch_timeout: seconds to wait for a batch to fill (default 1.0 with batches).
        exclusive: an exclusive consumer.
        arguments: consumer arguments (e.g. ``{"x-priority": 10}``).
        dedup: a :class:`DedupStore`; messages whose ``message_id`` it has seen are
            acked without calling the handler.
        on_cancel: ``callback(consumer_tag)`` when the broker cancels the consumer.
        resubscribe: consume again (with backoff) after a broker cancel or a channel
            error such as the delivery-acknowledgement timeout.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        queue: str,
        handler: AsyncHandler,
        *,
        ack: Literal["manual", "auto"] = "manual",
        prefetch: int = 100,
        concurrency: int = 1,
        retry: RetryPolicy | None = None,
        batch_size: int | None = None,
        batch_timeout: float | None = None,
        exclusive: bool = False,
        arguments: dict[str, Any] | None = None,
        dedup: DedupStore | None = None,
        on_cancel: Callable[[str], Any] | None = None,
        resubscribe: bool = True,
    ) -> None:
        check_options(
            handler,
            ack=ack,
            prefetch=prefetch,
            concurrency=concurrency,
            retry=retry,
            batch_size=batch_size,
            batch_timeout=batch_timeout,
        )
        self._conn = connection
        self.queue = queue
        # Single messages or lists (batches): which one is the caller's promise.
        self._handler: Callable[[Any], object] = handler
        self._manual = ack == "manual"
        self.ack_mode = ack
        self.concurrency = concurrency
        # prefetch 0 means "unlimited" to the broker; otherwise at least one per handler
        # (and per batch slot), or handlers would sit idle waiting for deliveries.
        floor = max(concurrency, batch_size or 1)
        self.prefetch = prefetch if prefetch == 0 else max(prefetch, floor)
        self.retry = retry
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout if batch_timeout is not None else 1.0
        self.exclusive = exclusive
        self.arguments = dict(arguments) if arguments else None
        if self.arguments and STREAM_OFFSET in self.arguments:  # fail here, not at start()
            check_consume(
                queue, self.arguments, no_ack=not self._manual, qos=(self.prefetch, 0, False)
            )
        self.dedup = dedup
        self.on_cancel = on_cancel
        self.resubscribe = resubscribe
        self.stats = ConsumerStats()
        self.consumer_tag: str | None = None
        # What waits for a handler (inbox and open batch) is counted when the broker's
        # prefetch does not bound it (auto ack, or prefetch 0): past the bound the
        # connection stops reading the socket until half is handed out.
        self._flow = Flow(
            connection, self, bounded=not self._manual or not self.prefetch, prefetch=self.prefetch
        )
        #: The inbox of the flow (work waiting for a handler slot).
        self._batch: list[Message] = []
        self._batch_timer: asyncio.TimerHandle | None = None
        # Set when the consumer has ended for good (see wait()), with why.
        self._ended: asyncio.Event | None = None
        self._end_reason: AMQPError | None = None
        self._started = False
        self._background: set[asyncio.Future[Any]] = set()
        #: False when threads run the handler (see run_handlers_with): a cancelled
        #: handler's thread may still be running, so its message must not be requeued
        #: behind its back (see stop()).
        self._release_on_cancel = True
        self._subscriber = Subscriber(
            connection,
            self,
            manual=self._manual,
            deliver=self._on_delivery,
            cancelled=self._on_broker_cancel,
            closed=self._on_channel_closed,
        )
        self._settler = Settler(self, manual=self._manual, stats=self.stats)
        self._failure = FailurePath(self, self._settler)
        self._handling = Handling(
            self, handler, self._settler, self._failure, release_on_cancel=True
        )
        self._flow.runner = TaskRunner(self, self._flow, self._handling)

    def __repr__(self) -> str:
        state = "stopping" if self._flow.stopping else "running" if self._started else "new"
        return f"<AsyncConsumer queue={self.queue!r} tag={self.consumer_tag!r} {state}>"

    @property
    def is_running(self) -> bool:
        """Started and not stopped."""
        return self._started and not self._flow.stopping

    @property
    def channel(self) -> AsyncChannel | None:
        """The channel currently consumed on (it changes after a resubscribe)."""
        return self._subscriber.channel

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, timeout: float | None = None) -> None:
        """Check where failed messages would go, open a channel, set QoS and subscribe.

        With manual acks the failure path is checked first, with passive declares on a
        channel of its own: the exchange and queues a ``retry`` policy needs
        (``<queue>.dlx``, ``<queue>.retry.<delay>``, ``<queue>.parking-lot``), or the
        queue's dead-letter exchange when the connection's topology record says it has
        one. A missing one would silently lose every failed message.

        Args:
            timeout: seconds for each broker request it makes (``None``: no limit).

        Raises:
            InvalidStateError: already started.
            ConfigurationError: the retry topology or the dead-letter exchange is
                missing; the message names what (nothing was consumed).
            ChannelClosed / AMQPConnectionError: the broker refused (e.g. NotFound).
        """
        if self._started:
            raise InvalidStateError("this consumer was already started")
        self._started = True
        self._flow.idle = asyncio.Event()
        self._flow.idle.set()
        self._ended = asyncio.Event()
        try:
            if self._manual:
                self._failure.dead_letter = await check_failure_path(
                    self._conn, self.queue, self.retry, timeout
                )
            await self._subscriber.subscribe(timeout)
        except BaseException:
            self._started = False
            raise
        if _obs.active is not None:  # rabbitry.observability: stats, queue depth
            _obs.active.consumer_started(self, self._conn)

    async def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop consuming.

        Args:
            drain: let running handlers finish (and ack) before returning; otherwise
                they are cancelled and their messages requeued.
            timeout: seconds to wait for running handlers; past it they are cancelled.

        Messages prefetched but not yet handed to the handler are requeued at once.
        Idempotent.
        """
        if not self._started or self._flow.stopping:
            return
        self._flow.stopping = True
        self._failure.failures.flush()
        self._subscriber.cancel()
        # A full inbox may have paused the connection's reading: the cancel-ok below
        # must get through. What arrives from now on is released (_on_delivery).
        self._flow.resume_reads()
        channel = self._subscriber.channel
        if channel is not None and not channel.is_closed and self.consumer_tag is not None:
            # Cancelled now, or (connection recovering) forgotten so that recovery does
            # not subscribe a stopped consumer again.
            await channel.abandon_consumer(
                self.consumer_tag, timeout=10.0 if timeout is None else timeout
            )
        self._release_waiting()
        if self._flow.running:
            assert self._flow.idle is not None
            if drain:
                try:
                    await asyncio.wait_for(self._flow.idle.wait(), timeout)
                except TimeoutError:
                    logger.warning("consumer %s: handlers still running after %s s", self, timeout)
            if self._flow.running and not self._release_on_cancel:
                # Sync facade: a handler thread cannot be interrupted. Return now, as
                # promised, but keep the channel open until the running handlers have
                # settled their messages; closing it earlier would requeue a message while
                # its handler still works on it (a second, concurrent processing).
                self._spawn_background(self._close_when_idle(channel, timeout))
                self._end(None)
                return
            for task in list(self._flow.tasks):
                task.cancel()
            if self._flow.tasks:
                await asyncio.gather(*self._flow.tasks, return_exceptions=True)
        if channel is not None and not channel.is_closed:
            try:
                await channel.close(timeout=timeout)
            except AMQPError as exc:
                logger.debug("channel.close during stop failed: %r", exc)
        self._end(None)

    async def wait(self, timeout: float | None = None) -> AMQPError | None:
        """Wait until this consumer has ended for good; returns why.

        It ends for good when :meth:`stop` has returned (``None``), when the broker
        cancels it or closes its channel and ``resubscribe`` is off (a
        :class:`ConsumerCancelled`, or the channel's close reason), or when its connection
        closes for good: ``close()``, or recovery gave up (the connection's reason).
        Connection recoveries and resubscribes do not end it. A service's main coroutine
        ends with ``await consumer.wait()`` (see ``rabbitry.run``).

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            ``None`` after :meth:`stop`, else why it ended.

        Raises:
            InvalidStateError: the consumer was never started.
            Timeout: still consuming after ``timeout`` seconds.
        """
        ended = self._ended
        if ended is None:
            raise InvalidStateError("the consumer was never started")
        waiters = [
            asyncio.ensure_future(ended.wait()),
            asyncio.ensure_future(self._conn.wait_closed()),
        ]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise Timeout(f"consumer of {self.queue!r} still running after {timeout} s") from None
        finally:
            for waiter in waiters:
                waiter.cancel()
        return self._end_reason if ended.is_set() else self._conn.close_exc

    async def _close_when_idle(self, channel: AsyncChannel | None, timeout: float | None) -> None:
        assert self._flow.idle is not None
        await self._flow.idle.wait()
        if channel is not None and not channel.is_closed:
            try:
                await channel.close(timeout=timeout)
            except AMQPError as exc:
                logger.debug("channel.close after the last handler failed: %r", exc)


def failed_messages(*messages: Message) -> Collection[Message]:
    """Spell out the return value of a batch handler: ``return failed_messages(m1, m2)``."""
    return messages


def is_async_callable(handler: object) -> bool:
    """True for a coroutine (or async generator) function, a ``functools.partial`` of
    one, or an object whose ``__call__`` is one: calling it returns an awaitable."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.iscoroutinefunction(handler) or inspect.isasyncgenfunction(handler):
        return True
    if inspect.isroutine(handler) or isinstance(handler, type):
        return False
    call = getattr(type(handler), "__call__", None)  # noqa: B004
    return call is not None and (
        inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)
    )
