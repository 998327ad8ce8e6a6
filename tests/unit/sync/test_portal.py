"""Portal (IO thread + ordered hand-off) and Dispatcher (callback thread), no broker."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

import rabbitry
from rabbitry.exceptions import InvalidStateError, Timeout
from rabbitry.sync._portal import Dispatcher, Portal

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.timeout(60)

#: Upper bound for waiting on something that should happen (never a timing assertion).
WAIT = 5.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def assert_returns(fn: Callable[[], object]) -> None:
    """``fn()`` returns while something else still blocks (a liveness check, no timing)."""
    runner = threading.Thread(target=fn, name="test-returns")
    runner.start()
    runner.join(WAIT)
    assert not runner.is_alive(), f"{fn} did not return while a callback was blocking"


@pytest.fixture(autouse=True)
def no_thread_leaks() -> Iterator[None]:
    before = threading.active_count()
    before_names = {t.name for t in threading.enumerate()}
    yield
    ok = wait_until(lambda: threading.active_count() <= before)
    leaked = [t.name for t in threading.enumerate() if t.name not in before_names]
    assert ok, f"threads leaked: {leaked}"


@pytest.fixture
def portal() -> Iterator[Portal]:
    p = Portal("rabbitry-io-test")
    try:
        yield p
    finally:
        p.stop()
        assert not p.thread.is_alive()


def on_io_thread(portal: Portal, fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` on the IO thread and return its result."""

    async def run() -> Any:
        return fn()

    return portal.call(run, wait=WAIT)


# ============================================================================ Portal


def test_thread_is_named_daemon_and_running(portal: Portal) -> None:
    assert portal.thread.name == "rabbitry-io-test"
    assert portal.thread.daemon
    assert portal.thread.is_alive()
    assert portal.loop.is_running()
    assert not portal.in_io_thread()
    assert on_io_thread(portal, portal.in_io_thread) is True
    assert on_io_thread(portal, threading.current_thread) is portal.thread


def test_call_returns_the_result(portal: Portal) -> None:
    async def add(a: int, b: int, *, c: int = 0) -> tuple[int, str]:
        await asyncio.sleep(0)
        return a + b + c, threading.current_thread().name

    assert portal.call(add, 1, 2, c=3) == (6, "rabbitry-io-test")
    assert portal.call(add, 1, 2, c=3, wait=WAIT) == (6, "rabbitry-io-test")


def test_call_propagates_exceptions(portal: Portal) -> None:
    class Boom(Exception):
        pass

    async def fail() -> None:
        await asyncio.sleep(0)
        raise Boom("inside")

    with pytest.raises(Boom, match="inside"):
        portal.call(fail)
    # The portal is still usable afterwards.

    async def ok() -> int:
        return 7

    assert portal.call(ok) == 7


def test_call_timeout_raises_quickly_and_cancels_the_coroutine(portal: Portal) -> None:
    started = threading.Event()
    cancelled = threading.Event()
    finished = threading.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(5)
            finished.set()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(rabbitry.Timeout) as info:
        portal.call(slow, wait=0.1)
    assert isinstance(info.value, TimeoutError)
    assert started.is_set()
    assert cancelled.wait(WAIT), "the coroutine was not cancelled"
    assert not finished.is_set()


def test_call_from_the_io_thread_raises_invalid_state(portal: Portal) -> None:
    outcome: list[BaseException | str] = []
    done = threading.Event()

    async def noop() -> None:
        return None

    def inside() -> None:
        try:
            portal.call(noop, wait=1)
            outcome.append("no error")
        except BaseException as exc:
            outcome.append(exc)
        finally:
            done.set()

    portal.submit(inside)
    assert done.wait(WAIT)
    assert len(outcome) == 1
    assert isinstance(outcome[0], InvalidStateError)
    assert isinstance(outcome[0], RuntimeError)
    assert "IO thread" in str(outcome[0])


def test_submit_runs_on_the_io_thread_in_order(portal: Portal) -> None:
    seen: list[tuple[int, str]] = []
    for i in range(100):
        portal.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert on_io_thread(portal, lambda: len(seen)) == 100
    assert seen == [(i, "rabbitry-io-test") for i in range(100)]


