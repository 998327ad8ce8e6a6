"""A first-in first-out queue of tasks waiting to be handed something: :class:`Waiters`.

The library's asyncio code waits in such queues for a window slot (the publisher), a
pooled channel or the right to open one (the channel pool), the end of the transport's
back-pressure, or a state (a publisher with nothing in flight, a channel with no
unconfirmed publish), or for room of a size of its own (the outbox publisher reserves
rows and bytes). The queue holds one future per waiting task, oldest first.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Waiters"]

T = TypeVar("T")


class _Waiter(asyncio.Future[T]):
    """The future of one waiting task: cancelling it takes it out of its queue at once,
    so the queue's length never counts a task that stopped waiting."""

    __slots__ = ("_queue", "need")

    _queue: Waiters[T]
    need: Any

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        queue = self._queue
        if self in queue:
            queue.remove(self)
        return True


class Waiters(deque[_Waiter[T]]):
    """Tasks waiting to be handed an item, served oldest first.

    A task waits with ``item = await waiters.wait()``; the owner hands items out with
    :meth:`hand` (to the oldest waiter), :meth:`wake_all` or :meth:`fail_all`.

    ``len(waiters)`` is the number of tasks waiting now: a task leaves the queue when it
    is handed an item, when it is failed, and at the moment its wait is cancelled (by
    ``Task.cancel``, or by a timeout around it), not later when the task runs again. The
    queue is a ``deque`` of the waiting futures so that ``len()`` and a truth test cost
    no Python call on a hot path; it is changed only through the methods below.

    Hand-off: with ``on_unclaimed``, each item belongs to the waiter it is handed to (a
    window slot, a channel). If that waiter is cancelled before it resumes (the item
    was handed in the same loop pass as the cancellation), the item is not lost: it
    goes to the next waiter, or to ``on_unclaimed(item)`` when nobody else waits.
    Without it the queue only notifies (every waiter gets the same news), and a
    cancelled waiter's item is dropped.

    Sized waits: a task may say what it waits for (``wait(need)``, e.g. a number of rows
    and bytes). The owner serves the queue in order: while :meth:`next_need` fits, it
    sets that much aside and calls :meth:`hand`. An item handed to a sized waiter that
    is cancelled before it resumes was measured for that waiter alone, so it goes
    straight to ``on_unclaimed`` (which gives it back and serves the queue again).

    Args:
        on_unclaimed: takes back an item a cancelled waiter could not pass on.
    """

    __slots__ = ("_on_unclaimed",)

    def __init__(self, on_unclaimed: Callable[[T], object] | None = None) -> None:
        super().__init__()
        self._on_unclaimed = on_unclaimed

    async def wait(self, need: Any = None) -> T:
        """Join the end of the queue and wait to be handed an item.

        Args:
            need: what this task waits for (see *Sized waits*); ``None`` for any item.

        Returns:
            The item given to :meth:`hand` or :meth:`wake_all`.

        Raises:
            BaseException: the exception given to :meth:`fail_all` (a copy of it).
        """
        waiter: _Waiter[T] = _Waiter(loop=asyncio.get_running_loop())
        waiter._queue = self
        waiter.need = need
        self.append(waiter)
        try:
            return await waiter
        except BaseException:
            on_unclaimed = self._on_unclaimed
            if (
                on_unclaimed is not None
                and waiter.done()
                and not waiter.cancelled()
                and waiter.exception() is None
            ):
                # Handed an item in the pass that cancelled us: it goes on.
                item = waiter.result()
                if need is not None or not self.hand(item):
                    on_unclaimed(item)
            raise

    def next_need(self) -> Any:
        """What the oldest waiting task waits for (its ``wait(need)``); ``None`` when no
        task waits."""
        while self:
            waiter = self[0]
            if not waiter.done():
                return waiter.need
            self.popleft()
        return None

    def hand(self, item: T) -> bool:
        """Give ``item`` to the oldest waiting task.

        Args:
            item: what the task's :meth:`wait` returns.

        Returns:
            ``True`` when a task took it, ``False`` when none waits (the caller keeps it).
        """
        while self:
            waiter = self.popleft()
            if not waiter.done():
                waiter.set_result(item)
                return True
        return False

    def wake_all(self, item: T) -> None:
        """Give ``item`` to every waiting task; the queue is empty afterwards.

        Args:
            item: what each task's :meth:`wait` returns.
        """
        while self:
            waiter = self.popleft()
            if not waiter.done():
                waiter.set_result(item)

    def fail_all(self, exc: BaseException) -> None:
        """Make every waiting task's :meth:`wait` raise ``exc``; the queue is empty afterwards.

        Each task gets its own copy (one exception object raised in several tasks would
        collect all their tracebacks), with the same ``__cause__``.

        Args:
            exc: what to raise.
        """
        while self:
            waiter = self.popleft()
            if not waiter.done():
                error = copy.copy(exc)
                error.__cause__ = exc.__cause__
                waiter.set_exception(error)
