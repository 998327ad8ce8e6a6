"""The runner of :class:`rabbitry.sync.consumer.Consumer`: its handler on threads.

The sync consumer is an :class:`~rabbitry.consumer.AsyncConsumer` (deliveries,
settling, the failure policy and the broker's events all stay on the IO thread) whose
handler :class:`ThreadRunner` runs on ``concurrency`` threads of its own, with cheap
hand-offs between the IO thread and those threads in bursts.

Theory of operation
-------------------
A plain message (not a batch envelope, no process span to record) takes the *direct*
path, with no task per message:

* The IO thread's ``pump`` puts it on one FIFO queue (``SimpleQueue``) shared by the
  handler threads, with every other message that is waiting: a thread that is busy finds
  the next one there when it has finished, without waiting for the IO thread. Only a
  thread blocked on the empty queue needs a wake-up.
* A thread that has run the handler reports the outcome through the portal
  (``Portal.submit``), which wakes the IO thread only when no wake-up is pending: one
  wake-up settles every message that finished meanwhile, and the portal's drain sends
  their acks in one write. It goes behind what the handler itself queued on the portal
  (a ``message.ack()``, a publish).
* On the IO thread, ``_completed`` then does what ``Handling.handle`` does after the handler:
  acks it (unless the handler settled it), remembers its id for ``dedup``, or sends it
  down the failure path (in a task, as the retry moves wait for the broker).

With one thread (``concurrency=1``) the handler sees the messages in delivery order. A
message whose ``message_id`` is the one of a message still queued or running (with
``dedup``) waits, and everything behind it, until that one has finished: it is then
checked against the store like in a sequential consumer.

What still needs the coroutine machinery (batches, envelopes, a consumer whose process
spans are recorded) takes the *task* path: ``Handling.handle`` / ``handle_batch`` in a task per
work item, as in the asyncio consumer, whose handler (``run_on_thread``) queues the call
on the same threads and awaits its result. Such an item starts only while fewer than
``concurrency`` are in flight, like in the asyncio consumer, and with one thread the
direct messages behind it wait until it has finished, so the order holds.

The messages queued for the threads count as handed out (in flight: ``Flow.running``), so
``stop(drain=True)`` waits for them; the ones no thread has started are taken back from
the queue at that point (``take_back``: a stop or a broker cancel) and requeued,
like the messages of the inbox, or forgotten when their channel closes (the broker
requeues them). When the broker's prefetch does not bound the deliveries (auto ack,
``prefetch=0``) only ``concurrency`` messages are queued at once, so the consumer's
bound on what waits for a handler still holds.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from ..batching import BATCH_FORMAT_HEADER
from ..exceptions import InvalidStateError
from ..observability import _state as _obs

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._consumer.batches import Handling
    from .._consumer.flow import Flow
    from .._consumer.settle import FailurePath, Settler
    from ..consumer import AsyncConsumer
    from ..protocol.message import Message
    from ._portal import Portal

__all__ = ["ThreadRunner"]

logger = logging.getLogger("rabbitry.consumer")

#: Messages queued for the handler threads when the broker's prefetch bounds nothing:
#: effectively unlimited (the prefetch, at most 65,535, bounds them).
_UNBOUNDED = 1 << 30


class _PortalAcker:
    """Acks from handler threads, forwarded to the message's channel on the IO thread."""

    __slots__ = ("_portal", "target")

    def __init__(self, portal: Portal, channel: Any) -> None:
        self._portal = portal
        #: The channel the settlements go to.
        self.target = channel

    @property
    def is_closed(self) -> bool:
        closed: bool = self.target.is_closed
        return closed

    @property
    def epoch(self) -> int:
        epoch: int = self.target.epoch
        return epoch

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self._portal.submit(self.target.basic_ack, delivery_tag, multiple)

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self._portal.submit(self.target.basic_nack, delivery_tag, multiple, requeue)

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self._portal.submit(self.target.basic_reject, delivery_tag, requeue)


class _Call:
    """A handler call of the task path: ``fn(work)``, its outcome set on ``future``."""

    __slots__ = ("fn", "future", "work")

    def __init__(self, fn: Callable[[Any], object], work: Any, future: asyncio.Future[Any]) -> None:
        self.fn = fn
        self.work = work
        self.future = future


def _as_failure(exc: BaseException) -> Exception:
    """A handler's exception as the consumer's failure path takes it."""
    if isinstance(exc, Exception):
        return exc
    # SystemExit and the like only end the handler's call here, not the process (it
    # runs on a handler thread): its message fails like on any other error.
    failure = RuntimeError(f"the handler raised {exc!r}")
    failure.__cause__ = exc
    return failure


def _run_in(context: contextvars.Context, fn: Callable[[Any], object], work: Any) -> object:
    return context.run(fn, work)