def test_submit_from_four_threads_keeps_each_threads_order(portal: Portal) -> None:
    threads_n, per_thread = 4, 10_000
    seen: list[tuple[int, int]] = []  # only ever appended on the IO thread
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def producer(t: int) -> None:
        try:
            barrier.wait()
            for i in range(per_thread):
                portal.submit(seen.append, (t, i))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=producer, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert not errors
    assert on_io_thread(portal, lambda: len(seen)) == threads_n * per_thread
    for t in range(threads_n):
        assert [i for (tt, i) in seen if tt == t] == list(range(per_thread)), t
    # The producers really interleaved (otherwise the test proves little); with a
    # barrier and 10k each this is overwhelmingly likely but not guaranteed, so only
    # check that the result contains every thread.
    assert {t for t, _ in seen} == set(range(threads_n))


def test_call_and_submit_share_one_order(portal: Portal) -> None:
    seen: list[str] = []

    async def record(tag: str) -> None:
        seen.append(tag)

    portal.submit(seen.append, "submit-1")
    portal.call(record, "call-1")
    portal.submit(seen.append, "submit-2")
    portal.call(record, "call-2")
    assert seen == ["submit-1", "call-1", "submit-2", "call-2"]


def test_a_failing_submitted_fn_is_logged_and_later_ones_run(
    portal: Portal, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[int] = []

    def boom() -> None:
        raise ValueError("submitted fn failed")

    with caplog.at_level(logging.ERROR, logger="rabbitry.sync"):
        portal.submit(boom)
        portal.submit(seen.append, 1)
        assert on_io_thread(portal, lambda: list(seen)) == [1]
    assert any("submitted fn failed" in (r.exc_text or "") for r in caplog.records) or any(
        r.exc_info and "submitted fn failed" in str(r.exc_info[1]) for r in caplog.records
    )


class Gate:
    """A write gate the test opens and closes (see Portal.set_write_gate)."""

    def __init__(self, portal: Portal) -> None:
        self.portal = portal
        self.closed = False
        self.resumes: list[Callable[[], None]] = []
        self.calls = 0

    def __call__(self, resume: Callable[[], None]) -> bool:
        self.calls += 1
        if self.closed:
            self.resumes.append(resume)
            return True
        return False

    def open(self) -> None:
        def reopen() -> None:
            self.closed = False
            resumes, self.resumes = self.resumes, []
            for resume in resumes:
                resume()

        self.portal.loop.call_soon_threadsafe(reopen)


def test_submit_blocks_at_max_pending_while_the_gate_is_closed() -> None:
    portal = Portal("rabbitry-io-gated", max_pending=4)
    try:
        gate = Gate(portal)
        gate.closed = True
        portal.set_write_gate(gate)
        seen: list[int] = []
        for i in range(4):
            portal.submit(seen.append, i, timeout=1)
        # Full: a fifth submit waits for room and gives up.
        with pytest.raises(Timeout):
            portal.submit(seen.append, 99, timeout=0.2)
        assert wait_until(lambda: gate.calls >= 1)
        assert seen == []  # nothing ran while the gate was closed

        # A submitter without timeout blocks until the gate opens.
        entered = threading.Event()
        returned = threading.Event()

        def blocked_submit() -> None:
            entered.set()
            portal.submit(seen.append, 4)
            returned.set()

        blocker = threading.Thread(target=blocked_submit)
        blocker.start()
        assert entered.wait(WAIT)
        assert not returned.wait(0.3), "submit did not block with max_pending ops queued"

        gate.open()
        assert returned.wait(WAIT), "submit stayed blocked after the gate opened"
        blocker.join(WAIT)
        assert on_io_thread(portal, lambda: list(seen)) == [0, 1, 2, 3, 4]
    finally:
        portal.stop()
    assert not portal.thread.is_alive()


def test_a_submitter_blocked_for_room_is_released_by_stop() -> None:
    portal = Portal("rabbitry-io-stopped-while-full", max_pending=2)
    gate = Gate(portal)
    gate.closed = True
    portal.set_write_gate(gate)
    portal.submit(print, timeout=1)
    portal.submit(print, timeout=1)
    outcome: list[BaseException | None] = []

    def blocked_submit() -> None:
        try:
            portal.submit(print)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    blocker = threading.Thread(target=blocked_submit)
    blocker.start()
    time.sleep(0.1)
    portal.stop()
    blocker.join(WAIT)
    assert not blocker.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], InvalidStateError)


