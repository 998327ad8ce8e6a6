"""ConfirmFuture: the light future of sync publishes behaves as a concurrent future."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from rabbitry.exceptions import Nacked
from rabbitry.sync._portal import ConfirmFuture


def test_is_a_concurrent_future_and_settles_like_one() -> None:
    f: ConfirmFuture[None] = ConfirmFuture()
    assert isinstance(f, concurrent.futures.Future)
    assert not f.done() and not f.running() and not f.cancelled()
    f.set_result(None)
    assert f.done() and f.result() is None and f.exception() is None
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(None)
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_exception(Nacked(1))


def test_exception_is_raised_by_result_and_returned_by_exception() -> None:
    f: ConfirmFuture[None] = ConfirmFuture()
    f.set_exception(Nacked(7))
    assert isinstance(f.exception(), Nacked)
    with pytest.raises(Nacked):
        f.result()


def test_timeouts() -> None:
    f: ConfirmFuture[None] = ConfirmFuture()
    with pytest.raises(TimeoutError):
        f.result(0)
    with pytest.raises(TimeoutError):
        f.exception(0.01)


def test_cancel_and_done_callbacks() -> None:
    f: ConfirmFuture[int] = ConfirmFuture()
    seen: list[concurrent.futures.Future[int]] = []
    f.add_done_callback(seen.append)
    assert f.cancel()
    assert f.cancelled() and f.done() and seen == [f]
    with pytest.raises(concurrent.futures.CancelledError):
        f.result()
    with pytest.raises(concurrent.futures.CancelledError):
        f.exception()
    g: ConfirmFuture[int] = ConfirmFuture()
    g.add_done_callback(seen.append)
    g.set_result(3)
    assert seen == [f, g]
    late: list[concurrent.futures.Future[int]] = []
    g.add_done_callback(late.append)  # already done: called at once
    assert late == [g]


def test_a_blocked_thread_is_woken_by_the_settle_of_its_future_only() -> None:
    mine: ConfirmFuture[str] = ConfirmFuture()
    other: ConfirmFuture[str] = ConfirmFuture()
    results: list[str] = []

    def wait() -> None:
        results.append(mine.result(10))

    thread = threading.Thread(target=wait)
    thread.start()
    other.set_result("other")  # a notify for another future must not end the wait
    thread.join(0.05)
    assert thread.is_alive() and results == []
    mine.set_result("mine")
    thread.join(10)
    assert results == ["mine"]


def test_many_threads_many_futures() -> None:
    futures: list[ConfirmFuture[int]] = [ConfirmFuture() for _ in range(200)]
    got: list[int] = []
    lock = threading.Lock()

    def wait(f: ConfirmFuture[int]) -> None:
        value = f.result(10)
        with lock:
            got.append(value)

    threads = [threading.Thread(target=wait, args=(f,)) for f in futures[::10]]
    for t in threads:
        t.start()
    for i, f in enumerate(futures):
        f.set_result(i)
    for t in threads:
        t.join(10)
    assert sorted(got) == list(range(0, 200, 10))


def test_works_with_wait_and_as_completed() -> None:
    futures: list[ConfirmFuture[int]] = [ConfirmFuture() for _ in range(5)]

    def settle() -> None:
        for i, f in enumerate(futures):
            f.set_result(i)

    timer = threading.Timer(0.02, settle)
    timer.start()
    done, not_done = concurrent.futures.wait(futures, timeout=10)
    assert len(done) == 5 and not not_done
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, 10)) == [
        0,
        1,
        2,
        3,
        4,
    ]
    first: ConfirmFuture[int] = ConfirmFuture()
    second: ConfirmFuture[int] = ConfirmFuture()
    second.set_exception(Nacked(2))
    done, _ = concurrent.futures.wait(
        [first, second], timeout=10, return_when=concurrent.futures.FIRST_EXCEPTION
    )
    assert done == {second}
    timer.join()