class ThreadRunner:
    """Runs a consumer's plain ``handler`` on ``concurrency`` threads of its own.

    The sync :class:`rabbitry.sync.consumer.Consumer`'s runner (see the module
    docstring): the consumer's deliveries, settling, failure policy and events stay on
    ``portal``'s IO thread, in an :class:`~rabbitry.consumer.AsyncConsumer` whose handler
    is :meth:`run_on_thread` and whose work this runner takes (``run_handlers_with``).
    Its handler threads start with :meth:`start` and end with :meth:`end_threads`.

    Args:
        portal: the IO thread's portal.
        handler: the application's handler.
        concurrency: handler threads.
    """

    def __init__(
        self,
        portal: Portal,
        handler: Callable[[Any], object],
        *,
        concurrency: int,
    ) -> None:
        self._portal = portal
        self._user_handler = handler
        self._concurrency = concurrency
        # Messages and _Call jobs for the threads, in order; None ends one thread.
        self._jobs: queue.SimpleQueue[Message | _Call | None] = queue.SimpleQueue()
        self._put = self._jobs.put
        self._workers: list[threading.Thread] = []
        self._workers_ended = False
        self._started = False
        # Direct messages in flight at most (with the task path's items: flow.running);
        # set by attach().
        self._window = concurrency
        self._serial = concurrency == 1
        # Task-path items in flight; with one thread, direct messages wait behind them.
        self._tasked = 0
        # message_ids of the direct messages in flight (only with dedup).
        self._ids: set[str] = set()
        self._acker: _PortalAcker | None = None
        # Set by attach().
        self._flow: Flow
        self._handling: Handling
        self._settler: Settler
        self._failure: FailurePath

    def attach(self, flow: Flow, handling: Handling) -> None:
        """Take the consumer's work from ``flow``; hand the rest to ``handling``.

        Args:
            flow: the consumer's work.
            handling: hands work to the consumer's handler and settles it.
        """
        self._flow = flow
        self._handling = handling
        self._settler = handling.settler
        self._failure = handling.failure
        self._owner = handling.owner
        self._stats = handling.stats
        self._window = self._concurrency if flow.bounded else _UNBOUNDED

    # ------------------------------------------------------------------ threads

    async def start(self, consumer: AsyncConsumer, timeout: float | None = None) -> None:
        """Start the handler threads, then ``consumer`` (see :meth:`AsyncConsumer.start`).

        Args:
            consumer: the consumer whose handler this runner runs.
            timeout: seconds for each broker request it makes (``None``: no limit).
        """
        started = self._started
        if not started:
            self._start_threads()
        try:
            await consumer.start(timeout)
        except BaseException:
            if not started:
                self.end_threads()
            raise
        self._started = True

    def _start_threads(self) -> None:
        self._workers_ended = False
        while len(self._workers) < self._concurrency:
            worker = threading.Thread(
                target=self._serve,
                name=f"rabbitry-handler-{len(self._workers) + 1}",
                daemon=True,
            )
            worker.start()
            self._workers.append(worker)

    def end_threads(self) -> None:
        """IO thread: end the handler threads once they have finished what they run.

        Jobs no thread has started are taken back: a direct message is left unsettled
        (its channel closes with the consumer, and the broker requeues it); a task-path
        call is cancelled, and so is every call queued later.
        """
        self._workers_ended = True
        self.take_back(requeue=False, calls=True)
        self.stop_threads()

    def stop_threads(self) -> None:
        """End the handler threads after their current job (any thread).

        For when the IO thread has stopped (the connection is closed); otherwise
        :meth:`end_threads` on the IO thread.
        """
        workers, self._workers = self._workers, []
        for _ in workers:
            self._put(None)

    def _serve(self) -> None:
        """A handler thread: run jobs until a None (or the connection is closed)."""
        get = self._jobs.get
        run = self._run_job
        while run(get()):
            pass

    def _run_job(self, job: Message | _Call | None) -> bool:
        """Handler thread: run ``job``, report its outcome to the IO thread; False: end."""
        if job is None:
            return False
        error: Exception | None = None
        try:
            if job.__class__ is _Call:
                call: _Call = job
                if call.future.done():  # cancelled before it started
                    return True
                result: object = None
                try:
                    result = call.fn(call.work)
                except BaseException as exc:
                    error = _as_failure(exc)
                self._portal.submit(self._resolved, call, result, error)
            else:
                try:
                    self._user_handler(job)
                except BaseException as exc:
                    error = _as_failure(exc)
                self._portal.submit(self._completed, job, error)
        except InvalidStateError:
            return False  # the connection is closed: the broker requeues what was unacked
        return True

    # ------------------------------------------------------------------ direct path (IO thread)

    def pump(self) -> None:
        """IO thread: hand what waits in the inbox to the threads (or to a task).

        Plain messages go on the threads' queue (the direct path) while fewer than
        ``concurrency`` are in flight when the inbox is bounded; batches, envelopes and
        traced messages start a task running the consumer's handling (the task path).
        """
        inbox = self._flow.inbox
        while inbox:
            work = inbox[0]
            if work.__class__ is list:
                if not self._start_task(work):
                    return
                continue
            message: Message = work  # type: ignore[assignment]
            headers = message.properties.headers
            traced = _obs.active
            if (headers and BATCH_FORMAT_HEADER in headers) or (
                traced is not None and traced.records_process()
            ):
                if not self._start_task(message):
                    return
                continue
            if self._flow.running >= self._window or (self._tasked and self._serial):
                return
            dedup = self._owner.dedup
            if dedup is not None:
                message_id = message.properties.message_id
                if message_id:
                    if message_id in self._ids:
                        return  # a copy is in flight: check this one after it
                    try:
                        seen = dedup.seen(message_id)
                    except Exception:
                        # The application's store failed: like a handling that failed
                        # before the handler, the message stays unsettled (the broker
                        # has it back when the channel closes); the others go on.
                        logger.exception("consumer %s: handler task failed", self._owner)
                        inbox.popleft()
                        if self._flow.bounded:
                            self._flow.handed_out(message)
                        continue
                    if seen:
                        inbox.popleft()
                        if self._flow.bounded:
                            self._flow.handed_out(message)
                        self._stats.deduplicated += 1
                        self._settler.ack(message)
                        continue
                    self._ids.add(message_id)
            inbox.popleft()
            if self._flow.bounded:
                self._flow.handed_out(message)
            acker = self._acker
            if acker is None or acker.target is not message.channel:
                acker = self._acker = _PortalAcker(self._portal, message.channel)
            message.settle_through(acker)
            if not self._flow.running:
                assert self._flow.idle is not None
                self._flow.idle.clear()
            self._flow.running += 1
            self._put(message)

    def _completed(self, message: Message, error: Exception | None) -> None:
        """IO thread: a handler thread has run the handler on ``message``."""
        self._flow.running -= 1
        acker = message.channel
        if acker.__class__ is _PortalAcker:
            message.settle_through(acker.target)
        message_id = message.properties.message_id
        if self._ids:
            self._ids.discard(message_id)
        try:
            if error is None:
                self._settler.ack(message)
                if self._owner.dedup is not None and message_id:
                    self._owner.dedup.add(message_id)  # the application's store may raise
            else:
                self._flow.spawn(self._failure.fail(message, error))
        finally:
            if not self._flow.running:
                assert self._flow.idle is not None
                self._flow.idle.set()
            if self._flow.inbox and not self._flow.stopping:
                self.pump()

    def take_back(self, requeue: bool, calls: bool = False) -> None:
        """IO thread: take the direct messages no thread has started off the queue.

        ``requeue``: nack them back to the queue (a stop or a broker cancel), else leave
        them to the broker (their channel has closed, or closes soon). ``calls``: cancel
        the task path's calls no thread has started too (else they stay queued).
        """
        get = self._jobs.get_nowait
        kept: list[_Call | None] = []
        while True:
            try:
                job = get()
            except queue.Empty:
                break
            if job is None or job.__class__ is _Call:
                if calls and job is not None:
                    job.future.cancel()
                else:
                    kept.append(job)
                continue
            message: Message = job  # type: ignore[assignment]
            self._flow.running -= 1
            acker = message.channel
            if acker.__class__ is _PortalAcker:
                message.settle_through(acker.target)
            if self._ids:
                self._ids.discard(message.properties.message_id)
            if requeue:
                self._stats.released += 1
                if self._settler.manual:
                    self._settler.settle(message, "nack", requeue=True)
        for job in kept:
            self._put(job)
        if not self._flow.running and self._flow.idle is not None:
            self._flow.idle.set()

    # ------------------------------------------------------------------ task path (IO thread)

    def _start_task(self, work: Message | list[Message]) -> bool:
        """Hand ``work`` to a task running ``Handling.handle``/``handle_batch``, if it may start."""
        if self._flow.running >= self._concurrency:
            return False
        self._flow.inbox.popleft()
        if self._flow.bounded:
            self._flow.handed_out(work)
        self._tasked += 1
        self._flow.spawn(self._work_on(work))
        return True

    async def _work_on(self, work: Message | list[Message]) -> None:
        try:
            traced = _obs.active
            if traced is not None and traced.records_process():
                handling = (
                    self._handling.handle_batch(work)
                    if isinstance(work, list)
                    else self._handling.handle(work)
                )
                await traced.process(self._owner, work, handling)
            elif isinstance(work, list):
                await self._handling.handle_batch(work)
            else:
                await self._handling.handle(work)
        finally:
            self._tasked -= 1

    async def run_on_thread(self, work: Message | list[Message]) -> Any:
        """The consumer's handler on the task path: the user's, run on a handler thread.

        Args:
            work: a message or a batch.

        Returns:
            What the handler returned.
        """
        messages = work if isinstance(work, list) else [work]
        for message in messages:
            message.settle_through(_PortalAcker(self._portal, message.channel))
        fn = self._user_handler
        if _obs.active is not None:  # the handler runs inside the process span
            fn = functools.partial(_run_in, contextvars.copy_context(), fn)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            if self._workers_ended:
                raise asyncio.CancelledError
            self._put(_Call(fn, work, future))
            return await future
        finally:
            for message in messages:  # back to the engine's channel for the consumer
                acker = message.channel
                if isinstance(acker, _PortalAcker):
                    message.settle_through(acker.target)

    @staticmethod
    def _resolved(call: _Call, result: object, error: Exception | None) -> None:
        """IO thread: a handler thread has run ``call``."""
        future = call.future
        if future.done():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
