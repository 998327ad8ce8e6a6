"""No silent loss on a handler failure: checked setups, refused handlers, ERROR logs.

* ``start()`` refuses (``ConfigurationError``) when the retry topology a ``retry=``
  policy needs is missing, for one delay (broker-driven) and for several, and when the
  queue's recorded dead-letter exchange does not exist.
* The sync consumer refuses coroutine functions (they would be acked unprocessed).
* Every handler failure is logged at ERROR with its traceback and the action taken,
  rate-limited per consumer with a summary count.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING

import pytest

from rabbitry import AsyncConnection, Connection, Message, Properties
from rabbitry.consumer import AsyncConsumer
from rabbitry.exceptions import ConfigurationError
from rabbitry.topology import Exchange, Queue, RetryPolicy, Topology

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(120)

WAIT = 20.0


async def eventually(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def publish(conn: AsyncConnection, queue: str, *bodies: bytes) -> None:
    ch = await conn.channel()
    await ch.confirm_select()
    futures = [
        await ch.basic_publish("", queue, body, properties=Properties(message_id=body.decode()))
        for body in bodies
    ]
    await asyncio.wait_for(asyncio.gather(*[f for f in futures if f is not None]), WAIT)
    await ch.close()


def failure_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "rabbitry.consumer" and "handler failed" in r.getMessage()
    ]


async def failing(message: Message) -> None:
    raise RuntimeError(f"cannot handle {message.body!r}")


# --------------------------------------------------------------------------- start checks


@pytest.mark.parametrize("delays", [(10.0,), (1.0, 5.0)], ids=["one-delay", "two-delays"])
async def test_start_refuses_a_retry_policy_whose_topology_was_never_declared(
    conn: AsyncConnection, names: Names, delays: tuple[float, ...]
) -> None:
    queue = names.queue()
    ch = await conn.channel()
    await ch.queue_declare(queue)
    policy = RetryPolicy(delays)
    consumer = conn.consumer(queue, failing, retry=policy)
    with pytest.raises(ConfigurationError) as caught:
        await consumer.start(timeout=WAIT)
    text = str(caught.value)
    retry_names = policy.names(queue)
    for missing in (retry_names.dlx, *retry_names.retry_queues, retry_names.parking_lot):
        assert repr(missing) in text
    assert "Topology.with_retry" in text
    assert not consumer.is_running
    # Nothing was consumed: the message published now stays ready.
    await publish(conn, queue, b"kept")
    assert (await ch.queue_declare(queue, passive=True)).message_count == 1


async def test_start_refuses_a_recorded_dead_letter_exchange_that_does_not_exist(
    conn: AsyncConnection, names: Names
) -> None:
    queue, dlx = names.queue(), names.exchange("dlx")
    await Topology([Exchange(dlx, "fanout")], [Queue(queue, dead_letter_exchange=dlx)]).aapply(conn)
    ch = await conn.channel()
    await ch.exchange_delete(dlx)  # deleted behind the topology's back
    consumer = conn.consumer(queue, failing)
    with pytest.raises(ConfigurationError, match=f"dead-letter exchange '{dlx}' does not exist"):
        await consumer.start(timeout=WAIT)


def test_sync_consumer_refuses_coroutine_function_handlers(url: str, names: Names) -> None:
    async def handler(message: Message) -> None:
        pass

    class AsyncCallable:
        async def __call__(self, message: Message) -> None:
            pass

    async def two(message: Message, extra: int) -> None:
        pass

    with Connection(url) as conn:
        for bad in (handler, AsyncCallable(), functools.partial(two, extra=1)):
            with pytest.raises(ConfigurationError, match="coroutine function"):
                conn.consumer("any-queue", bad)  # type: ignore[arg-type]
        plain = conn.consumer("any-queue", lambda message: None)
        assert not plain.is_running


async def test_async_consumer_refuses_a_handler_that_is_not_callable(
    conn: AsyncConnection,
) -> None:
    with pytest.raises(ConfigurationError, match="handler: must be callable"):
        AsyncConsumer(conn, "any-queue", "not a function")  # type: ignore[arg-type]
    with pytest.raises(
        ConfigurationError, match=r"retry: must be a rabbitry\.topology\.RetryPolicy"
    ):
        conn.consumer("any-queue", failing, retry=(1, 5))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- what is logged


async def run_until_failed(consumer: AsyncConsumer, count: int) -> None:
    await consumer.start(timeout=WAIT)
    try:
        await eventually(lambda: consumer.stats.failed >= count)
    finally:
        await consumer.stop(timeout=WAIT)


async def test_failure_on_a_queue_without_dead_letter_exchange_logs_dropped_with_traceback(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    await Topology(queues=[Queue(queue)]).aapply(conn)
    await publish(conn, queue, b"m1")
    consumer = conn.consumer(queue, failing)
    with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
        await run_until_failed(consumer, 1)
    (record,) = failure_records(caplog)
    assert record.levelno == logging.ERROR
    assert "dropped: the queue has no dead-letter exchange" in record.getMessage()
    assert "cannot handle b'm1'" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    assert "in failing" in caplog.text  # the handler's own frame is in the traceback
    assert consumer.stats.dropped == 1


async def test_failure_on_a_queue_with_a_dead_letter_exchange_logs_where_it_went(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue, dlx, dead = names.queue(), names.exchange("dlx"), names.queue("dead")
    await Topology(
        [Exchange(dlx, "fanout")],
        [Queue(queue, dead_letter_exchange=dlx), Queue(dead)],
    ).aapply(conn)
    ch = await conn.channel()
    await ch.queue_bind(dead, dlx)
    await publish(conn, queue, b"m1")
    consumer = conn.consumer(queue, failing)
    with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
        await run_until_failed(consumer, 1)
    (record,) = failure_records(caplog)
    assert f"dead-lettered to exchange '{dlx}'" in record.getMessage()
    assert record.exc_info is not None


async def test_failure_with_a_one_delay_retry_policy_logs_the_retry_queue_and_delay(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue("work")
    policy = RetryPolicy([10.0], queue=queue)
    retry_names = policy.names(queue)
    names.track_exchange(retry_names.dlx)
    for extra in (*retry_names.retry_queues, retry_names.parking_lot):
        assert extra is not None
        names.track_queue(extra)
    await Topology(queues=[Queue(queue)]).with_retry(queue, policy).aapply(conn)
    await publish(conn, queue, b"m1")
    consumer = conn.consumer(queue, failing, retry=policy)
    with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
        await run_until_failed(consumer, 1)
    (record,) = failure_records(caplog)
    assert f"retry in 10 s via {queue}.retry.10s" in record.getMessage()
    assert record.exc_info is not None
    assert consumer.stats.retried == 1
    ch = await conn.channel()
    assert (await ch.queue_declare(f"{queue}.retry.10s", passive=True)).message_count == 1


async def test_failure_logging_is_rate_limited_with_a_summary_count(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    await Topology(queues=[Queue(queue)]).aapply(conn)
    bodies = [b"m%d" % i for i in range(13)]
    await publish(conn, queue, *bodies)
    consumer = conn.consumer(queue, failing)
    with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
        await run_until_failed(consumer, len(bodies))
    detailed = failure_records(caplog)
    assert len(detailed) == 10
    assert all(r.exc_info is not None for r in detailed)
    summaries = [
        r.getMessage() for r in caplog.records if "more handler failures" in r.getMessage()
    ]
    assert summaries == [
        f"consumer {queue!r}: 3 more handler failures (without traceback): 3 dropped"
    ]


def test_sync_consumer_failure_is_logged_at_error_with_the_action(
    url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()

    def handler(message: Message) -> None:
        raise ValueError("bad payload")

    with Connection(url) as conn:
        Topology(queues=[Queue(queue)]).apply(conn)
        ch = conn.channel()
        ch.basic_publish("", queue, b"m1")
        with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
            consumer = conn.consumer(queue, handler)
            consumer.start(timeout=WAIT)
            deadline = time.monotonic() + WAIT
            while consumer.stats.failed < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            consumer.stop(timeout=WAIT)
    (record,) = failure_records(caplog)
    assert "dropped: the queue has no dead-letter exchange" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is ValueError
