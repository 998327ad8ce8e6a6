"""Consumer: the thread-safe twin of :class:`rabbitry.consumer.AsyncConsumer`.

The async consumer does all the work on the IO thread (deliveries, acks, failure
policy); here its handler runs on ``concurrency`` threads of its own (a ``ThreadRunner``,
see ``rabbitry.sync._consumer_threads``). A handler may block for as
long as it needs: heartbeats are the IO thread's job, and the broker's
``consumer_timeout`` is the only limit. Messages handed to the handler ack through the
portal, so ``message.ack()`` from the handler thread is safe (the consumer then does not
ack it again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from .._consumer.core import run_handlers_with
from ..consumer import AsyncConsumer, ConsumerStats, DedupStore, SyncHandler, is_async_callable
from ..exceptions import ConfigurationError, InvalidStateError
from ._connection import engine_of, portal_of, post_callback
from ._consumer_threads import ThreadRunner
from .channel import caller_timeout

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..exceptions import AMQPError
    from ..topology._retry import RetryPolicy
    from ._connection import Connection

__all__ = ["Consumer"]


class Consumer:
    """Consume ``queue`` with a plain ``handler(message)`` run off the IO thread.

    Same arguments and semantics as :class:`AsyncConsumer` (see ``rabbitry.consumer``);
    create it with ``connection.consumer(queue, handler, ...)`` and ``start()`` it, or use
    it as a context manager.

    Raises:
        ConfigurationError: ``handler`` is a coroutine function (or a partial of one, or
            an object whose ``__call__`` is one): it would never run here.
    """

    def __init__(
        self,
        connection: Connection,
        queue: str,
        handler: SyncHandler,
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
        if is_async_callable(handler):
            # It would run on a pool thread, return a coroutine nobody awaits, and the
            # message would be acked unprocessed.
            raise ConfigurationError(
                f"handler: {handler!r} is a coroutine function; rabbitry.Consumer runs "
                "plain functions on threads. Use AsyncConnection.consumer for async "
                "handlers, or pass a plain function"
            )
        self._connection = connection
        self._portal = portal_of(connection)
        user_cancel = on_cancel
        cancel_hook = None
        if user_cancel is not None:

            def cancel_hook(tag: str) -> None:
                post_callback(connection, user_cancel, tag)

        self._threads = ThreadRunner(self._portal, handler, concurrency=concurrency)
        self._async = AsyncConsumer(
            engine_of(connection),
            queue,
            self._threads.run_on_thread,
            ack=ack,
            prefetch=prefetch,
            concurrency=concurrency,
            retry=retry,
            batch_size=batch_size,
            batch_timeout=batch_timeout,
            exclusive=exclusive,
            arguments=arguments,
            dedup=dedup,
            on_cancel=cancel_hook,
            resubscribe=resubscribe,
        )
        run_handlers_with(self._async, self._threads)

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncConsumer", "Consumer", 1)

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def queue(self) -> str:
        """The queue consumed from."""
        return self._async.queue

    @property
    def consumer_tag(self) -> str | None:
        """The broker's tag for the current subscription."""
        return self._async.consumer_tag

    @property
    def is_running(self) -> bool:
        """Started and not stopped."""
        return self._async.is_running

    @property
    def stats(self) -> ConsumerStats:
        """Counters of deliveries, acks, retries, parked messages..."""
        return self._async.stats

    @property
    def ack_mode(self) -> str:
        """ "manual" or "auto"."""
        return self._async.ack_mode

    @property
    def arguments(self) -> dict[str, Any] | None:
        """Consumer arguments."""
        return self._async.arguments

    @property
    def batch_size(self) -> int | None:
        """Messages per batch, or None."""
        return self._async.batch_size

    @property
    def batch_timeout(self) -> float:
        """Seconds a batch may wait to fill."""
        return self._async.batch_timeout

    @property
    def channel(self) -> Any:
        """The async channel currently consumed on (IO thread only; for diagnostics)."""
        return self._async.channel

    @property
    def concurrency(self) -> int:
        """Handlers running at once (pool threads)."""
        return self._async.concurrency

    @property
    def dedup(self) -> DedupStore | None:
        """The dedup store, if any."""
        return self._async.dedup

    @property
    def exclusive(self) -> bool:
        """Exclusive consumer."""
        return self._async.exclusive

    @property
    def on_cancel(self) -> Callable[[str], Any] | None:
        """The broker-cancel callback (as wrapped for the dispatcher)."""
        return self._async.on_cancel

    @property
    def prefetch(self) -> int:
        """The prefetch in effect (at least concurrency)."""
        return self._async.prefetch

    @property
    def resubscribe(self) -> bool:
        """Consume again after a broker cancel or channel error."""
        return self._async.resubscribe

    @property
    def retry(self) -> RetryPolicy | None:
        """The RetryPolicy, if any."""
        return self._async.retry

    def start(self, timeout: float | None = None) -> None:
        """Start the handler threads and subscribe; handlers start running on them.

        Args:
            timeout: seconds for each broker request it makes (``None``: no limit).
        """
        self._portal.call(self._threads.start, self._async, timeout, wait=caller_timeout(timeout))

    def wait(self, timeout: float | None = None) -> AMQPError | None:
        """Block until this consumer has ended for good; see :meth:`AsyncConsumer.wait`.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            ``None`` after :meth:`stop`, else why it ended.
        """
        return self._portal.call(self._async.wait, timeout, wait=caller_timeout(timeout))

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop consuming; see :meth:`AsyncConsumer.stop`.

        Messages prefetched that no handler has started (waiting for a handler thread)
        are requeued at once. A handler thread cannot be interrupted: the running
        handlers finish, and their messages are settled, even after ``stop()`` returned.

        Args:
            drain: wait for the running handlers to finish (and ack) before returning;
                otherwise return without waiting for them.
            timeout: seconds to wait for running handlers.
        """
        try:
            self._portal.call(self._async.stop, drain, timeout, wait=caller_timeout(timeout))
        finally:
            # Never wait here: stop() promised to return within its timeout. A handler
            # still running finishes on its thread (the consumer's channel stays open
            # until its message is settled); then the thread ends.
            try:
                self._portal.submit(self._threads.end_threads)
            except InvalidStateError:  # the IO thread has stopped (connection closed)
                self._threads.stop_threads()
