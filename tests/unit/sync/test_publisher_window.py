"""Window: the sync Publisher's window of unconfirmed messages."""

from __future__ import annotations

import threading

from rabbitry.sync._window import Window


def test_acquire_until_full_then_timeout_or_nonblocking_refusal() -> None:
    w = Window(2)
    assert w.acquire() and w.acquire(True, 0)
    assert not w.acquire(False)
    assert not w.acquire(True, 0.01)
    w.release()
    assert w.acquire(True, 0)


def test_take_grabs_what_is_free_without_waiting() -> None:
    w = Window(5)
    assert w.take(0) == 0
    assert w.take(3) == 3
    assert w.take(10) == 2
    assert w.take(1) == 0
    w.release(4)
    assert w.take(10) == 4


def test_release_wakes_as_many_waiters_as_slots() -> None:
    w = Window(0)
    got: list[bool] = []
    lock = threading.Lock()

    def wait() -> None:
        ok = w.acquire(True, 10)
        with lock:
            got.append(ok)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    w.release(2)
    for t in threads[:2]:
        t.join(0.05)
    w.release(1)
    for t in threads:
        t.join(10)
    assert got == [True, True, True]
    assert not w.acquire(False)
