"""rabbitry._support.waiters.Waiters: a FIFO of asyncio futures with a cancellation-safe hand-off.

Every test drives the event loop step by step (``_yield_to_loop``); the races are made
by cancelling a task and handing it an item within one loop pass, before it resumes.
"""

from __future__ import annotations

import asyncio

import pytest

from rabbitry._support.waiters import Waiters

pytestmark = pytest.mark.timeout(30)


async def _yield_to_loop(passes: int = 3) -> None:
    """Let every ready callback run, a few loop passes over."""
    for _ in range(passes):
        await asyncio.sleep(0)


async def _waiting(waiters: Waiters[str], count: int) -> list[asyncio.Task[str]]:
    tasks = [asyncio.create_task(waiters.wait()) for _ in range(count)]
    await _yield_to_loop()
    assert len(waiters) == count
    return tasks


async def test_items_are_handed_oldest_first() -> None:
    waiters: Waiters[str] = Waiters()
    assert not waiters and len(waiters) == 0
    assert waiters.hand("nobody") is False
    first, second, third = await _waiting(waiters, 3)
    assert waiters.hand("a") is True
    assert len(waiters) == 2
    assert waiters.hand("b") is True
    assert waiters.hand("c") is True
    assert not waiters
    assert [await first, await second, await third] == ["a", "b", "c"]


async def test_a_cancelled_wait_leaves_the_queue_at_once() -> None:
    waiters: Waiters[str] = Waiters()
    first, second = await _waiting(waiters, 2)
    first.cancel()
    assert len(waiters) == 1  # before the cancelled task has run again
    assert waiters.hand("x") is True
    assert await second == "x"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not waiters


async def test_a_timed_out_wait_leaves_the_queue() -> None:
    waiters: Waiters[str] = Waiters()

    async def wait_briefly() -> str:
        async with asyncio.timeout(0):
            return await waiters.wait()

    with pytest.raises(TimeoutError):
        await wait_briefly()
    assert not waiters
    assert waiters.hand("x") is False


async def test_an_item_handed_to_a_waiter_cancelled_in_the_same_pass_goes_to_the_next() -> None:
    unclaimed: list[str] = []
    waiters: Waiters[str] = Waiters(unclaimed.append)
    first, second = await _waiting(waiters, 2)
    assert waiters.hand("slot") is True  # first's future is done...
    first.cancel()  # ...and its task is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 5) == "slot"
    assert unclaimed == []
    assert not waiters


async def test_an_item_nobody_else_waits_for_goes_back_to_its_owner() -> None:
    unclaimed: list[str] = []
    waiters: Waiters[str] = Waiters(unclaimed.append)
    (only,) = await _waiting(waiters, 1)
    waiters.hand("slot")
    only.cancel()
    with pytest.raises(asyncio.CancelledError):
        await only
    assert unclaimed == ["slot"]
    assert not waiters


async def test_a_passed_on_item_skips_waiters_cancelled_meanwhile() -> None:
    unclaimed: list[str] = []
    waiters: Waiters[str] = Waiters(unclaimed.append)
    first, second, third = await _waiting(waiters, 3)
    waiters.hand("slot")
    first.cancel()
    second.cancel()
    assert len(waiters) == 1
    for task in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await asyncio.wait_for(third, 5) == "slot"
    assert unclaimed == []


async def test_a_notifying_queue_passes_nothing_on() -> None:
    waiters: Waiters[None] = Waiters()
    woken = [asyncio.create_task(waiters.wait()) for _ in range(2)]
    await _yield_to_loop()
    waiters.wake_all(None)
    woken[0].cancel()  # woken and cancelled in the same pass
    later = asyncio.create_task(waiters.wait())
    await _yield_to_loop()
    with pytest.raises(asyncio.CancelledError):
        await woken[0]
    assert await woken[1] is None
    assert not later.done()  # the cancelled waiter's news did not go to a newcomer
    assert len(waiters) == 1
    waiters.wake_all(None)
    assert await later is None


async def test_wake_all_wakes_every_waiting_task_and_empties_the_queue() -> None:
    waiters: Waiters[str] = Waiters()
    tasks = await _waiting(waiters, 3)
    tasks[1].cancel()
    waiters.wake_all("news")
    assert not waiters
    assert await tasks[0] == "news" and await tasks[2] == "news"
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]


async def test_fail_all_gives_each_task_its_own_copy_with_the_cause() -> None:
    unclaimed: list[str] = []
    waiters: Waiters[str] = Waiters(unclaimed.append)
    tasks = await _waiting(waiters, 2)
    cause = ConnectionResetError("gone")
    error = RuntimeError("closed")
    error.__cause__ = cause
    waiters.fail_all(error)
    assert not waiters
    raised = []
    for task in tasks:
        with pytest.raises(RuntimeError, match="closed") as info:
            await task
        raised.append(info.value)
    assert raised[0] is not raised[1] and error not in raised
    assert all(exc.__cause__ is cause for exc in raised)
    assert unclaimed == []  # a failed waiter had nothing to pass on


async def test_a_failed_waiter_cancelled_in_the_same_pass_passes_nothing_on() -> None:
    unclaimed: list[str] = []
    waiters: Waiters[str] = Waiters(unclaimed.append)
    first, second = await _waiting(waiters, 2)
    waiters.fail_all(RuntimeError("closed"))
    first.cancel()
    later = asyncio.create_task(waiters.wait())
    await _yield_to_loop()
    with pytest.raises(asyncio.CancelledError):
        await first
    with pytest.raises(RuntimeError):
        await second
    assert not later.done() and unclaimed == []
    waiters.hand("x")
    assert await later == "x"


async def test_sized_waiters_say_what_they_wait_for_oldest_first() -> None:
    waiters: Waiters[tuple[int, int]] = Waiters(lambda grant: None)
    assert waiters.next_need() is None
    big = asyncio.create_task(waiters.wait((3, 300)))
    small = asyncio.create_task(waiters.wait((1, 10)))
    await _yield_to_loop()
    assert waiters.next_need() == (3, 300)
    big.cancel()
    assert waiters.next_need() == (1, 10)  # the cancelled one left the head at once
    assert waiters.hand((1, 10)) is True
    assert await small == (1, 10)
    assert waiters.next_need() is None


async def test_a_sized_grant_to_a_cancelled_waiter_goes_back_to_its_owner() -> None:
    returned: list[tuple[int, int]] = []
    waiters: Waiters[tuple[int, int]] = Waiters(returned.append)
    first = asyncio.create_task(waiters.wait((3, 300)))
    second = asyncio.create_task(waiters.wait((1, 10)))
    await _yield_to_loop()
    waiters.hand((3, 300))
    first.cancel()  # same pass: the grant was measured for the first waiter alone
    with pytest.raises(asyncio.CancelledError):
        await first
    assert returned == [(3, 300)]
    assert len(waiters) == 1 and waiters.next_need() == (1, 10)
    second.cancel()