def test_submit_blocks_past_the_byte_budget_and_times_out_saying_so() -> None:
    portal = Portal("rabbitry-io-bytes", max_pending_bytes=1000)
    try:
        gate = Gate(portal)
        gate.closed = True
        portal.set_write_gate(gate)
        seen: list[int] = []
        portal.submit(seen.append, 1, size=600, timeout=1)
        portal.submit(seen.append, 2, size=400, timeout=1)  # exactly the budget
        with pytest.raises(Timeout, match="bytes queued"):
            portal.submit(seen.append, 3, size=1, timeout=0.2)
        portal.submit(seen.append, 4, timeout=1)  # no size: only the count bounds it
        gate.open()
        portal.submit(seen.append, 5, size=1000, timeout=WAIT)  # room again once drained
        assert on_io_thread(portal, lambda: list(seen)) == [1, 2, 4, 5]
    finally:
        portal.stop()


def test_one_operation_larger_than_the_budget_is_accepted_when_nothing_is_queued() -> None:
    portal = Portal("rabbitry-io-big", max_pending_bytes=1000)
    try:
        seen: list[int] = []
        portal.submit(seen.append, 1, size=10_000, timeout=1)
        assert on_io_thread(portal, lambda: list(seen)) == [1]
    finally:
        portal.stop()


def test_stop_runs_queued_operations_and_fails_waiting_calls_with_the_reason() -> None:
    portal = Portal("rabbitry-io-sweep")
    gate = Gate(portal)
    gate.closed = True
    portal.set_write_gate(gate)
    ran: list[str] = []
    portal.on_stop = lambda: ran.append("on_stop")
    portal.submit(ran.append, "queued")
    outcome: list[BaseException] = []

    async def never_started() -> None:
        ran.append("coroutine")

    def caller() -> None:
        try:
            portal.call(never_started)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=caller)
    thread.start()
    assert wait_until(lambda: len(portal._ops) == 2)
    reason = rabbitry.ConnectionClosedByClient(200, "Normal shutdown")
    portal.stop(reason=reason)
    thread.join(WAIT)
    assert not thread.is_alive()
    # The hook ended the engine first; the queued operation then ran; the coroutine of
    # the waiting call never started, and the call failed with (a copy of) the reason.
    assert ran == ["on_stop", "queued"]
    assert len(outcome) == 1 and isinstance(outcome[0], rabbitry.ConnectionClosedByClient)
    with pytest.raises(InvalidStateError) as later:
        portal.submit(print)
    assert later.value.__cause__ is reason


def test_stop_joins_and_later_use_raises_invalid_state() -> None:
    portal = Portal("rabbitry-io-stop")
    thread = portal.thread
    portal.stop()
    assert not thread.is_alive()
    assert portal.loop.is_closed()
    portal.stop()  # idempotent
    with pytest.raises(InvalidStateError):
        portal.submit(print)

    async def noop() -> None:
        return None

    with pytest.raises(InvalidStateError):
        portal.call(noop, wait=1)


def test_stop_cancels_pending_tasks() -> None:
    portal = Portal("rabbitry-io-stop-pending")
    cancelled = threading.Event()
    started = threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    portal.submit(lambda: portal.loop.create_task(forever()))
    assert started.wait(WAIT)
    portal.stop()
    assert cancelled.is_set()
    assert not portal.thread.is_alive()


def test_many_portals_do_not_leak_threads() -> None:
    before = threading.active_count()
    for i in range(20):
        Portal(f"rabbitry-io-many-{i}").stop()
    assert threading.active_count() == before


# ============================================================================ Dispatcher


