"""Closing a connection settles everything that was pending on it, at once.

Threads publish, consume and call while another thread closes the connection; every
future must settle and every thread must come back with an error naming the close. No
timing is asserted: deadlines on events are generous and only catch a hang.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import uuid

import pytest

import rabbitry
from rabbitry.exceptions import AMQPError, ConnectionClosedByClient, InvalidStateError

ROUNDS = 20
HANG = 30.0  # seconds; only a hang gets near it


def _queue_name() -> str:
    return f"rabbitry-close-{uuid.uuid4().hex[:8]}"


def _names_the_close(exc: BaseException) -> bool:
    """The error is the close itself, or is caused by it (PublishOutcomeUnknown...)."""
    return isinstance(exc, ConnectionClosedByClient) or isinstance(
        exc.__cause__, ConnectionClosedByClient
    )


def _delete(url: str, queue: str) -> None:
    with rabbitry.Connection(url) as conn:
        conn.channel().queue_delete(queue)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_close_from_another_thread_settles_every_publish(url: str, round_: int) -> None:
    queue = _queue_name()
    conn = rabbitry.Connection(url)
    conn.connect()
    conn.channel().queue_declare(queue, auto_delete=False)
    publisher = conn.publisher(max_in_flight=100)
    futures: list[concurrent.futures.Future[None]] = []
    started = threading.Event()
    outcome: list[BaseException | None] = []

    def produce() -> None:
        try:
            while True:
                futures.append(publisher.publish(b"x" * 512, routing_key=queue))
                if len(futures) == 50:
                    started.set()
        except BaseException as exc:  # the close reaches this thread as an error
            outcome.append(exc)
        finally:
            started.set()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        assert started.wait(HANG)
        conn.close()
        producer.join(HANG)
        assert not producer.is_alive(), "the producing thread is still blocked in publish()"
        assert outcome and isinstance(outcome[0], AMQPError), outcome
        assert _names_the_close(outcome[0]), repr(outcome[0])
        _done, not_done = concurrent.futures.wait(futures, timeout=HANG)
        assert not not_done, f"{len(not_done)} of {len(futures)} futures never settled"
        for future in futures:
            exc = future.exception()
            assert exc is None or _names_the_close(exc), repr(exc)
        assert publisher.is_closed
        with pytest.raises(InvalidStateError):
            publisher.publish(b"late", routing_key=queue)
    finally:
        conn.close()
        _delete(url, queue)


def _fill(url: str, queue: str, count: int) -> None:
    with rabbitry.Connection(url) as conn:
        conn.channel().queue_declare(queue)
        publisher = conn.publisher()
        outcomes = publisher.publish_batch([b"m%d" % i for i in range(count)], routing_key=queue)
        assert outcomes == [None] * count


@pytest.mark.parametrize("round_", range(5))
def test_no_consumer_callback_starts_after_close_returns(url: str, round_: int) -> None:
    queue = _queue_name()
    _fill(url, queue, 300)
    conn = rabbitry.Connection(url)
    conn.connect()
    closed = threading.Event()
    started_after_close: list[int] = []
    ack_errors: list[BaseException] = []
    first = threading.Event()

    def callback(message: rabbitry.Message) -> None:
        if closed.is_set():
            started_after_close.append(message.delivery_tag)
        first.set()
        time.sleep(0.002)  # slower than the broker: deliveries queue up behind it
        try:
            message.ack()
        except AMQPError as exc:  # only the callback running during close() gets here
            ack_errors.append(exc)

    try:
        channel = conn.channel()
        channel.basic_qos(300)
        channel.basic_consume(queue, callback)
        assert first.wait(HANG)
        conn.close()
        closed.set()
        assert started_after_close == []
        assert len(ack_errors) <= 1
    finally:
        conn.close()
        _delete(url, queue)


async def test_no_coroutine_callback_starts_after_async_close_returns(url: str) -> None:
    queue = _queue_name()
    _fill(url, queue, 300)
    closed = False
    started_after_close = 0
    first = asyncio.Event()

    async def callback(message: rabbitry.Message) -> None:
        nonlocal started_after_close
        if closed:
            started_after_close += 1
        first.set()
        await asyncio.sleep(0.002)

    conn = rabbitry.AsyncConnection(url)
    await conn.connect()
    try:
        channel = await conn.channel()
        await channel.basic_consume(queue, callback, no_ack=True)
        await asyncio.wait_for(first.wait(), HANG)
        await conn.close()
        closed = True
        for _ in range(20):  # let every task that could still run do so
            await asyncio.sleep(0)
        assert started_after_close == 0
    finally:
        await conn.close()
        await asyncio.to_thread(_delete, url, queue)
