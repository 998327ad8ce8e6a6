"""The machinery under :class:`rabbitry.consumer.AsyncConsumer`: its loop-thread half.

Taking deliveries in (to the inbox, in batches with ``batch_size``) and the broker's
and the channel's events (cancel, close). Its collaborators: the
:class:`~rabbitry._consumer.flow.Flow` of work and its runner (who runs the handler),
:class:`~rabbitry._consumer.batches.Handling` (hands work to the handler), the
:class:`~rabbitry._consumer.settle.Settler` (settling, the failure path) and the
:class:`~rabbitry._consumer.subscribe.Subscriber` (subscribing, resubscribing).
:class:`AsyncConsumer` derives from :class:`ConsumerCore`, which declares the
attributes ``AsyncConsumer.__init__`` sets and this half uses.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConsumerCancelled,
    PreconditionFailed,
)
from .flow import INBOX_BYTES, Runner

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..aio.connection import AsyncConnection
    from ..protocol.message import Message
    from .batches import Handling
    from .flow import Flow
    from .settle import Settler
    from .stores import ConsumerStats
    from .subscribe import Subscriber

logger = logging.getLogger("rabbitry.consumer")

_ACK_TIMEOUT_TEXT = "delivery acknowledgement"


class ConsumerCore:
    """A consumer's deliveries and the broker's events: the machinery under AsyncConsumer.

    Deliveries go to the :class:`~rabbitry._consumer.flow.Flow`'s inbox (as batches
    with ``batch_size``) and its runner starts handling them: asyncio tasks, or the
    sync ``Consumer``'s handler threads (see :func:`run_handlers_with`). A broker cancel
    or a channel error hands back what waits and resubscribes (or ends the consumer).
    """

    # Set by AsyncConsumer.__init__.
    _conn: AsyncConnection
    _manual: bool
    batch_size: int | None
    batch_timeout: float
    on_cancel: Callable[[str], Any] | None
    resubscribe: bool
    stats: ConsumerStats
    _batch: list[Message]
    _batch_timer: asyncio.TimerHandle | None
    _ended: asyncio.Event | None
    _end_reason: AMQPError | None
    _background: set[asyncio.Future[Any]]
    _release_on_cancel: bool
    _subscriber: Subscriber
    _settler: Settler
    _flow: Flow
    _handling: Handling

    def _end(self, reason: AMQPError | None) -> None:
        if self._ended is not None and not self._ended.is_set():
            self._end_reason = reason
            self._ended.set()

    def _release_waiting(self) -> None:
        """Requeue what was prefetched but not handed to the handler."""
        flow = self._flow
        flow.runner.take_back(requeue=True)  # delivered before the inbox's
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        waiting: list[Message] = []
        for work in flow.inbox:
            waiting.extend(work if isinstance(work, list) else [work])
        waiting += self._batch
        flow.inbox.clear()
        self._batch = []
        flow.forget_waiting()
        for message in waiting:
            self.stats.released += 1
            if self._manual:
                self._settler.settle(message, "nack", requeue=True)

    # ------------------------------------------------------------------ deliveries (loop)

    def _on_delivery(self, message: Message) -> None:
        self.stats.delivered += 1
        flow = self._flow
        if flow.stopping:
            self.stats.released += 1
            if self._manual:
                self._settler.settle(message, "nack", requeue=True)
            return
        self._subscriber.attempt = 0
        if flow.bounded:
            flow.waiting += 1
            flow.waiting_bytes += len(message.body)
            if not flow.reads_paused and (
                flow.waiting >= flow.limit or flow.waiting_bytes >= INBOX_BYTES
            ):
                flow.reads_paused = True
                self._conn.read_flow.pause()
        if self.batch_size is not None:
            self._batch.append(message)
            if len(self._batch) >= self.batch_size:
                self._flush_batch()
            elif self._batch_timer is None:
                loop = asyncio.get_running_loop()
                self._batch_timer = loop.call_later(self.batch_timeout, self._flush_batch)
            return
        flow.inbox.append(message)
        flow.runner.pump()

    def _flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        # Batches wait for a handler slot like single messages: with concurrency 1 they
        # run one at a time, which is what makes their multiple-ack safe.
        self._flow.inbox.append(batch)
        self._flow.runner.pump()

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
        if self.resubscribe and not self._flow.stopping:
            self._subscriber.schedule()
        elif not self._flow.stopping:
            self._end(ConsumerCancelled(tag))

    def _on_channel_closed(self, exc: AMQPError) -> None:
        flow = self._flow
        flow.runner.take_back(requeue=False)
        if flow.stopping:
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
        flow.inbox.clear()
        self._batch = []
        flow.forget_waiting()
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


class HandlerRunner(Runner, Protocol):
    """A :class:`~rabbitry._consumer.flow.Runner` that runs a consumer's handler
    somewhere else than in its tasks (the sync ``Consumer``'s threads)."""

    def attach(self, flow: Flow, handling: Handling) -> None:
        """Take the consumer's work from ``flow``; hand the rest to ``handling``.

        Args:
            flow: the consumer's work.
            handling: hands work to the consumer's handler and settles it.
        """
        ...


def run_handlers_with(consumer: ConsumerCore, runner: HandlerRunner) -> None:
    """Make ``runner`` run ``consumer``'s handler (before it starts).

    A cancelled handling then leaves its message to the runner: it is not requeued
    behind the back of a thread that still runs the handler on it, and ``stop()``
    keeps the channel open until the running handlers have settled theirs.

    Args:
        consumer: a consumer that has not started.
        runner: who runs the handler from now on.
    """
    consumer._release_on_cancel = False
    consumer._handling.release_on_cancel = False
    consumer._flow.runner = runner
    runner.attach(consumer._flow, consumer._handling)