class Reading:
    """pause_reading / resume_reading recorders (called on the IO thread)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def pause(self) -> None:
        self.events.append(("pause", threading.current_thread().name))

    def resume(self) -> None:
        self.events.append(("resume", threading.current_thread().name))

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.events if k == kind)


@pytest.fixture
def reading() -> Reading:
    return Reading()


@pytest.fixture
def dispatcher(portal: Portal, reading: Reading) -> Iterator[Dispatcher]:
    d = Dispatcher(portal, "rabbitry-callbacks-test", 4, reading.pause, reading.resume)
    try:
        yield d
    finally:
        d.stop()
        assert not d.thread.is_alive()


def post_all(
    portal: Portal, dispatcher: Dispatcher, items: list[tuple[Callable[..., Any], tuple[Any, ...]]]
) -> None:
    """Post every item from the IO thread, in one go (as the engine does)."""

    def run() -> None:
        for fn, args in items:
            dispatcher.post(fn, *args)

    on_io_thread(portal, run)


def test_callbacks_run_on_the_dispatcher_thread_in_order(
    portal: Portal, dispatcher: Dispatcher
) -> None:
    seen: list[tuple[int, threading.Thread]] = []
    done = threading.Event()

    def record(i: int) -> None:
        seen.append((i, threading.current_thread()))
        if i == 2:
            done.set()

    post_all(portal, dispatcher, [(record, (i,)) for i in range(3)])
    assert done.wait(WAIT)
    assert [i for i, _ in seen] == [0, 1, 2]
    for _, thread in seen:
        assert thread is dispatcher.thread
        assert thread is not portal.thread
        assert thread is not threading.main_thread()
        assert thread is not threading.current_thread()
    assert dispatcher.thread.name == "rabbitry-callbacks-test"
    assert dispatcher.thread.daemon


def test_post_callback_runs_on_the_portals_dispatcher(portal: Portal, reading: Reading) -> None:
    ran: list[tuple[str, threading.Thread]] = []
    done = threading.Event()

    def record(text: str) -> None:
        ran.append((text, threading.current_thread()))
        done.set()

    # No dispatcher yet (the connection has not connected): the callback is dropped.
    on_io_thread(portal, lambda: portal.post_callback(record, "before"))
    dispatcher = Dispatcher(portal, "rabbitry-callbacks-post", 4, reading.pause, reading.resume)
    portal.dispatcher = dispatcher
    try:
        on_io_thread(portal, lambda: portal.post_callback(record, "after"))
        assert done.wait(WAIT)
        assert ran == [("after", dispatcher.thread)]
    finally:
        dispatcher.stop()


def test_full_queue_pauses_reading_once_and_resumes_after_drain(
    portal: Portal, dispatcher: Dispatcher, reading: Reading
) -> None:
    release = threading.Event()
    first_running = threading.Event()
    seen: list[int] = []
    total = 21

    def record(i: int) -> None:
        if i == 0:
            first_running.set()
            assert release.wait(WAIT)
        seen.append(i)

    # Item 0 occupies the worker; then 1-4 fill the queue (maxsize 4) and 5-20 overflow.
    post_all(portal, dispatcher, [(record, (0,))])
    assert first_running.wait(WAIT)
    post_all(portal, dispatcher, [(record, (i,)) for i in range(1, total)])
    assert reading.events == [("pause", "rabbitry-io-test")]
    time.sleep(0.1)
    assert reading.count("resume") == 0, "resumed while the worker was still blocked"

    release.set()
    assert wait_until(lambda: len(seen) == total)
    assert seen == list(range(total))
    assert wait_until(lambda: reading.count("resume") == 1)
    assert reading.count("pause") == 1
    assert reading.events[-1] == ("resume", "rabbitry-io-test")

    # Back to normal: posting again neither pauses nor resumes.
    more = threading.Event()
    post_all(portal, dispatcher, [(lambda: more.set(), ())])
    assert more.wait(WAIT)
    assert reading.count("pause") == 1
    assert reading.count("resume") == 1


def test_overflow_with_repeated_bursts_keeps_order(
    portal: Portal, dispatcher: Dispatcher, reading: Reading
) -> None:
    seen: list[int] = []
    total = 2000

    def record(i: int) -> None:
        if i % 100 == 0:
            time.sleep(0.002)  # let the IO thread get ahead now and then
        seen.append(i)

    for start in range(0, total, 250):
        post_all(portal, dispatcher, [(record, (i,)) for i in range(start, start + 250)])
    assert wait_until(lambda: len(seen) == total, timeout=30)
    assert seen == list(range(total))
    # Every pause was eventually followed by a resume.
    assert wait_until(lambda: reading.count("resume") == reading.count("pause"))
    assert reading.count("pause") >= 1
    kinds = [k for k, _ in reading.events]
    assert all(a != b for a, b in itertools.pairwise(kinds)), kinds


def test_a_raising_callback_is_logged_and_the_next_runs(
    portal: Portal, dispatcher: Dispatcher, caplog: pytest.LogCaptureFixture
) -> None:
    done = threading.Event()

    def boom() -> None:
        raise ValueError("callback exploded")

    with caplog.at_level(logging.ERROR, logger="rabbitry.sync"):
        post_all(portal, dispatcher, [(boom, ()), (done.set, ())])
        assert done.wait(WAIT)
    records = [r for r in caplog.records if r.name == "rabbitry.sync"]
    assert records, "the failing callback was not logged"
    assert records[0].exc_info is not None
    assert isinstance(records[0].exc_info[1], ValueError)
    assert dispatcher.thread.is_alive()


def test_stop_runs_queued_callbacks_then_joins(portal: Portal, reading: Reading) -> None:
    d = Dispatcher(portal, "rabbitry-callbacks-stop", 16, reading.pause, reading.resume)
    seen: list[int] = []

    def record(i: int) -> None:
        time.sleep(0.01)
        seen.append(i)

    post_all(portal, d, [(record, (i,)) for i in range(10)])
    d.stop(timeout=WAIT)
    assert not d.thread.is_alive()
    assert seen == list(range(10))
    d.stop(timeout=0.1)  # a second stop returns (the worker is gone)


def test_stop_is_bounded_when_a_callback_blocks(portal: Portal, reading: Reading) -> None:
    d = Dispatcher(portal, "rabbitry-callbacks-blocked", 4, reading.pause, reading.resume)
    release = threading.Event()
    running = threading.Event()

    def block() -> None:
        running.set()
        release.wait(WAIT)

    post_all(portal, d, [(block, ())])
    assert running.wait(WAIT)
    assert_returns(lambda: d.stop(timeout=0.3))
    release.set()
    d.thread.join(WAIT)
    assert not d.thread.is_alive()


def test_stop_with_a_full_queue_still_ends_the_worker(portal: Portal, reading: Reading) -> None:
    # Regression: stop() used to give up queuing its sentinel into a full queue, and the
    # worker then waited in queue.get() forever once the blocking callback returned.
    d = Dispatcher(portal, "rabbitry-callbacks-full", 4, reading.pause, reading.resume)
    release = threading.Event()
    running = threading.Event()
    seen: list[int] = []

    def block() -> None:
        running.set()
        release.wait(WAIT)

    try:
        post_all(portal, d, [(block, ())])
        assert running.wait(WAIT)
        # Exactly maxsize more: the queue is full, nothing overflows, reading not paused.
        post_all(portal, d, [(seen.append, (i,)) for i in range(4)])
        assert reading.events == []
        assert_returns(lambda: d.stop(timeout=0.3))
        release.set()
        assert wait_until(lambda: seen == [0, 1, 2, 3])
        d.thread.join(2.0)
        assert not d.thread.is_alive(), "the dispatcher thread outlived stop()"
    finally:
        release.set()
        if d.thread.is_alive():  # pragma: no cover - unstick a leaked worker
            d._queue.put(Dispatcher._STOP)
            d.thread.join(WAIT)


@pytest.mark.parametrize("wait", [None, WAIT])
def test_call_propagates_a_timeout_raised_by_the_coroutine_unchanged(
    portal: Portal, wait: float | None
) -> None:
    # Regression: on 3.11+ concurrent.futures.TimeoutError is the builtin TimeoutError,
    # so the coroutine's own Timeout used to be replaced by "no result within None s".
    original = rabbitry.Timeout("queue.declare got no answer within 1 s")

    async def times_out() -> None:
        raise original

    with pytest.raises(rabbitry.Timeout) as info:
        portal.call(times_out, wait=wait)
    assert info.value is original, f"got {info.value!r} instead of {original!r}"
