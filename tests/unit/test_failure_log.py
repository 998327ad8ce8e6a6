"""The rate-limited ERROR log (``rabbitry._support.failure_log.RateLimitedLog``): a bounded
number of records per interval whatever the rate of events, and the counts of the rest."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from rabbitry._support.failure_log import RateLimitedLog

if TYPE_CHECKING:
    import pytest


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.ratelimit"]


def test_a_burst_in_full_then_a_notice_then_one_summary_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = RateLimitedLog(
        logging.getLogger("test.ratelimit"), "thing 'x'", "failures", burst=2, clock=clock
    )
    with caplog.at_level(logging.ERROR, logger="test.ratelimit"):
        results = [log.log("dropped" if i % 3 else "parked", "event %d", i) for i in range(1000)]
        assert results[:2] == [True, True] and not any(results[2:])
        assert len(messages(caplog)) == 3  # two events and the notice
        clock.now = 60.0
        assert log.log("dropped", "event %d", 1000)  # a new interval: in full again
    assert messages(caplog) == [
        "event 0",
        "event 1",
        "thing 'x': 2 failures within 60 s; further ones in this interval are counted and "
        "summarised (without traceback)",
        "thing 'x': 998 more failures (without traceback): 665 dropped, 333 parked",
        "event 1000",
    ]
    assert (log.total, log.detailed, log.summarised) == (1001, 3, 998)
    assert log.counts == {"dropped": 667, "parked": 334}


def test_the_full_records_carry_the_traceback_and_point_at_the_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = RateLimitedLog(logging.getLogger("test.ratelimit"), "s", "errors", burst=1)
    try:
        raise ValueError("boom")
    except ValueError as exc:
        with caplog.at_level(logging.ERROR, logger="test.ratelimit"):
            log.log("failed", "failed: %s", exc, exc_info=exc)
    record = caplog.records[0]
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert record.funcName == "test_the_full_records_carry_the_traceback_and_point_at_the_caller"


async def test_on_an_event_loop_the_summary_comes_when_the_interval_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = RateLimitedLog(
        logging.getLogger("test.ratelimit"), "s", "errors", burst=1, interval=0.05, clock=Clock()
    )
    with caplog.at_level(logging.ERROR, logger="test.ratelimit"):
        for _ in range(4):
            log.log("dropped", "one")
        for _ in range(400):
            if log.summarised:
                break
            await asyncio.sleep(0.05)
    assert messages(caplog)[-1] == "s: 3 more errors (without traceback): 3 dropped"
    log.close()


async def test_events_from_other_threads_are_summarised_by_the_loop_given(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    log = RateLimitedLog(
        logging.getLogger("test.ratelimit"),
        "s",
        "errors",
        burst=1,
        interval=0.05,
        loop=loop,
        clock=Clock(),  # no interval ends while the threads log: one summary, by the timer
    )

    def worker() -> None:
        for _ in range(100):
            log.log("dropped", "one")

    with caplog.at_level(logging.ERROR, logger="test.ratelimit"):
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            await asyncio.to_thread(thread.join)
        for _ in range(400):
            if log.summarised == 399:
                break
            await asyncio.sleep(0.05)
    assert log.total == 400 and log.detailed == 1 and log.summarised == 399
    assert messages(caplog)[-1].endswith("399 more errors (without traceback): 399 dropped")


def test_close_logs_what_was_only_counted(caplog: pytest.LogCaptureFixture) -> None:
    log = RateLimitedLog(logging.getLogger("test.ratelimit"), "s", "errors", burst=1)
    with caplog.at_level(logging.ERROR, logger="test.ratelimit"):
        for _ in range(3):
            log.log("dropped", "one")
        log.close()
        log.close()
    assert messages(caplog)[-1] == "s: 2 more errors (without traceback): 2 dropped"
