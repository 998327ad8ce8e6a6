"""Run a service until a signal: :func:`run`.

A consumer service is a main function that connects, starts consumers and then waits
for ever. ``rabbitry.run(main)`` runs it and turns SIGINT (Ctrl-C) and SIGTERM (what
``kill``, systemd, Docker and Kubernetes send) into an orderly stop::

    async def main() -> None:
        async with rabbitry.AsyncConnection() as conn:
            async with conn.consumer("jobs", handle) as consumer:
                await consumer.wait()            # until the consumer ends for good

    rabbitry.run(main)

With a coroutine function (or a coroutine) the first signal cancels the main task:
``async with`` blocks unwind, consumers drain their running handlers, connections
close. With a plain function, the first signal raises :class:`ServiceStopped` (a
``BaseException``, like ``KeyboardInterrupt``) in the main thread wherever it waits
(``consumer.wait()``, ``conn.wait_closed()``, ``time.sleep``): ``with`` blocks unwind the
same way. Either way, connections opened while ``main`` ran and still open afterwards
are closed, and ``run`` returns ``None``; more signals during that shutdown are logged
and ignored. Without a signal ``run`` returns what ``main`` returned, or raises what it
raised.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .consumer import is_async_callable
from .exceptions import ConfigurationError, InvalidStateError, ServiceStopped

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Iterable

__all__ = ["ServiceStopped", "run"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The signals :func:`run` stops on by default.
DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_CLOSE_TIMEOUT = 10.0


@overload
def run(
    main: Callable[[], Coroutine[Any, Any, T]] | Coroutine[Any, Any, T],
    *,
    signals: Iterable[int] = ...,
    close_timeout: float = ...,
) -> T | None: ...


@overload
def run(
    main: Callable[[], T],
    *,
    signals: Iterable[int] = ...,
    close_timeout: float = ...,
) -> T | None: ...


def run(
    main: Callable[[], Any] | Coroutine[Any, Any, Any],
    *,
    signals: Iterable[int] = DEFAULT_SIGNALS,
    close_timeout: float = _CLOSE_TIMEOUT,
) -> Any:
    """Run ``main`` until it returns or a signal in ``signals`` arrives.

    Args:
        main: a coroutine function or coroutine (run with ``asyncio.run``), or a plain
            function (run in the calling thread, which must be the main thread).
        signals: the signals that stop the service (default SIGINT and SIGTERM).
        close_timeout: seconds each connection left open gets to close cleanly.

    Returns:
        What ``main`` returned, or ``None`` when a signal stopped it.

    Raises:
        ConfigurationError: ``main`` is neither callable nor a coroutine, or
            ``close_timeout`` is not positive.
        InvalidStateError: called outside the main thread (Python delivers signals to
            the main thread only), or, for a coroutine, inside a running event loop.
        Exception: whatever ``main`` raised.
    """
    try:
        wanted = tuple(_signal(s) for s in signals)
        if not close_timeout > 0:
            raise ConfigurationError(f"close_timeout: must be > 0 seconds, got {close_timeout!r}")
        if threading.current_thread() is not threading.main_thread():
            raise InvalidStateError(
                "rabbitry.run: must be called from the main thread (signals are delivered there)"
            )
        if inspect.iscoroutine(main) or is_async_callable(main):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                raise InvalidStateError(
                    "rabbitry.run: called inside a running event loop; await main() there"
                )
    except BaseException:
        if inspect.iscoroutine(main):
            main.close()  # never run: no "was never awaited" warning on top of the error
        raise
    if inspect.iscoroutine(main) or is_async_callable(main):
        return asyncio.run(_serve(main, wanted, close_timeout))
    if not callable(main):
        raise ConfigurationError(
            f"main: must be a coroutine function, a coroutine or a function, got "
            f"{type(main).__name__}"
        )
    return _serve_sync(main, wanted, close_timeout)


def _signal(value: int) -> signal.Signals:
    try:
        return signal.Signals(value)
    except ValueError:
        raise ConfigurationError(f"signals: {value!r} is not a signal of this system") from None


async def _serve(
    main: Callable[[], Awaitable[Any]] | Coroutine[Any, Any, Any],
    signals: tuple[signal.Signals, ...],
    close_timeout: float,
) -> Any:
    from .aio.connection import CONNECTIONS, open_connections

    loop = asyncio.get_running_loop()
    before = set(CONNECTIONS)
    work = main if inspect.iscoroutine(main) else main()  # type: ignore[operator]
    task: asyncio.Future[Any] = asyncio.ensure_future(work)
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        if received:
            logger.warning("received %s while stopping: ignored", signum.name)
            return
        received.append(signum)
        logger.info("received %s: stopping", signum.name)
        task.cancel()

    for signum in signals:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        try:
            return await task
        except asyncio.CancelledError:
            if not received:
                raise
            return None
    finally:
        # Signals stay caught until every connection has closed: a second SIGTERM
        # must not kill the process halfway through a clean close.
        left = [conn for conn in open_connections(loop) if conn not in before]
        for conn, outcome in zip(
            left,
            await asyncio.gather(
                *(conn.close(timeout=close_timeout) for conn in left), return_exceptions=True
            ),
            strict=True,
        ):
            if isinstance(outcome, BaseException):
                logger.warning("closing %r after the service stopped: %r", conn, outcome)
        for signum in signals:
            loop.remove_signal_handler(signum)


def _serve_sync(
    main: Callable[[], Any], signals: tuple[signal.Signals, ...], close_timeout: float
) -> Any:
    from .sync._connection import CONNECTED

    before = set(CONNECTED)
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if received:
            logger.warning("received %s while stopping: ignored", signal.Signals(signum).name)
            return
        received.append(signum)
        logger.info("received %s: stopping", signal.Signals(signum).name)
        raise ServiceStopped(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in signals}
    try:
        try:
            return main()
        except ServiceStopped:
            return None
    finally:
        for conn in [c for c in list(CONNECTED) if c not in before]:
            try:
                conn.close(timeout=close_timeout)
            except Exception as exc:  # close never raises for a reason worth stopping on
                logger.warning("closing %r after the service stopped: %r", conn, exc)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
