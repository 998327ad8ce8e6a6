"""The work between a consumer's deliveries and its handlers, and who runs the handler.

:class:`Flow` is that work's state: what waits for a handler (the inbox, bounded by
pausing the connection's reads when the broker's prefetch does not bound it), what runs
(counted, with its asyncio tasks, and an ``idle`` event when nothing does), and whether
the consumer is stopping. A :class:`Runner` takes work off the inbox and runs the
handler on it: :class:`TaskRunner` in asyncio tasks (:class:`rabbitry.consumer.AsyncConsumer`),
the sync ``Consumer``'s on its handler threads (``rabbitry.sync._consumer_threads``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from ..observability import _state as _obs

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..aio.connection import AsyncConnection
    from ..protocol.message import Message
    from .batches import Handling

__all__ = ["INBOX_BYTES", "Flow", "Runner", "TaskRunner"]

logger = logging.getLogger("rabbitry.consumer")

#: What may wait for a handler when the broker's prefetch does not bound it (auto ack,
#: or prefetch 0): messages (with prefetch 0) and body bytes, before the connection stops
#: reading the socket.
INBOX_MESSAGES = 1024
INBOX_BYTES = 16 * 1024 * 1024


class Runner(Protocol):
    """Runs a consumer's handler on the work of its :class:`Flow`."""

    def pump(self) -> None:
        """Start handling what waits in the inbox, as far as free handler slots go."""
        ...

    def take_back(self, requeue: bool) -> None:
        """Take back the work handed out that no handler has started.

        Args:
            requeue: nack it back to the queue (a stop, a broker cancel), else leave it
                to the broker (its channel has closed).
        """
        ...


class Flow:
    """The state of the work between a consumer's deliveries and its handlers: the
    inbox, the handlings in flight and the pause of the connection's reads.

    Args:
        connection: the consumer's connection (its reads are paused and resumed).
        owner: the consumer (named in the logs).
        bounded: count what waits and pause reads past ``limit`` messages or
            :data:`INBOX_BYTES` (when the broker's prefetch bounds nothing).
        prefetch: the consumer's prefetch (0: :data:`INBOX_MESSAGES` bound the inbox).
    """

    __slots__ = (
        "bounded",
        "connection",
        "idle",
        "inbox",
        "limit",
        "owner",
        "reads_paused",
        "runner",
        "running",
        "stopping",
        "tasks",
        "waiting",
        "waiting_bytes",
    )

    def __init__(
        self, connection: AsyncConnection, owner: object, *, bounded: bool, prefetch: int
    ) -> None:
        self.connection = connection
        self.owner = owner
        #: Work waiting for a handler slot: single messages, or whole batches.
        self.inbox: deque[Message | list[Message]] = deque()
        self.bounded = bounded
        self.limit = prefetch or INBOX_MESSAGES
        self.waiting = 0
        self.waiting_bytes = 0
        self.reads_paused = False
        #: Work in flight: handler tasks, and with handler threads also the messages
        #: queued for them (see rabbitry.sync._consumer_threads).
        self.running = 0
        self.tasks: set[asyncio.Task[None]] = set()
        #: Set while nothing runs (created by start()).
        self.idle: asyncio.Event | None = None
        self.stopping = False
        #: Who runs the handler (set by the consumer).
        self.runner: Runner

    def handed_out(self, work: Message | list[Message]) -> None:
        """A message (or batch) left the inbox for a handler: read again at half.

        Args:
            work: what left.
        """
        for message in work if isinstance(work, list) else (work,):
            self.waiting -= 1
            self.waiting_bytes -= len(message.body)
        if (
            self.reads_paused
            and self.waiting <= self.limit // 2
            and self.waiting_bytes <= INBOX_BYTES // 2
        ):
            self.reads_paused = False
            self.connection.read_flow.resume()

    def forget_waiting(self) -> None:
        """The inbox was emptied (stop, or the channel ended): read again."""
        self.waiting = 0
        self.waiting_bytes = 0
        self.resume_reads()

    def resume_reads(self) -> None:
        """Undo this consumer's pause of the connection's reading, if it paused it."""
        if self.reads_paused:
            self.reads_paused = False
            self.connection.read_flow.resume()

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` in a task counted as running (``idle`` clears until it ends).

        Args:
            work: a handling.
        """
        self.running += 1
        assert self.idle is not None
        self.idle.clear()
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.running -= 1
        if not task.cancelled() and task.exception() is not None:
            logger.error("consumer %s: handler task failed", self.owner, exc_info=task.exception())
        if not self.stopping:
            self.runner.pump()
        if self.running == 0 and self.idle is not None:
            self.idle.set()


class TaskRunner:
    """Runs the handler in up to ``concurrency`` asyncio tasks, each draining the inbox.

    A handler that does not suspend lets its task take the next message in the same
    loop iteration, so the acks of a burst leave in one write (not one send each).

    Args:
        owner: the consumer (its ``concurrency``; handed to the process spans).
        flow: the consumer's work.
        handling: hands each piece of work to the handler and settles it.
    """

    __slots__ = ("flow", "handling", "owner")

    def __init__(self, owner: _Owner, flow: Flow, handling: Handling) -> None:
        self.owner = owner
        self.flow = flow
        self.handling = handling

    def pump(self) -> None:
        """Start handler tasks while work waits and fewer than ``concurrency`` run."""
        flow = self.flow
        while flow.inbox and flow.running < self.owner.concurrency:
            flow.spawn(self._work())

    def take_back(self, requeue: bool) -> None:
        """Nothing to take back: tasks take work off the inbox only to handle it.

        Args:
            requeue: unused.
        """

    async def _work(self) -> None:
        flow = self.flow
        inbox = flow.inbox
        handling = self.handling
        while inbox and not flow.stopping:
            work = inbox.popleft()
            if flow.bounded:
                flow.handed_out(work)
            traced = _obs.active
            if traced is not None and traced.records_process():
                # rabbitry.observability: a process span and measurements around it
                handled = (
                    handling.handle_batch(work) if isinstance(work, list) else handling.handle(work)
                )
                await traced.process(self.owner, work, handled)
            elif isinstance(work, list):
                await handling.handle_batch(work)
            else:
                await handling.handle(work)


class _Owner(Protocol):
    @property
    def concurrency(self) -> int: ...
