"""The hot paths measured by ``test_perf_budget.py`` (and ``bench/profile_paths.py``):
the channel API's, and those of the publisher and consumers that applications use.

Each path runs against the real broker: a warm-up (caches, dict and deque sizes, the
first consumer), then a phase of ``n`` messages under ``cProfile`` (Python function
calls, C calls included, summed over every thread that does the work: the caller, and
for the sync API the IO, dispatcher and ``Consumer`` handler threads), then phases under
``tracemalloc``: what messages leave allocated after a ``gc.collect()``, without the
one-off growth of the first phase.

The numbers are counts, not times, so a busy machine does not move them much; what
varies with timing is how many messages share one socket read, loop iteration or flush,
hence thousands of messages per path, and budgets with headroom.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import pstats
import sys
import threading
import tracemalloc
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import rabbitry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

BODY = b"x" * 128
WINDOW = 1000
BATCH = 500

FuncKey = tuple[str, int, str]


@dataclass
class Measurement:
    """What one measured phase of one path cost."""

    path: str
    n: int
    calls: dict[FuncKey, int] = field(default_factory=dict)
    retained_bytes: int = 0

    @property
    def calls_per_msg(self) -> float:
        return sum(self.calls.values()) / self.n

    @property
    def retained_bytes_per_msg(self) -> float:
        return self.retained_bytes / self.n

    def top(self, k: int = 12) -> list[tuple[str, float]]:
        """The ``k`` functions called most often, as ``(name, calls per message)``."""
        ranked = sorted(self.calls.items(), key=lambda item: -item[1])[:k]
        return [(_label(key), count / self.n) for key, count in ranked]


def _label(key: FuncKey) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    short = filename.rsplit("/src/", 1)[-1].rsplit("/lib/python", 1)[-1]
    if "/tests/" in short:  # this checkout's own test files: relative to the repository
        short = "tests/" + short.rsplit("/tests/", 1)[-1]
    return f"{short}:{line}({name})"


#: cProfile on Python 3.12+ is built on sys.monitoring, which is process-wide: one enabled
#: profile counts the calls of every thread, and enabling a second one while it runs fails
#: with "Another profiling tool is already active". Before 3.12 a profile sees only the
#: thread that enabled it.
_PROFILE_IS_PROCESS_WIDE = sys.version_info >= (3, 12)


class _Profiles:
    """cProfile profiles enabled on several threads, merged into call counts."""

    def __init__(self) -> None:
        self._profiles: list[cProfile.Profile] = []

    def new(self) -> cProfile.Profile:
        profile = cProfile.Profile()
        self._profiles.append(profile)
        return profile

    def calls(self) -> dict[FuncKey, int]:
        merged: dict[FuncKey, int] = {}
        for profile in self._profiles:
            stats: dict[FuncKey, tuple[Any, ...]] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            for key, (_cc, nc, *_rest) in stats.items():
                merged[key] = merged.get(key, 0) + nc
        return merged


# ---------------------------------------------------------------------- async paths


def _async_filler(ch: Any, queue: str) -> Any:
    """``fill(n)``: publish ``n`` messages to ``queue`` and wait until all are ready."""

    async def fill(n: int) -> None:
        for _ in range(n):
            await ch.basic_publish("", queue, BODY)
        while (await ch.queue_declare(queue, passive=True)).message_count < n:
            await asyncio.sleep(0.01)

    return fill


def _sync_filler(ch: Any, queue: str) -> Any:
    """``fill(n)``: publish ``n`` messages to ``queue`` and wait until all are ready."""

    def fill(n: int) -> None:
        for _ in range(n):
            ch.basic_publish("", queue, BODY)
        while ch.queue_declare(queue, passive=True).message_count < n:
            threading.Event().wait(0.01)

    return fill


async def _async_publish(conn: rabbitry.AsyncConnection, queue: str) -> Any:
    ch = await conn.channel()
    await ch.queue_declare(queue)

    async def phase(n: int) -> None:
        publish = ch.basic_publish
        for _ in range(n):
            await publish("", queue, BODY)
        await ch.queue_declare(queue, passive=True)  # barrier: everything was written

    return phase


async def _async_publish_confirm(conn: rabbitry.AsyncConnection, queue: str) -> Any:
    ch = await conn.channel()
    await ch.confirm_select()
    await ch.queue_declare(queue)

    async def phase(n: int) -> None:
        pending: deque[asyncio.Future[None]] = deque()
        publish = ch.basic_publish
        for _ in range(n):
            if len(pending) >= WINDOW:
                await pending.popleft()
                while pending and pending[0].done():
                    pending.popleft().result()
            fut = await publish("", queue, BODY)
            assert fut is not None
            pending.append(fut)
        while pending:
            await pending.popleft()

    return phase


async def _async_publish_batch(conn: rabbitry.AsyncConnection, queue: str) -> Any:
    ch = await conn.channel()
    await ch.queue_declare(queue)
    publisher = await conn.publisher(max_in_flight=WINDOW)

    async def phase(n: int) -> None:
        for _ in range(n // BATCH):
            outcomes = await publisher.publish_batch([BODY] * BATCH, routing_key=queue)
            assert not any(outcomes)

    return phase


async def _async_consume_ack(conn: rabbitry.AsyncConnection, queue: str) -> Any:
    ch = await conn.channel()
    await ch.queue_declare(queue)
    await ch.basic_qos(WINDOW)
    loop = asyncio.get_running_loop()

    fill = _async_filler(ch, queue)

    async def phase(n: int) -> None:
        done = loop.create_future()
        count = 0

        def on_message(message: rabbitry.Message) -> None:
            nonlocal count
            message.ack()
            count += 1
            if count == n:
                done.set_result(None)

        tag = await ch.basic_consume(queue, on_message)
        await done
        await ch.basic_cancel(tag)
        await ch.queue_declare(queue, passive=True)  # barrier after the last ack

    phase.fill = fill  # type: ignore[attr-defined]
    return phase


ASYNC_PATHS = {
    "async.publish": _async_publish,
    "async.publish_confirm": _async_publish_confirm,
    "async.publish_batch": _async_publish_batch,
    "async.consume_ack": _async_consume_ack,
}


async def measure_async(path: str, url: str, queue: str, n: int, warmup: int) -> Measurement:
    """Measure one async path (runs on the calling thread's loop)."""
    async with rabbitry.AsyncConnection(url) as conn:
        phase = await ASYNC_PATHS[path](conn, queue)
        fill = getattr(phase, "fill", None)
        result = Measurement(path, n)
        if fill is not None:
            await fill(warmup)
        await phase(warmup)
        # Calls.
        if fill is not None:
            await fill(n)
        profiles = _Profiles()
        profile = profiles.new()
        profile.enable()
        try:
            await phase(n)
        finally:
            profile.disable()
        result.calls = profiles.calls()
        # Memory left behind: the growth over a second traced phase, so that one-off
        # growth (a dict or deque reaching its working size) stays out of it.
        with _Traced() as traced:
            for _ in range(3):
                if fill is not None:
                    await fill(n)
                await phase(n)
                traced.mark()
        result.retained_bytes = traced.growth
        await _delete(conn, queue)
        return result


async def _delete(conn: rabbitry.AsyncConnection, queue: str) -> None:
    ch = await conn.channel()
    await ch.queue_delete(queue)
    await ch.close()


class _Traced:
    """Traced memory (``tracemalloc``) after a ``gc.collect()`` at each ``mark()``;
    ``growth`` is the difference between the last two marks."""

    def __enter__(self) -> _Traced:
        self._was_tracing = tracemalloc.is_tracing()
        if not self._was_tracing:
            tracemalloc.start()
        self._marks: list[int] = []
        return self

    def mark(self) -> None:
        gc.collect()
        self._marks.append(tracemalloc.get_traced_memory()[0])

    @property
    def growth(self) -> int:
        """The smaller of the last two phases' growth: a leak shows in both, while a
        container that resizes back and forth (a dict of 1000 unconfirmed publishes)
        moves the traced size by tens of KB in either direction in one of them."""
        marks = self._marks
        return min(b - a for a, b in zip(marks[-3:], marks[-2:], strict=False))

    def __exit__(self, *exc_info: object) -> None:
        if not self._was_tracing:
            tracemalloc.stop()


# ----------------------------------------------------------------------- sync paths


def _sync_publish(conn: rabbitry.Connection, queue: str) -> Any:
    ch = conn.channel()
    ch.queue_declare(queue)

    def phase(n: int) -> None:
        publish = ch.basic_publish
        for _ in range(n):
            publish("", queue, BODY)
        ch.queue_declare(queue, passive=True)

    return phase


def _sync_publish_confirm(conn: rabbitry.Connection, queue: str) -> Any:
    ch = conn.channel()
    ch.confirm_select()
    ch.queue_declare(queue)

    def phase(n: int) -> None:
        pending: deque[Any] = deque()
        publish = ch.basic_publish
        for _ in range(n):
            if len(pending) >= WINDOW:
                pending.popleft().result()
                while pending and pending[0].done():
                    pending.popleft().result()
            pending.append(publish("", queue, BODY))
        while pending:
            pending.popleft().result()

    return phase


def _sync_publish_batch(conn: rabbitry.Connection, queue: str) -> Any:
    ch = conn.channel()
    ch.queue_declare(queue)
    publisher = conn.publisher(max_in_flight=WINDOW)

    def phase(n: int) -> None:
        for _ in range(n // BATCH):
            outcomes = publisher.publish_batch([BODY] * BATCH, routing_key=queue)
            assert not any(outcomes)

    return phase


def _sync_consume_ack(conn: rabbitry.Connection, queue: str) -> Any:
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.basic_qos(WINDOW)

    fill = _sync_filler(ch, queue)

    def phase(n: int) -> None:
        done = threading.Event()
        count = 0

        def on_message(message: rabbitry.Message) -> None:
            nonlocal count
            message.ack()
            count += 1
            if count == n:
                done.set()

        tag = ch.basic_consume(queue, on_message)
        if not done.wait(60):
            raise TimeoutError(f"consumed {count} of {n} messages in 60 s")
        ch.basic_cancel(tag)
        ch.queue_declare(queue, passive=True)

    phase.fill = fill  # type: ignore[attr-defined]
    return phase


SYNC_PATHS = {
    "sync.publish": _sync_publish,
    "sync.publish_confirm": _sync_publish_confirm,
    "sync.publish_batch": _sync_publish_batch,
    "sync.consume_ack": _sync_consume_ack,
}


class _on_all_threads:
    """Profile the caller, the connection's IO thread, its dispatcher thread, and every
    thread started meanwhile (a ``Consumer``'s handler threads, started with it).

    An existing thread enables its profile in a function run on it (through the portal,
    or the dispatcher's queue); a new thread enables its own when it starts
    (``threading.setprofile``), and is joined at the end so that its counts are complete.
    """

    def __init__(self, conn: rabbitry.Connection, profiles: _Profiles) -> None:
        self._portal = conn._portal
        self._dispatcher = conn._dispatcher
        self._profiles = profiles
        self._started: list[threading.Thread] = []

    def _on_thread_start(self, *_event: object) -> None:
        """The first profile event of a thread started in the window: profile it."""
        self._started.append(threading.current_thread())
        self._profiles.new().enable()  # replaces this hook on this thread

    def _on_io(self, fn: Callable[[], Any]) -> None:
        assert self._portal is not None
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._portal.submit(run)
        if not done.wait(10):
            raise RuntimeError("the IO thread did not run the profiler switch in 10 s")

    def _on_dispatcher(self, fn: Callable[[], Any]) -> None:
        assert self._portal is not None and self._dispatcher is not None
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._portal.submit(self._dispatcher.post, run)
        if not done.wait(10):
            raise RuntimeError("the dispatcher did not run the profiler switch in 10 s")

    def __enter__(self) -> None:
        if _PROFILE_IS_PROCESS_WIDE:
            # One profile sees every thread; another enable() would be refused.
            self._before = set(threading.enumerate())
            self._main = self._profiles.new()
            self._main.enable()
            return
        self._io = self._profiles.new()
        self._disp = self._profiles.new()
        self._main = self._profiles.new()
        threading.setprofile(self._on_thread_start)
        self._on_io(self._io.enable)
        self._on_dispatcher(self._disp.enable)
        self._main.enable()

    def __exit__(self, *exc_info: object) -> None:
        if _PROFILE_IS_PROCESS_WIDE:
            try:
                for thread in set(threading.enumerate()) - self._before:
                    thread.join(10)
                    if thread.is_alive():
                        raise RuntimeError(f"{thread.name} did not end within 10 s of the phase")
            finally:
                self._main.disable()
            return
        self._main.disable()
        self._on_dispatcher(self._disp.disable)
        self._on_io(self._io.disable)
        threading.setprofile(None)
        for thread in self._started:
            thread.join(10)
            if thread.is_alive():
                raise RuntimeError(f"{thread.name} did not end within 10 s of the phase")


def measure_sync(path: str, url: str, queue: str, n: int, warmup: int) -> Measurement:
    """Measure one sync path."""
    with rabbitry.Connection(url) as conn:
        phase = SYNC_PATHS[path](conn, queue)
        fill = getattr(phase, "fill", None)
        result = Measurement(path, n)
        if fill is not None:
            fill(warmup)
        phase(warmup)
        if fill is not None:
            fill(n)
        profiles = _Profiles()
        with _on_all_threads(conn, profiles):
            phase(n)
        result.calls = profiles.calls()
        with _Traced() as traced:
            for _ in range(3):
                if fill is not None:
                    fill(n)
                phase(n)
                traced.mark()
        result.retained_bytes = traced.growth
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.close()
        return result


# --------------------------------------- high-level API: AsyncPublisher and consumers


async def _async_publisher_each(conn: rabbitry.AsyncConnection, queue: str) -> Any:
    """``await publisher.send(...)`` with the publisher's defaults (confirms on, a
    window of 1000), every message's confirm future awaited: gathered per chunk of
    ``WINDOW`` messages, as an application that wants each outcome does."""
    ch = await conn.channel()
    await ch.queue_declare(queue)
    publisher = await conn.publisher()

    async def phase(n: int) -> None:
        publish = publisher.send
        left = n
        while left:
            k = min(WINDOW, left)
            futures = [await publish(BODY, routing_key=queue) for _ in range(k)]
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            assert not any(outcomes), outcomes
            left -= k

    return phase


async def _async_consumer_handler(conn: rabbitry.AsyncConnection, queue: str) -> Any:
    """An ``AsyncConsumer`` (manual ack, default prefetch) whose async handler returns:
    the consumer acks each message. One consumer per phase, started and stopped in it."""
    ch = await conn.channel()
    await ch.queue_declare(queue)
    loop = asyncio.get_running_loop()

    fill = _async_filler(ch, queue)

    async def phase(n: int) -> None:
        done = loop.create_future()
        count = 0

        async def handler(message: rabbitry.Message) -> None:
            nonlocal count
            count += 1
            if count == n:
                done.set_result(None)

        consumer = conn.consumer(queue, handler)
        await consumer.start()
        await done
        await consumer.stop()  # barrier: the last ack, then cancel and channel.close

    phase.fill = fill  # type: ignore[attr-defined]
    return phase


def _sync_consumer_handler(conn: rabbitry.Connection, queue: str) -> Any:
    """A ``Consumer`` (manual ack, default prefetch) whose plain handler returns, on the
    consumer's handler thread: the consumer acks each message on the IO thread. One
    consumer (and handler thread) per phase, started and stopped in it."""
    ch = conn.channel()
    ch.queue_declare(queue)

    fill = _sync_filler(ch, queue)

    def phase(n: int) -> None:
        done = threading.Event()
        count = 0

        def handler(message: rabbitry.Message) -> None:
            nonlocal count
            count += 1
            if count == n:
                done.set()

        consumer = conn.consumer(queue, handler)
        consumer.start()
        if not done.wait(60):
            raise TimeoutError(f"consumed {count} of {n} messages in 60 s")
        consumer.stop()  # barrier: the last ack, then cancel and channel.close

    phase.fill = fill  # type: ignore[attr-defined]
    return phase


ASYNC_PATHS["async.publisher_each"] = _async_publisher_each
ASYNC_PATHS["async.consumer_handler"] = _async_consumer_handler
SYNC_PATHS["sync.consumer_handler"] = _sync_consumer_handler

PATHS = [*ASYNC_PATHS, *SYNC_PATHS]


def measure(path: str, url: str, queue: str, n: int = 2000, warmup: int = 1500) -> Measurement:
    """Measure ``path`` (a key of :data:`PATHS`) over ``n`` messages."""
    if path in ASYNC_PATHS:
        return asyncio.run(measure_async(path, url, queue, n, warmup))
    return measure_sync(path, url, queue, n, warmup)


def iter_paths() -> Iterator[str]:
    yield from PATHS
