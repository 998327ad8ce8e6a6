"""The handler-based consumer against a real broker.

Every path of ``conn.consumer(...)`` through the asyncio API, and the main ones through
the sync API: ack after the handler returns, auto ack (at-most-once), dead-lettering and
requeue without a retry policy, batches settled with one ``multiple=True`` ack (counted
on the wire through :class:`~tests.support.proxy.TcpProxy`), partial batch failure,
concurrency with correct acks, a broker cancel by queue deletion and the resubscribe,
dedup of a redelivered duplicate, graceful stop, and the consumer-timeout 406 on a
throw-away node. The retry tiers / parking lot / poison-message tests use
``rabbitry.topology`` (``Topology.with_retry`` + ``RetryPolicy``).

"Settled on the wire" means basic.ack / basic.nack / basic.reject method frames the
client sent, parsed from the upstream bytes of a proxy tap (:class:`WireLog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import re
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from tests.integration.test_memory_bounds import reading_paused
from tests.support.broker_ctl import rabbitmqctl
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import AsyncConnection, Connection, Message, Properties, RecoveryPolicy
from rabbitry.config import default_url, parse_urls
from rabbitry.consumer import (
    AsyncConsumer,
    MemoryDedupStore,
    Reject,
    Requeue,
    Retry,
)
from rabbitry.exceptions import ConfigurationError, InvalidStateError, NotFound
from rabbitry.topology import (
    ATTEMPTS_HEADER,
    EXCEPTION_MESSAGE_HEADER,
    EXCEPTION_TYPE_HEADER,
    FIRST_FAILURE_HEADER,
    LAST_FAILURE_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    PARKED_REASON_HEADER,
    Binding,
    Exchange,
    Queue,
    RetryPolicy,
    Topology,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

    from tests.integration.conftest import Names

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

#: Upper bound for something that should happen (never a timing assertion).
WAIT = 10.0


# =========================================================================== helpers


async def eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


async def publish(
    conn: AsyncConnection,
    routing_key: str,
    *bodies: bytes,
    exchange: str = "",
    properties: Properties | None = None,
    ids: bool = False,
) -> None:
    """Publish with confirms and wait for all of them. ``ids``: message_id = body."""
    ch = await conn.channel()
    await ch.confirm_select()
    futures = []
    for body in bodies:
        props = properties
        if ids:
            props = Properties(message_id=body.decode())
        future = await ch.basic_publish(exchange, routing_key, body, properties=props)
        assert future is not None
        futures.append(future)
    await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    await ch.close()


async def ready(conn: AsyncConnection, queue: str) -> int:
    ch = await conn.channel()
    try:
        return (await ch.queue_declare(queue, passive=True)).message_count
    finally:
        await ch.close()


async def wait_ready(conn: AsyncConnection, queue: str, expected: int) -> None:
    """Passive-declare until ``queue`` holds ``expected`` ready messages (counts lag)."""
    seen: list[int] = []
    deadline = time.monotonic() + WAIT
    while True:
        seen.append(await ready(conn, queue))
        if seen[-1] == expected or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    assert seen[-1] == expected, f"{queue}: {seen[-1]} ready, expected {expected}"


async def take_all(conn: AsyncConnection, queue: str, within: float = 1.0) -> list[Message]:
    """Consume (and ack) whatever ``queue`` offers within ``within`` seconds of quiet.

    A fresh consumer that gets every remaining message at once proves none of them was
    held unacknowledged by anybody else.
    """
    ch = await conn.channel()
    got: list[Message] = []
    async for message in ch.consume(queue, prefetch=1000, timeout=within):
        got.append(message)
        message.ack()
    await ch.close()
    return got


async def get_all(conn: AsyncConnection, queue: str) -> list[Message]:
    """basic.get (no ack) until the queue is empty."""
    ch = await conn.channel()
    got: list[Message] = []
    while (message := await ch.basic_get(queue, no_ack=True)) is not None:
        got.append(message)
    await ch.close()
    return got


async def declare_with_dlq(conn: AsyncConnection, names: Names) -> tuple[str, str]:
    """A queue that dead-letters (default exchange) into a second queue."""
    queue, dlq = names.queue("work"), names.queue("dlq")
    ch = await conn.channel()
    await ch.queue_declare(dlq)
    await ch.queue_declare(
        queue,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
    )
    await ch.close()
    return queue, dlq


async def declare(conn: AsyncConnection, names: Names, suffix: str = "q") -> str:
    queue = names.queue(suffix)
    ch = await conn.channel()
    await ch.queue_declare(queue)
    await ch.close()
    return queue


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


@dataclass
class Settle:
    """One basic.ack / basic.nack / basic.reject the client sent."""

    method: str
    channel: int
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass
class Event:
    """A method frame that passed the proxy, in the order the proxy forwarded them."""

    direction: str
    method: str
    channel: int
    delivery_tag: int = 0


class WireLog:
    """A proxy tap that parses the frames of one client connection, both ways.

    ``settles``: every basic.ack (60,80), basic.reject (60,90) and basic.nack (60,120)
    the client sent, with the multiple / requeue bits. ``events``: those plus the
    client's basic.publish (60,40) and the broker's basic.deliver (60,60) and basic.ack
    (publisher confirms), in one sequence (the proxy forwards both directions on one
    thread, so the order is the order they passed it).
    """

    _PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

    def __init__(self) -> None:
        self._buffers = {"upstream": b"", "downstream": b""}
        self._header_seen = False
        self._lock = threading.Lock()
        self.settles: list[Settle] = []
        self.events: list[Event] = []

    def __call__(self, direction: str, data: bytes) -> None:
        with self._lock:
            self._buffers[direction] += data
            self._parse(direction)

    def _parse(self, direction: str) -> None:
        buffer = self._buffers[direction]
        if direction == "upstream" and not self._header_seen:
            if len(buffer) < 8:
                return
            assert buffer.startswith(self._PROTOCOL_HEADER), buffer[:8]
            buffer = buffer[8:]
            self._header_seen = True
        while len(buffer) >= 7:
            frame_type, channel, size = struct.unpack_from(">BHI", buffer)
            if len(buffer) < 8 + size:
                break
            payload = buffer[7 : 7 + size]
            assert buffer[7 + size] == 0xCE, "frame end octet"
            buffer = buffer[8 + size :]
            if frame_type == 1:
                self._method(direction, channel, payload)
        self._buffers[direction] = buffer

    def _method(self, direction: str, channel: int, payload: bytes) -> None:
        class_id, method_id = struct.unpack_from(">HH", payload)
        if class_id != 60:
            return
        if direction == "downstream":
            if method_id == 80:  # a publisher confirm
                (tag,) = struct.unpack_from(">Q", payload, 4)
                self.events.append(Event(direction, "confirm", channel, tag))
            elif method_id == 60:  # basic.deliver: consumer-tag shortstr, then the tag
                offset = 5 + payload[4]
                (tag,) = struct.unpack_from(">Q", payload, offset)
                self.events.append(Event(direction, "deliver", channel, tag))
            return
        if method_id == 40:
            self.events.append(Event(direction, "publish", channel))
            return
        if method_id not in (80, 90, 120):
            return
        (tag,) = struct.unpack_from(">Q", payload, 4)
        bits = payload[12]
        if method_id == 80:
            settle = Settle("ack", channel, tag, bool(bits & 1), False)
        elif method_id == 90:
            settle = Settle("reject", channel, tag, False, bool(bits & 1))
        else:
            settle = Settle("nack", channel, tag, bool(bits & 1), bool(bits & 2))
        self.settles.append(settle)
        self.events.append(Event(direction, settle.method, channel, tag))

    def of(self, method: str) -> list[Settle]:
        with self._lock:
            return [s for s in self.settles if s.method == method]

    def all(self) -> list[Settle]:
        with self._lock:
            return list(self.settles)

    def sequence(self) -> list[Event]:
        with self._lock:
            return list(self.events)

    def acked(self) -> list[int]:
        """The delivery tags the client's acks settled, in order, as the broker counts
        them: a multiple ack settles every delivered and not yet settled tag up to its
        own, a single ack its own tag (listed twice if acked twice). Contiguous acks
        that the channel merged into one multiple ack (ack coalescing) therefore read
        the same as separate ones; an ack covering a message still in a handler would
        show up early, and the handler's own ack then closes the channel (406)."""
        with self._lock:
            events = list(self.events)
            settles = iter(list(self.settles))
        delivered: dict[int, list[int]] = {}
        settled: dict[int, set[int]] = {}
        out: list[int] = []
        for event in events:
            if event.direction == "downstream" and event.method == "deliver":
                delivered.setdefault(event.channel, []).append(event.delivery_tag)
                continue
            if event.direction != "upstream" or event.method not in ("ack", "nack", "reject"):
                continue
            settle = next(settles)
            done = settled.setdefault(settle.channel, set())
            if settle.multiple:
                tags = [
                    t
                    for t in delivered.get(settle.channel, [])
                    if t <= settle.delivery_tag and t not in done
                ]
            else:
                tags = [settle.delivery_tag]
            done.update(tags)
            if settle.method == "ack":
                out.extend(tags)
        return out


@pytest.fixture
def broker(url: str) -> tuple[str, int]:
    params = parse_urls(url)[0]
    return params.host, params.port


@pytest.fixture
def proxy(broker: tuple[str, int]) -> Iterator[TcpProxy]:
    p = TcpProxy(*broker).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def wire(proxy: TcpProxy) -> WireLog:
    log = WireLog()
    proxy.tap(log)
    return log


@pytest.fixture
async def tapped(proxy: TcpProxy, wire: WireLog) -> AsyncIterator[AsyncConnection]:
    """A connection through the tapping proxy (the only one, so one byte stream)."""
    connection = AsyncConnection(proxy.url(), connection_timeout=5)
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close()
        assert not proxy.tap_errors


@contextlib.asynccontextmanager
async def running(consumer: AsyncConsumer) -> AsyncIterator[AsyncConsumer]:
    await consumer.start(timeout=WAIT)
    try:
        yield consumer
    finally:
        await consumer.stop(timeout=WAIT)


# =========================================================================== ack paths


async def test_handler_returns_then_each_message_is_acked(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(10))
    seen: list[Message] = []

    async def handler(message: Message) -> None:
        seen.append(message)

    async with running(tapped.consumer(queue, handler)) as consumer:
        assert consumer.is_running and consumer.consumer_tag
        assert await eventually(lambda: len(wire.acked()) == 10)
        assert consumer.stats.acked == 10
        assert consumer.stats.delivered == 10
    assert [m.body for m in seen] == bodies(10)
    assert not any(m.redelivered for m in seen)
    assert {s.method for s in wire.all()} == {"ack"}
    assert wire.acked() == list(range(1, 11))
    assert await ready(conn, queue) == 0
    assert await take_all(conn, queue, within=0.3) == []
    assert not consumer.is_running


async def test_message_ack_inside_an_async_handler_is_not_sent_twice(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(5))
    handled: list[int] = []

    async def handler(message: Message) -> None:
        message.ack()
        handled.append(message.delivery_tag)

    async with running(tapped.consumer(queue, handler)) as consumer:
        assert await eventually(lambda: len(handled) == 5)
        first_channel = consumer.channel
        await asyncio.sleep(0.2)  # a second ack, if any, would be on the wire by now
        assert consumer.channel is first_channel and first_channel is not None
        assert first_channel.is_open, "a double ack closes the channel with 406"
    assert wire.acked() == [1, 2, 3, 4, 5]
    assert consumer.stats.resubscribed == 0
    assert await ready(conn, queue) == 0


async def test_auto_ack_sends_no_acks_and_a_failure_loses_the_message(
    conn: AsyncConnection,
    tapped: AsyncConnection,
    wire: WireLog,
    names: Names,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ack="auto" is at-most-once: the broker forgets a message when it sends it."""
    queue = await declare(conn, names)
    await publish(conn, queue, b"ok", b"boom", b"ok2")
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.body)
        if message.body == b"boom":
            raise RuntimeError("handler failed")

    with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
        async with running(tapped.consumer(queue, handler, ack="auto")) as consumer:
            assert consumer.ack_mode == "auto"
            assert await eventually(lambda: len(seen) == 3)
    assert seen == [b"ok", b"boom", b"ok2"]
    assert consumer.stats.failed == 1
    assert consumer.stats.acked == 0
    assert wire.all() == [], "auto ack must not send any ack/nack/reject"
    assert await ready(conn, queue) == 0, "the failed message is gone (at-most-once)"
    assert any("auto-acked" in r.getMessage() for r in caplog.records)


async def test_exception_without_policy_dead_letters_once(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    """No hot loop: a failing message is nacked with requeue=False, never requeued."""
    queue, dlq = await declare_with_dlq(conn, names)
    await publish(conn, queue, b"poison", b"fine")
    calls: list[bytes] = []

    async def handler(message: Message) -> None:
        calls.append(message.body)
        if message.body == b"poison":
            raise ValueError("cannot handle")

    async with running(tapped.consumer(queue, handler)) as consumer:
        await wait_ready(conn, dlq, 1)
        assert await eventually(lambda: consumer.stats.acked == 1)
        await asyncio.sleep(0.3)
    assert calls == [b"poison", b"fine"], "delivered once, not requeued in a loop"
    assert consumer.stats.failed == 1
    assert [(s.method, s.delivery_tag, s.requeue) for s in wire.all()] == [
        ("nack", 1, False),
        ("ack", 2, False),
    ]
    dead = await get_all(conn, dlq)
    assert [m.body for m in dead] == [b"poison"]
    assert dead[0].headers["x-death"][0]["queue"] == queue
    assert await ready(conn, queue) == 0


async def test_reject_signal_without_policy_dead_letters(
    conn: AsyncConnection, names: Names
) -> None:
    queue, dlq = await declare_with_dlq(conn, names)
    await publish(conn, queue, b"bad")

    async def handler(message: Message) -> None:
        raise Reject("malformed")

    async with running(conn.consumer(queue, handler)) as consumer:
        await wait_ready(conn, dlq, 1)
    assert consumer.stats.failed == 1
    assert consumer.stats.acked == 0
    assert await ready(conn, queue) == 0


async def test_requeue_signal_redelivers_and_redelivered_is_visible(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, b"once-more")
    flags: list[bool] = []

    async def handler(message: Message) -> None:
        flags.append(message.redelivered)
        if len(flags) == 1:
            raise Requeue("not yet")

    async with running(conn.consumer(queue, handler)) as consumer:
        assert await eventually(lambda: consumer.stats.acked == 1)
    assert flags == [False, True]
    assert consumer.stats.requeued == 1
    assert await ready(conn, queue) == 0


async def test_sync_callable_handler_works_with_the_async_consumer(
    conn: AsyncConnection, names: Names
) -> None:
    # The handler's result is awaited only when it is awaitable.
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(3))
    seen: list[bytes] = []

    def plain(message: Message) -> None:
        seen.append(message.body)

    consumer = conn.consumer(queue, plain)  # type: ignore[arg-type]
    async with running(consumer):
        assert await eventually(lambda: consumer.stats.acked == 3)
    assert seen == bodies(3)


# =========================================================================== batches


async def test_batch_success_is_one_multiple_ack_on_the_wire(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(50))
    batches: list[list[bytes]] = []

    async def handler(batch: list[Message]) -> None:
        assert isinstance(batch, list)
        batches.append([m.body for m in batch])

    consumer = tapped.consumer(queue, handler, batch_size=10, batch_timeout=5.0)
    async with running(consumer):
        assert await eventually(lambda: consumer.stats.acked == 50)
        await asyncio.sleep(0.2)
    assert [len(b) for b in batches] == [10] * 5
    assert [m for b in batches for m in b] == bodies(50)
    settles = wire.all()
    assert [(s.method, s.delivery_tag, s.multiple) for s in settles] == [
        ("ack", tag, True) for tag in (10, 20, 30, 40, 50)
    ], settles
    assert await ready(conn, queue) == 0
    assert await take_all(conn, queue, within=0.3) == []


async def test_batch_timeout_hands_over_a_partial_batch(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(3))
    batches: list[tuple[float, int]] = []

    async def handler(batch: list[Message]) -> None:
        batches.append((time.monotonic(), len(batch)))

    consumer = conn.consumer(queue, handler, batch_size=10, batch_timeout=0.3)
    started = time.monotonic()
    async with running(consumer):
        assert await eventually(lambda: consumer.stats.acked == 3)
    assert [size for _, size in batches] == [3]
    assert batches[0][0] - started >= 0.25, "waited for the batch to fill first"
    assert await ready(conn, queue) == 0


async def test_partial_batch_failure_only_the_failed_take_the_failure_path(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue, dlq = await declare_with_dlq(conn, names)
    await publish(conn, queue, *bodies(10))

    async def handler(batch: list[Message]) -> list[Message]:
        return [m for m in batch if m.body in (b"m3", b"m7")]

    consumer = tapped.consumer(queue, handler, batch_size=10, batch_timeout=5.0)
    async with running(consumer):
        await wait_ready(conn, dlq, 2)
        assert await eventually(lambda: consumer.stats.acked == 8)
        await asyncio.sleep(0.2)
    assert consumer.stats.failed == 2
    assert sorted(m.body for m in await get_all(conn, dlq)) == [b"m3", b"m7"]
    settles = wire.all()
    nacks = [s for s in settles if s.method == "nack"]
    acks = [s for s in settles if s.method == "ack"]
    assert sorted(s.delivery_tag for s in nacks) == [4, 8]
    assert all(not s.requeue and not s.multiple for s in nacks)
    assert [(s.delivery_tag, s.multiple) for s in acks] == [(10, True)], settles
    assert await ready(conn, queue) == 0


async def test_partial_batch_failure_with_exceptions_per_message(
    conn: AsyncConnection, names: Names
) -> None:
    queue, dlq = await declare_with_dlq(conn, names)
    await publish(conn, queue, *bodies(4))

    async def handler(batch: list[Message]) -> list[tuple[Message, BaseException]]:
        return [(batch[0], Reject("bad")), (batch[1], Requeue("later"))]

    requeued: list[bytes] = []
    consumer = conn.consumer(queue, handler, batch_size=4, batch_timeout=5.0)
    await consumer.start()
    try:
        await wait_ready(conn, dlq, 1)
        assert await eventually(lambda: consumer.stats.requeued >= 1)
    finally:
        await consumer.stop()
    assert [m.body for m in await get_all(conn, dlq)] == [b"m0"]
    requeued = [m.body for m in await take_all(conn, queue, within=0.3)]
    assert b"m1" in requeued
    assert b"m2" not in requeued and b"m3" not in requeued


async def test_batch_handler_exception_fails_the_whole_batch(
    conn: AsyncConnection, names: Names
) -> None:
    queue, dlq = await declare_with_dlq(conn, names)
    await publish(conn, queue, *bodies(5))

    async def handler(batch: list[Message]) -> None:
        raise RuntimeError("database down")

    consumer = conn.consumer(queue, handler, batch_size=5, batch_timeout=5.0)
    async with running(consumer):
        await wait_ready(conn, dlq, 5)
    assert consumer.stats.failed == 5
    assert consumer.stats.acked == 0
    assert await ready(conn, queue) == 0


async def test_batch_with_concurrency_acks_each_message(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    """With several batches in flight a multiple ack could cover another batch's
    messages, so no ack may settle a message before its own batch is done (the
    channel's ack coalescing only merges acks when every earlier tag is settled)."""
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(40))

    async def handler(batch: list[Message]) -> None:
        await asyncio.sleep(random.uniform(0, 0.05))

    consumer = tapped.consumer(queue, handler, batch_size=10, concurrency=2)
    async with running(consumer):
        assert await eventually(lambda: consumer.stats.acked == 40)
        await asyncio.sleep(0.2)
    # Each message acked once, none ahead of its batch: a multiple ack covering another
    # batch's messages would list them early here and close the channel (406) when that
    # batch acks them itself (resubscribed > 0).
    assert sorted(wire.acked()) == list(range(1, 41))
    assert consumer.stats.resubscribed == 0
    assert await ready(conn, queue) == 0


async def test_batches_run_one_at_a_time_with_concurrency_one(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue, dlq = await declare_with_dlq(conn, names)
    await publish(conn, queue, *bodies(30))
    running_now = 0
    most = 0

    async def handler(batch: list[Message]) -> list[Message]:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        try:
            # The first batch is the slowest; it reports its first message as failed.
            await asyncio.sleep(0.5 if batch[0].body == b"m0" else 0.05)
        finally:
            running_now -= 1
        return [batch[0]] if batch[0].body == b"m0" else []

    consumer = conn.consumer(queue, handler, batch_size=10, batch_timeout=5.0)
    with caplog.at_level(logging.WARNING, logger="rabbitry.consumer"):
        async with running(consumer):
            assert await eventually(lambda: consumer.stats.delivered >= 30)
            await asyncio.sleep(1.5)
    assert most == 1, f"{most} batches ran at once with concurrency=1"
    assert consumer.stats.resubscribed == 0
    assert not [r for r in caplog.records if "unknown delivery tag" in r.getMessage()]
    assert [m.body for m in await get_all(conn, dlq)] == [b"m0"]


async def test_invalid_batch_result_does_not_leave_the_batch_unsettled(
    conn: AsyncConnection, names: Names
) -> None:
    queue, _dlq = await declare_with_dlq(conn, names)
    await publish(conn, queue, *bodies(5))
    seen: list[Message] = []

    async def handler(batch: list[Message]) -> str:
        seen.extend(batch)
        return "not a list of messages"

    consumer = conn.consumer(queue, handler, batch_size=5, batch_timeout=5.0)
    async with running(consumer):
        assert await eventually(lambda: len(seen) == 5)
        settled = await eventually(lambda: all(m.settled for m in seen), timeout=2.0)
    assert settled, "the batch is still unacknowledged while the consumer runs"


async def test_dedup_applies_to_batches(conn: AsyncConnection, names: Names) -> None:
    queue = await declare(conn, names)
    store = MemoryDedupStore()
    store.add("dup")
    await publish(conn, queue, b"dup", b"new", ids=True)
    handed: list[bytes] = []

    async def handler(batch: list[Message]) -> None:
        handed.extend(m.body for m in batch)

    consumer = conn.consumer(queue, handler, batch_size=2, batch_timeout=0.2, dedup=store)
    async with running(consumer):
        # acked counts every ack sent, the duplicate's included (as in the other tests)
        assert await eventually(lambda: consumer.stats.acked == 2)
    assert handed == [b"new"]
    assert consumer.stats.deduplicated == 1


# =========================================================================== concurrency


async def test_concurrency_runs_n_handlers_at_once_with_correct_acks(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(40))
    now = 0
    most = 0
    done: list[bytes] = []

    async def handler(message: Message) -> None:
        nonlocal now, most
        now += 1
        most = max(most, now)
        try:
            await asyncio.sleep(random.uniform(0.01, 0.06))  # finish out of order
        finally:
            now -= 1
        done.append(message.body)

    # prefetch=1 is raised to the concurrency: with 1, only one handler could run.
    consumer = tapped.consumer(queue, handler, prefetch=1, concurrency=4)
    assert consumer.prefetch == 4
    async with running(consumer):
        assert await eventually(lambda: consumer.stats.acked == 40)
        channel = consumer.channel
        await asyncio.sleep(0.2)
        assert channel is not None and channel.is_open
    assert most == 4
    assert sorted(done) == sorted(bodies(40))
    assert done != bodies(40), "handlers finished in delivery order: no overlap shown"
    assert sorted(wire.acked()) == list(range(1, 41))
    assert consumer.stats.resubscribed == 0
    assert await take_all(conn, queue, within=0.3) == []


async def test_concurrency_never_exceeds_prefetch_window(
    conn: AsyncConnection, names: Names
) -> None:
    """Fewer messages in flight than handlers: no handler waits on a missing delivery."""
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(3))
    release = asyncio.Event()
    started: list[bytes] = []

    async def handler(message: Message) -> None:
        started.append(message.body)
        await release.wait()

    async with running(conn.consumer(queue, handler, concurrency=8)) as consumer:
        assert await eventually(lambda: len(started) == 3)
        release.set()
        assert await eventually(lambda: consumer.stats.acked == 3)


# =========================================================================== cancel


async def test_queue_deletion_calls_on_cancel_and_resubscribes_when_the_queue_returns(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)
    cancelled: list[str] = []
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.body)

    consumer = conn.consumer(queue, handler, on_cancel=cancelled.append)
    async with running(consumer):
        tag = consumer.consumer_tag
        await publish(conn, queue, b"before")
        assert await eventually(lambda: seen == [b"before"])
        ch = await conn.channel()
        await ch.queue_delete(queue)
        assert await eventually(lambda: cancelled == [tag])
        await ch.queue_declare(queue)  # the application (not a record) brings it back
        await ch.close()
        assert await eventually(lambda: consumer.stats.resubscribed == 1)
        assert consumer.consumer_tag != tag
        await publish(conn, queue, b"after")
        assert await eventually(lambda: seen == [b"before", b"after"])
        assert consumer.is_running
    assert await ready(conn, queue) == 0


async def test_queue_deletion_without_a_record_retries_with_backoff_and_stop_returns(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = await declare(conn, names)
    cancelled: list[str] = []

    async def on_cancel(tag: str) -> None:  # an async callback is awaited in the background
        cancelled.append(tag)

    async def handler(message: Message) -> None:
        return None

    consumer = conn.consumer(queue, handler, on_cancel=on_cancel)
    with caplog.at_level(logging.WARNING, logger="rabbitry.consumer"):
        await consumer.start()
        ch = await conn.channel()
        await ch.queue_delete(queue)
        await ch.close()
        assert await eventually(lambda: len(cancelled) == 1)

        def attempts() -> list[logging.LogRecord]:
            return [r for r in caplog.records if "resubscribe attempt" in r.getMessage()]

        assert await eventually(lambda: len(attempts()) >= 3)
        first = attempts()[:3]
        assert all("NotFound" in r.getMessage() for r in first)
        # Backoff 0.1, 0.5, 1.0, 2.0 s ...: the attempts slow down, not a hot loop (the
        # gaps are at least the delays slept in between; a busy machine only adds).
        gaps = [b.created - a.created for a, b in itertools.pairwise(first)]
        assert gaps[0] >= 0.45 and gaps[1] >= 0.95, gaps
        assert consumer.stats.resubscribed == 0
        assert conn.is_open, "failed resubscribes must not take the connection down"
        await asyncio.wait_for(consumer.stop(), WAIT)
        at_stop = len(attempts())
    assert not consumer.is_running
    await asyncio.sleep(0.6)  # no attempt after stop()
    assert len(attempts()) == at_stop


async def test_resubscribe_false_stays_cancelled(conn: AsyncConnection, names: Names) -> None:
    queue = await declare(conn, names)
    cancelled: list[str] = []

    async def handler(message: Message) -> None:
        return None

    consumer = conn.consumer(queue, handler, on_cancel=cancelled.append, resubscribe=False)
    async with running(consumer):
        ch = await conn.channel()
        await ch.queue_delete(queue)
        assert await eventually(lambda: len(cancelled) == 1)
        await ch.queue_declare(queue)
        await ch.close()
        await asyncio.sleep(0.5)
        assert consumer.stats.resubscribed == 0
        await publish(conn, queue, b"nobody-listens")
        await asyncio.sleep(0.2)
        assert await ready(conn, queue) == 1


async def test_failing_on_cancel_callback_does_not_stop_the_resubscribe(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)

    def on_cancel(tag: str) -> None:
        raise RuntimeError("callback bug")

    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.body)

    async with running(conn.consumer(queue, handler, on_cancel=on_cancel)) as consumer:
        ch = await conn.channel()
        await ch.queue_delete(queue)
        await asyncio.sleep(0.05)
        await ch.queue_declare(queue)
        await ch.close()
        assert await eventually(lambda: consumer.stats.resubscribed == 1)
        await publish(conn, queue, b"x")
        assert await eventually(lambda: seen == [b"x"])


# =========================================================================== dedup


async def test_dedup_acks_a_redelivered_duplicate_without_the_handler(
    conn: AsyncConnection, proxy: TcpProxy, names: Names
) -> None:
    """The handler processed a message but its ack never reached the broker (the
    connection died first): the redelivery is recognised by message_id and acked."""
    queue = await declare(conn, names)
    store = MemoryDedupStore()
    await publish(conn, queue, b"order-1", ids=True)
    first_calls: list[Message] = []

    async def cut_before_ack(message: Message) -> None:
        first_calls.append(message)
        proxy.drop("upstream")  # the ack that follows is lost on the way

    lossy = AsyncConnection(proxy.url(), connection_timeout=5)
    await lossy.connect()
    first = lossy.consumer(queue, cut_before_ack, dedup=store)
    await first.start()
    try:
        assert await eventually(lambda: len(first_calls) == 1)
        assert store.seen("order-1")
    finally:
        proxy.reset()  # the broker sees the connection die: the message is requeued
        proxy.heal()
        await first.stop(timeout=2)
        with contextlib.suppress(rabbitry.AMQPError):
            await lossy.close(timeout=2)
    await wait_ready(conn, queue, 1)

    second_calls: list[Message] = []

    async def handler(message: Message) -> None:
        second_calls.append(message)

    async with running(conn.consumer(queue, handler, dedup=store)) as second:
        assert await eventually(lambda: second.stats.deduplicated == 1)
        await publish(conn, queue, b"order-2", ids=True)
        assert await eventually(lambda: second.stats.acked == 2)
    assert [m.body for m in second_calls] == [b"order-2"]
    assert await ready(conn, queue) == 0


async def test_dedup_with_a_custom_store_and_messages_without_id(
    conn: AsyncConnection, names: Names
) -> None:
    class SetStore:
        def __init__(self) -> None:
            self.keys: set[str] = set()
            self.lookups: list[str] = []

        def seen(self, key: str) -> bool:
            self.lookups.append(key)
            return key in self.keys

        def add(self, key: str) -> None:
            self.keys.add(key)

    queue = await declare(conn, names)
    store = SetStore()
    await publish(conn, queue, b"a", b"a", b"b", ids=True)
    await publish(conn, queue, b"no-id", b"no-id")  # no message_id: never deduplicated
    handled: list[bytes] = []

    async def handler(message: Message) -> None:
        handled.append(message.body)

    async with running(conn.consumer(queue, handler, dedup=store)) as consumer:
        assert await eventually(lambda: consumer.stats.acked == 5)
    assert handled == [b"a", b"b", b"no-id", b"no-id"]
    assert consumer.stats.deduplicated == 1
    assert store.keys == {"a", "b"}
    assert store.lookups == ["a", "a", "b"]
    assert await ready(conn, queue) == 0


async def test_a_failed_message_is_not_remembered_by_dedup(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)
    store = MemoryDedupStore()
    await publish(conn, queue, b"flaky", ids=True)
    calls = 0

    async def handler(message: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise Requeue("try again")

    async with running(conn.consumer(queue, handler, dedup=store)) as consumer:
        assert await eventually(lambda: consumer.stats.acked == 1)
    assert calls == 2
    assert consumer.stats.deduplicated == 0


# =========================================================================== stop


async def test_graceful_stop_finishes_in_flight_and_releases_the_prefetched(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(20))
    release = asyncio.Event()
    started: list[bytes] = []
    finished: list[bytes] = []

    async def handler(message: Message) -> None:
        started.append(message.body)
        await release.wait()
        finished.append(message.body)

    consumer = tapped.consumer(queue, handler, prefetch=20, concurrency=2)
    await consumer.start()
    assert await eventually(lambda: len(started) == 2 and consumer.stats.delivered == 20)
    stopping = asyncio.ensure_future(consumer.stop(timeout=WAIT))
    # While both handlers are still running (channel open), the 18 prefetched but not
    # started messages are already back in the queue: released, not left to the close.
    await wait_ready(conn, queue, 18)
    assert not stopping.done()
    await publish(conn, queue, b"after-stop")  # basic.cancel went first: not delivered
    await wait_ready(conn, queue, 19)
    release.set()
    await asyncio.wait_for(stopping, WAIT)

    assert sorted(finished) == sorted(started) and len(finished) == 2
    assert consumer.stats.acked == 2
    assert consumer.stats.released == 18
    nacks = wire.of("nack")
    assert len(nacks) == 18 and all(n.requeue and not n.multiple for n in nacks)
    assert sorted(wire.acked()) == [1, 2], "in-flight handlers acked"
    remaining = await take_all(conn, queue, within=1.0)
    handled = set(finished)
    left = [m.body for m in remaining]
    assert handled.isdisjoint(left), "a handled message came back"
    assert sorted(handled | set(left)) == sorted([*bodies(20), b"after-stop"]), "lost some"
    assert not consumer.is_running
    await consumer.stop()  # idempotent


async def test_stop_without_drain_cancels_handlers_and_requeues(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, *bodies(3))
    started = asyncio.Event()
    cancelled: list[bytes] = []

    async def handler(message: Message) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(message.body)
            raise

    consumer = conn.consumer(queue, handler)
    await consumer.start()
    await asyncio.wait_for(started.wait(), WAIT)
    # The handler sleeps 60 s: only cancelling it lets stop() return within WAIT.
    await asyncio.wait_for(consumer.stop(drain=False, timeout=60), WAIT)
    assert cancelled == [b"m0"]
    assert consumer.stats.acked == 0
    assert sorted(m.body for m in await take_all(conn, queue)) == bodies(3)


async def test_stop_timeout_bounds_a_stuck_handler(conn: AsyncConnection, names: Names) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, b"stuck")
    started = asyncio.Event()

    async def handler(message: Message) -> None:
        started.set()
        await asyncio.sleep(60)

    consumer = conn.consumer(queue, handler)
    await consumer.start()
    await asyncio.wait_for(started.wait(), WAIT)
    # The handler sleeps 60 s: only the timeout lets stop() return within WAIT.
    await asyncio.wait_for(consumer.stop(timeout=0.5), WAIT)
    redelivered = await take_all(conn, queue)
    assert [m.body for m in redelivered] == [b"stuck"]
    assert redelivered[0].redelivered


async def test_context_manager_and_lifecycle_errors(conn: AsyncConnection, names: Names) -> None:
    queue = await declare(conn, names)
    await publish(conn, queue, b"x")
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.body)

    consumer = conn.consumer(queue, handler)
    async with consumer as entered:
        assert entered is consumer
        assert consumer.is_running
        assert "running" in repr(consumer)
        with pytest.raises(InvalidStateError):
            await consumer.start()
        assert await eventually(lambda: seen == [b"x"])
    assert not consumer.is_running
    assert consumer.channel is not None and consumer.channel.is_closed

    missing = conn.consumer(names.queue("missing"), handler)
    with pytest.raises(NotFound):
        await missing.start(timeout=WAIT)
    assert not missing.is_running
    assert conn.is_open


async def test_exclusive_consumer_and_arguments_reach_the_broker(
    url: str, conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)

    async def handler(message: Message) -> None:
        return None

    first = conn.consumer(queue, handler, exclusive=True, arguments={"x-priority": 5})
    async with running(first):
        # Only this queue's consumers: list_consumers asks every queue of the broker and
        # fails as a whole when another test deletes one of them meanwhile.
        expression = (
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)),'
            " [lists:nth(7, tuple_to_list(C)) || C <- rabbit_amqqueue:consumers(Q)]."
        )
        arguments = await asyncio.to_thread(rabbitmqctl, url, "eval", expression)
        # One consumer, whose arguments are exactly x-priority = 5 (a signed int).
        assert re.fullmatch(r'\[\[\{<<"x-priority">>,signedint,5\}\]\]\s*', arguments), arguments
        second = conn.consumer(queue, handler)
        with pytest.raises(rabbitry.AccessRefused):  # 403 "in exclusive use"
            await second.start(timeout=WAIT)


# =========================================================================== retry policy


def track_retry(names: Names, queue: str, policy: RetryPolicy) -> None:
    """Register what ``Topology.with_retry`` adds for ``queue`` for cleanup."""
    retry_names = policy.names(queue)
    names.track_exchange(retry_names.dlx)
    for name in retry_names.retry_queues:
        names.track_queue(name)
    if retry_names.parking_lot:
        names.track_queue(retry_names.parking_lot)


async def retry_topology(
    conn: AsyncConnection,
    names: Names,
    delays: tuple[float, ...] = (0.1, 0.3),
    max_attempts: int = 3,
    **options: Any,
) -> tuple[str, RetryPolicy]:
    """A work queue with its retry tiers and parking lot, applied through Topology."""
    queue = names.queue("work")
    policy = RetryPolicy(delays, max_attempts, queue=queue, **options)
    track_retry(names, queue, policy)
    await Topology(queues=[Queue(queue)]).with_retry(queue, policy).aapply(conn)
    return queue, policy


async def test_retry_through_the_tiers_into_the_parking_lot_with_headers(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue, policy = await retry_topology(conn, names, delays=(0.1, 0.3), max_attempts=3)
    assert not policy.broker_driven  # two tiers: the client republishes
    await publish(conn, queue, b"always-fails", properties=Properties(message_id="p-1"))
    calls: list[tuple[float, Message]] = []

    async def handler(message: Message) -> None:
        calls.append((time.monotonic(), message))
        raise ValueError(f"attempt {len(calls)} failed")

    consumer = tapped.consumer(queue, handler, retry=policy)
    async with running(consumer):
        await wait_ready(conn, policy.names().parking_lot or "", 1)
        assert await eventually(lambda: consumer.stats.parked == 1)
    assert len(calls) == 3, "max_attempts handler calls, no more"
    assert consumer.stats.retried == 2
    assert consumer.stats.failed == 3
    (t1, m1), (t2, m2), (t3, m3) = calls
    assert t2 - t1 >= 0.09, "first tier: 0.1 s"
    assert t3 - t2 >= 0.27, "second tier: 0.3 s"
    assert ATTEMPTS_HEADER not in m1.headers
    assert m2.headers[ATTEMPTS_HEADER] == 1
    assert m3.headers[ATTEMPTS_HEADER] == 2
    assert m2.properties.message_id == "p-1", "properties survive the republish"

    (parked,) = await get_all(conn, policy.names().parking_lot or "")
    headers = parked.headers
    assert parked.body == b"always-fails"
    assert parked.properties.message_id == "p-1"
    assert headers[ATTEMPTS_HEADER] == 3
    assert headers[PARKED_REASON_HEADER] == "max-attempts"
    assert headers[EXCEPTION_TYPE_HEADER] == "ValueError"
    assert headers[EXCEPTION_MESSAGE_HEADER] == "attempt 3 failed"
    assert headers[ORIGINAL_EXCHANGE_HEADER] == ""
    assert headers[ORIGINAL_ROUTING_KEY_HEADER] == queue
    assert headers[FIRST_FAILURE_HEADER] <= headers[LAST_FAILURE_HEADER]
    assert await ready(conn, queue) == 0

    # Every move was confirmed by the broker before the original was acked.
    events = wire.sequence()
    acks = [i for i, e in enumerate(events) if e.direction == "upstream" and e.method == "ack"]
    assert len(acks) == 3
    for i in acks:
        ack = events[i]
        publishes = [
            j
            for j, e in enumerate(events[:i])
            if e.method == "publish" and e.channel == ack.channel
        ]
        confirms = [
            j
            for j, e in enumerate(events[:i])
            if e.method == "confirm" and e.channel == ack.channel
        ]
        assert publishes and confirms, events
        assert publishes[-1] < confirms[-1] < i, "ack before the move was confirmed"
    assert not wire.of("nack") and not wire.of("reject")


async def test_retry_signal_then_success(conn: AsyncConnection, names: Names) -> None:
    queue, policy = await retry_topology(conn, names, delays=(0.1, 0.2), max_attempts=4)
    await publish(conn, queue, b"flaky")
    attempts: list[int] = []

    async def handler(message: Message) -> None:
        attempts.append(message.headers.get(ATTEMPTS_HEADER, 0))
        if len(attempts) < 3:
            raise Retry("not ready yet")

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        assert await eventually(lambda: consumer.stats.acked == 1)
    assert attempts == [0, 1, 2]
    assert consumer.stats.retried == 2
    assert consumer.stats.parked == 0
    assert await ready(conn, policy.names().parking_lot or "") == 0


async def test_broker_driven_single_delay_retry(conn: AsyncConnection, names: Names) -> None:
    """One delay: the failure is a nack(requeue=False); the broker's dead-lettering
    does the delay and the way back, and x-death counts the attempts."""
    queue, policy = await retry_topology(conn, names, delays=(0.1,), max_attempts=3)
    assert policy.broker_driven
    await publish(conn, queue, b"poison")
    calls = 0

    async def handler(message: Message) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("always")

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        await wait_ready(conn, policy.names().parking_lot or "", 1)
    assert calls == 3
    assert consumer.stats.retried == 2 and consumer.stats.parked == 1
    (parked,) = await get_all(conn, policy.names().parking_lot or "")
    assert parked.headers[ATTEMPTS_HEADER] == 3
    assert parked.headers[PARKED_REASON_HEADER] == "max-attempts"


async def test_poison_message_is_parked_and_the_others_keep_flowing(
    conn: AsyncConnection, names: Names
) -> None:
    queue, policy = await retry_topology(conn, names, delays=(0.1, 0.2), max_attempts=3)
    await publish(conn, queue, b"good-0", b"good-1", b"poison", *bodies(20, "good-x"))
    poison_calls = 0
    good: list[bytes] = []

    async def handler(message: Message) -> None:
        nonlocal poison_calls
        if message.body == b"poison":
            poison_calls += 1
            raise ValueError("cannot parse")
        good.append(message.body)
        await asyncio.sleep(0.01)

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        await wait_ready(conn, policy.names().parking_lot or "", 1)
        assert await eventually(lambda: len(good) == 22)
        # ... and it keeps consuming after the poison message was parked.
        await publish(conn, queue, b"later")
        assert await eventually(lambda: good[-1:] == [b"later"])
        assert consumer.is_running
    assert poison_calls == 3
    assert consumer.stats.parked == 1
    assert consumer.stats.acked == 23
    (parked,) = await get_all(conn, policy.names().parking_lot or "")
    assert parked.body == b"poison"
    assert parked.headers[ATTEMPTS_HEADER] == 3
    assert await ready(conn, queue) == 0


async def test_fatal_exception_type_is_parked_at_once(conn: AsyncConnection, names: Names) -> None:
    """The policy narrows what is retryable by exception type."""
    queue, policy = await retry_topology(conn, names, fatal=(KeyError,))
    await publish(conn, queue, b"missing-key", b"transient")
    calls: list[bytes] = []

    async def handler(message: Message) -> None:
        calls.append(message.body)
        if message.body == b"missing-key":
            raise KeyError("customer")
        if calls.count(b"transient") == 1:
            raise TimeoutError("db")

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        await wait_ready(conn, policy.names().parking_lot or "", 1)
        assert await eventually(lambda: consumer.stats.acked == 1)
    assert calls.count(b"missing-key") == 1
    assert calls.count(b"transient") == 2
    (parked,) = await get_all(conn, policy.names().parking_lot or "")
    assert parked.headers[PARKED_REASON_HEADER] == "not-retryable"
    assert parked.headers[EXCEPTION_TYPE_HEADER] == "KeyError"


async def test_reject_signal_with_a_policy_parks_without_retrying(
    conn: AsyncConnection, names: Names
) -> None:
    queue, policy = await retry_topology(conn, names)
    await publish(conn, queue, b"bad")
    calls = 0

    async def handler(message: Message) -> None:
        nonlocal calls
        calls += 1
        raise Reject("malformed payload")

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        await wait_ready(conn, policy.names().parking_lot or "", 1)
        await asyncio.sleep(0.5)
    assert calls == 1
    assert consumer.stats.retried == 0 and consumer.stats.parked == 1
    (parked,) = await get_all(conn, policy.names().parking_lot or "")
    assert parked.headers[PARKED_REASON_HEADER] == "not-retryable"


async def test_requeue_signal_with_a_policy_still_requeues(
    conn: AsyncConnection, names: Names
) -> None:
    queue, policy = await retry_topology(conn, names)
    await publish(conn, queue, b"x")
    flags: list[bool] = []

    async def handler(message: Message) -> None:
        flags.append(message.redelivered)
        if len(flags) == 1:
            raise Requeue("put it back")

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        assert await eventually(lambda: consumer.stats.acked == 1)
    assert flags == [False, True]
    assert consumer.stats.requeued == 1 and consumer.stats.retried == 0


async def test_retry_policy_without_queue_uses_the_consumed_queue(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue("work")
    policy = RetryPolicy((0.1,), 2)  # no queue=: the consumer knows its queue
    track_retry(names, queue, RetryPolicy((0.1,), 2, queue=queue))
    await Topology(queues=[Queue(queue)]).with_retry(queue, policy).aapply(conn)
    await publish(conn, queue, b"x")

    async def handler(message: Message) -> None:
        raise ValueError("fails")

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        assert await eventually(lambda: consumer.stats.parked == 1, timeout=3.0)


async def test_drop_after_max_attempts_without_parking_lot_is_not_counted_as_retry(
    conn: AsyncConnection, names: Names
) -> None:
    queue, policy = await retry_topology(
        conn, names, delays=(0.1,), max_attempts=2, parking_lot=False
    )
    await publish(conn, queue, b"x")
    calls = 0

    async def handler(message: Message) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("always")

    async with running(conn.consumer(queue, handler, retry=policy)) as consumer:
        assert await eventually(lambda: calls == 2)
        await asyncio.sleep(0.3)
    assert await ready(conn, queue) == 0
    assert consumer.stats.parked == 0
    assert consumer.stats.retried == 1, consumer.stats


async def test_batch_partial_failure_takes_only_the_failed_through_the_retry_path(
    conn: AsyncConnection, tapped: AsyncConnection, wire: WireLog, names: Names
) -> None:
    queue, policy = await retry_topology(conn, names, delays=(0.1, 0.2), max_attempts=3)
    await publish(conn, queue, *bodies(10))
    handled: list[bytes] = []
    failed_once: set[bytes] = set()

    async def handler(batch: list[Message]) -> list[Message]:
        failed = []
        for message in batch:
            if message.body in (b"m3", b"m8") and message.body not in failed_once:
                failed_once.add(message.body)
                failed.append(message)
            else:
                handled.append(message.body)
        return failed

    consumer = tapped.consumer(queue, handler, retry=policy, batch_size=10, batch_timeout=0.3)
    async with running(consumer):
        assert await eventually(lambda: consumer.stats.acked == 10)
    assert sorted(handled) == sorted(bodies(10))
    assert consumer.stats.retried == 2 and consumer.stats.parked == 0
    first_batch_acks = [s for s in wire.of("ack") if s.channel == wire.of("ack")[0].channel][:3]
    # The two moved messages are acked one by one after their confirms; then one
    # multiple ack settles the eight others of the batch.
    assert [(s.delivery_tag, s.multiple) for s in first_batch_acks] == [
        (4, False),
        (9, False),
        (10, True),
    ]
    assert await ready(conn, queue) == 0


async def _delete_elsewhere(queue: str) -> None:
    """Delete ``queue`` from another connection (a deletion this connection did not make,
    so its topology record still holds the queue)."""
    async with AsyncConnection(recovery=None) as other:
        channel = await other.channel()
        await channel.queue_delete(queue)


def _operator_deletes_queue(queue: str) -> None:
    rabbitmqctl(default_url(), "delete_queue", queue)  # the broker under test's CLI


async def test_queue_deletion_with_a_topology_record_redeclares_and_resumes(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    exchange = names.exchange()
    topology = Topology(
        exchanges=[Exchange(exchange, "direct")],
        queues=[Queue(queue)],
        bindings=[Binding(exchange, queue, "rk")],
    )
    await topology.aapply(conn)
    assert conn.topology_record.queue(queue) is not None
    cancelled: list[str] = []
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.body)

    async with running(conn.consumer(queue, handler, on_cancel=cancelled.append)) as consumer:
        await _delete_elsewhere(queue)
        assert await eventually(lambda: len(cancelled) == 1)
        assert await eventually(lambda: consumer.stats.resubscribed == 1)
        # The queue and its binding came back from the record: publish via the exchange.
        await publish(conn, "rk", b"after-redeclare", exchange=exchange)
        assert await eventually(lambda: seen == [b"after-redeclare"])
    assert await ready(conn, queue) == 0


async def test_server_named_queue_is_followed_after_redeclare(
    conn: AsyncConnection, names: Names
) -> None:
    exchange = names.exchange()
    anonymous = Queue("", durable=False, exclusive=True)
    topology = Topology(
        exchanges=[Exchange(exchange, "direct")],
        queues=[anonymous],
        bindings=[Binding(exchange, anonymous, "rk")],
    )
    await topology.aapply(conn)
    (recorded,) = [q for q in conn.topology_record.queues if q.server_named]
    first_name = recorded.name
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.body)

    async with running(conn.consumer(first_name, handler)) as consumer:
        # An operator deletes the exclusive queue (no other connection may).
        await asyncio.to_thread(_operator_deletes_queue, first_name)
        assert await eventually(lambda: consumer.stats.resubscribed == 1, timeout=3.0)
        await publish(conn, "rk", b"to-the-new-queue", exchange=exchange)
        assert await eventually(lambda: seen == [b"to-the-new-queue"], timeout=3.0)
        assert consumer.queue != first_name


def test_sync_retry_into_the_parking_lot(sync_conn: Connection, names: Names) -> None:
    queue = names.queue("work")
    policy = RetryPolicy((0.1, 0.2), 3, queue=queue)
    track_retry(names, queue, policy)
    Topology(queues=[Queue(queue)]).with_retry(queue, policy).apply(sync_conn, timeout=WAIT)
    sync_publish(sync_conn, queue, b"flaky", b"poison")
    calls: list[tuple[bytes, int, str]] = []

    def handler(message: Message) -> None:
        attempt = message.headers.get(ATTEMPTS_HEADER, 0)
        calls.append((message.body, attempt, threading.current_thread().name))
        if message.body == b"poison" or attempt == 0:
            raise ConnectionError("downstream unavailable")

    with sync_conn.consumer(queue, handler, retry=policy) as consumer:
        assert wait_until(lambda: consumer.stats.parked == 1 and consumer.stats.acked == 1)
    assert [(b, a) for b, a, _ in calls if b == b"flaky"] == [(b"flaky", 0), (b"flaky", 1)]
    assert [a for b, a, _ in calls if b == b"poison"] == [0, 1, 2]
    assert all(name.startswith("rabbitry-handler") for _, _, name in calls)
    assert consumer.stats.retried == 3
    assert sync_ready(sync_conn, policy.names().parking_lot or "") == 1
    assert sync_ready(sync_conn, queue) == 0


# =========================================================================== consumer timeout


@pytest.fixture(scope="module")
def short_timeout_node() -> Iterator[Any]:
    """A throw-away node (never the shared one) with a 1 s consumer_timeout.

    RabbitMQ 3.10 checks the timeout on the channel tick (``channel_tick_interval``,
    60 s by default); the tick is lowered to 0.5 s on this node so the 406 arrives
    within about 1.5 s. Both settings are read when a channel opens.
    """
    from tests.support.node import SCRIPTS_ENV, BrokerNode, find_scripts_dir

    if find_scripts_dir() is None:
        # As in tests/faults: a run that skipped this must not look green.
        pytest.fail(
            "The consumer-timeout test starts its own RabbitMQ node, but the unwrapped "
            "rabbitmq-server scripts were not found (/usr/lib/rabbitmq/bin, or set "
            f"${SCRIPTS_ENV}); deselect it explicitly with -m 'not faults'.",
            pytrace=False,
        )
    node = BrokerNode()
    try:
        node.start()
        node.eval(
            "application:set_env(rabbit, consumer_timeout, 1000), "
            "application:set_env(rabbit, channel_tick_interval, 500)"
        )
        yield node
    finally:
        node.stop()


@pytest.mark.faults
async def test_consumer_timeout_406_is_reported_and_the_consumer_resubscribes(
    short_timeout_node: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = f"consumer-timeout-{uuid.uuid4().hex[:8]}"
    release = asyncio.Event()
    calls: list[bool] = []

    async def handler(message: Message) -> None:
        calls.append(message.redelivered)
        if len(calls) == 1:
            await release.wait()  # far longer than the 1 s consumer_timeout

    async with AsyncConnection(short_timeout_node.url, connection_timeout=5) as node_conn:
        ch = await node_conn.channel()
        await ch.queue_declare(queue)
        await publish(node_conn, queue, b"slow")
        consumer = node_conn.consumer(queue, handler)
        with caplog.at_level(logging.INFO, logger="rabbitry.consumer"):
            await consumer.start(timeout=WAIT)
            first_channel = consumer.channel

            def reported() -> bool:
                return any(
                    r.levelno == logging.ERROR
                    and "consumer_timeout" in r.getMessage()
                    and "delivery acknowledgement" in r.getMessage()
                    for r in caplog.records
                )

            assert await eventually(reported, timeout=15)
            assert first_channel is not None and first_channel.is_closed
            assert isinstance(first_channel.close_exc, rabbitry.PreconditionFailed)
            assert await eventually(lambda: consumer.stats.resubscribed >= 1)
            release.set()  # the stale handler ends; its ack cannot go to the new channel
            assert await eventually(lambda: consumer.stats.acked == 1)
            assert consumer.channel is not first_channel and consumer.channel.is_open
            await consumer.stop(timeout=WAIT)
        assert calls == [False, True], "the redelivery was handled on the new subscription"
        ch = await node_conn.channel()
        assert (await ch.queue_delete(queue)).message_count == 0


# =========================================================================== sync API


def rabbitry_handler_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("rabbitry-handler")}


@pytest.fixture
def sync_conn(url: str) -> Iterator[Connection]:
    connection = Connection(url, connection_timeout=5)
    connection.connect(timeout=WAIT)
    try:
        yield connection
    finally:
        connection.close(timeout=5)


def sync_declare(conn: Connection, queue: str, arguments: dict[str, Any] | None = None) -> None:
    ch = conn.channel(timeout=WAIT)
    ch.queue_declare(queue, arguments=arguments, timeout=WAIT)
    ch.close(timeout=WAIT)


def sync_publish(conn: Connection, queue: str, *payloads: bytes, ids: bool = False) -> None:
    ch = conn.channel(timeout=WAIT)
    ch.confirm_select(timeout=WAIT)
    futures = [
        ch.basic_publish(
            "", queue, body, properties=Properties(message_id=body.decode()) if ids else None
        )
        for body in payloads
    ]
    for future in futures:
        assert future is not None
        future.result(WAIT)
    ch.close(timeout=WAIT)


def sync_ready(conn: Connection, queue: str) -> int:
    ch = conn.channel(timeout=WAIT)
    try:
        return ch.queue_declare(queue, passive=True, timeout=WAIT).message_count
    finally:
        ch.close(timeout=WAIT)


def test_sync_handler_runs_on_a_handler_thread_and_is_acked(
    sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    sync_declare(sync_conn, queue)
    sync_publish(sync_conn, queue, *bodies(10))
    threads: set[str] = set()
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        threads.add(threading.current_thread().name)
        time.sleep(0.001)  # blocking is fine here: not the IO thread
        seen.append(message.body)

    before = rabbitry_handler_threads()
    consumer = sync_conn.consumer(queue, handler)
    assert isinstance(consumer, rabbitry.sync.consumer.Consumer)
    with consumer:
        assert consumer.is_running and consumer.consumer_tag
        assert wait_until(lambda: consumer.stats.acked == 10)
    assert seen == bodies(10)
    assert len(threads) == 1
    (name,) = threads
    assert name.startswith("rabbitry-handler"), name
    assert name != sync_conn.io_thread_name
    assert sync_ready(sync_conn, queue) == 0
    assert not consumer.is_running
    assert wait_until(lambda: rabbitry_handler_threads() <= before), "handler threads leaked"


def test_sync_message_ack_in_the_handler_is_not_acked_twice(
    proxy: TcpProxy, wire: WireLog, sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    sync_declare(sync_conn, queue)
    sync_publish(sync_conn, queue, *bodies(6))
    tapped = Connection(proxy.url(), connection_timeout=5)
    tapped.connect(timeout=WAIT)
    try:
        acked_in_handler: list[int] = []

        def handler(message: Message) -> None:
            message.ack()
            assert message.settled
            acked_in_handler.append(message.delivery_tag)

        with tapped.consumer(queue, handler) as consumer:
            assert wait_until(lambda: len(acked_in_handler) == 6)
            # The handler's acks of a burst may leave as one multiple ack (coalescing).
            assert wait_until(lambda: len(wire.acked()) == 6)
            time.sleep(0.3)  # a second ack would have reached the wire by now
            assert consumer.stats.resubscribed == 0
    finally:
        tapped.close(timeout=5)
    assert wire.acked() == [1, 2, 3, 4, 5, 6]
    assert wire.of("nack") == [] and wire.of("reject") == []
    assert not proxy.tap_errors
    assert sync_ready(sync_conn, queue) == 0


def test_sync_failures_dead_letter_and_requeue_redelivers(
    sync_conn: Connection, names: Names
) -> None:
    queue, dlq = names.queue("work"), names.queue("dlq")
    sync_declare(sync_conn, dlq)
    sync_declare(sync_conn, queue, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    sync_publish(sync_conn, queue, b"reject", b"error", b"requeue", b"ok")
    seen: list[tuple[bytes, bool]] = []

    def handler(message: Message) -> None:
        seen.append((message.body, message.redelivered))
        if message.body == b"reject":
            raise Reject("no")
        if message.body == b"error":
            raise KeyError("bug")
        if message.body == b"requeue" and not message.redelivered:
            raise Requeue("later")

    with sync_conn.consumer(queue, handler) as consumer:
        assert wait_until(lambda: consumer.stats.acked == 2)
        assert wait_until(lambda: sync_ready(sync_conn, dlq) == 2)
    assert (b"requeue", True) in seen
    assert consumer.stats.failed == 3
    assert consumer.stats.requeued == 1
    assert sync_ready(sync_conn, queue) == 0


def test_sync_batch_with_partial_failure(sync_conn: Connection, names: Names) -> None:
    queue, dlq = names.queue("work"), names.queue("dlq")
    sync_declare(sync_conn, dlq)
    sync_declare(sync_conn, queue, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    sync_publish(sync_conn, queue, *bodies(20))
    batches: list[int] = []
    threads: set[str] = set()

    def handler(batch: list[Message]) -> list[Message]:
        threads.add(threading.current_thread().name)
        batches.append(len(batch))
        return [m for m in batch if m.body == b"m13"]

    with sync_conn.consumer(queue, handler, batch_size=10, batch_timeout=5.0) as consumer:
        assert wait_until(lambda: consumer.stats.acked == 19)
        assert wait_until(lambda: sync_ready(sync_conn, dlq) == 1)
    assert batches == [10, 10]
    assert all(name.startswith("rabbitry-handler") for name in threads)
    assert sync_ready(sync_conn, queue) == 0


def test_sync_concurrency_uses_n_threads(sync_conn: Connection, names: Names) -> None:
    queue = names.queue()
    sync_declare(sync_conn, queue)
    sync_publish(sync_conn, queue, *bodies(12))
    barrier = threading.Barrier(3, timeout=WAIT)
    threads: set[str] = set()

    def handler(message: Message) -> None:
        threads.add(threading.current_thread().name)
        barrier.wait()  # only passes when 3 handlers run at the same time

    with sync_conn.consumer(queue, handler, concurrency=3, prefetch=1) as consumer:
        assert wait_until(lambda: consumer.stats.acked == 12)
    assert len(threads) == 3
    assert sync_ready(sync_conn, queue) == 0


def test_sync_graceful_stop(sync_conn: Connection, names: Names) -> None:
    queue = names.queue()
    sync_declare(sync_conn, queue)
    sync_publish(sync_conn, queue, *bodies(10))
    started = threading.Event()
    finished: list[bytes] = []

    def handler(message: Message) -> None:
        started.set()
        time.sleep(0.5)
        finished.append(message.body)

    consumer = sync_conn.consumer(queue, handler)
    consumer.start(timeout=WAIT)
    assert started.wait(WAIT)
    consumer.stop(timeout=WAIT)
    assert finished == [b"m0"], "the in-flight handler finished before stop() returned"
    assert consumer.stats.acked == 1
    assert consumer.stats.released == 9
    assert sync_ready(sync_conn, queue) == 9
    assert not consumer.is_running


def test_sync_on_cancel_and_resubscribe(sync_conn: Connection, names: Names) -> None:
    queue = names.queue()
    sync_declare(sync_conn, queue)
    cancelled: list[tuple[str, str]] = []
    seen: list[bytes] = []

    def on_cancel(tag: str) -> None:
        cancelled.append((tag, threading.current_thread().name))

    def handler(message: Message) -> None:
        seen.append(message.body)

    with sync_conn.consumer(queue, handler, on_cancel=on_cancel) as consumer:
        tag = consumer.consumer_tag
        ch = sync_conn.channel(timeout=WAIT)
        ch.queue_delete(queue, timeout=WAIT)
        assert wait_until(lambda: len(cancelled) == 1)
        ch.queue_declare(queue, timeout=WAIT)
        ch.close(timeout=WAIT)
        assert wait_until(lambda: consumer.stats.resubscribed == 1)
        sync_publish(sync_conn, queue, b"again")
        assert wait_until(lambda: seen == [b"again"])
    assert cancelled[0][0] == tag
    assert cancelled[0][1] != sync_conn.io_thread_name, "user callbacks never on the IO thread"


def test_sync_dedup(sync_conn: Connection, names: Names) -> None:
    queue = names.queue()
    sync_declare(sync_conn, queue)
    store = MemoryDedupStore()
    sync_publish(sync_conn, queue, b"x", b"x", b"y", ids=True)
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.body)

    with sync_conn.consumer(queue, handler, dedup=store) as consumer:
        assert wait_until(lambda: consumer.stats.acked == 3)
    assert seen == [b"x", b"y"]
    assert consumer.stats.deduplicated == 1


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"ack": "sometimes"}, "ack"),
        ({"concurrency": 0}, "concurrency"),
        ({"prefetch": -1}, "prefetch"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 5, "batch_timeout": 0}, "batch_timeout"),
    ],
)
def test_sync_validation_names_the_field(
    sync_conn: Connection, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field}:"):
        sync_conn.consumer("q", print, **options)


def test_sync_consumer_needs_an_open_connection(url: str) -> None:
    with pytest.raises(InvalidStateError):
        Connection(url).consumer("q", print)


# ================================================== failed retry moves, resubscribe, recovery


#: Two retry delays: the client-republish path (confirmed + mandatory move).
UNROUTABLE_RETRY_DELAYS = (0.1, 0.2)


async def declare_with_unroutable_retries(conn: AsyncConnection, names: Names) -> str:
    """A queue holding "bad" then "good" whose retry exchange and retry queues exist with
    nothing bound (``start()`` checks that they exist): every retry move of a failed
    message comes back unroutable."""
    queue = names.queue("work")
    policy = RetryPolicy(delays=UNROUTABLE_RETRY_DELAYS, max_attempts=3, queue=queue)
    dlx = names.track_exchange(f"{queue}.dlx")
    helpers = [*policy.names(queue).retry_queues, f"{queue}.parking-lot"]
    ch = await conn.channel()
    await ch.queue_declare(queue)
    await ch.exchange_declare(dlx, "direct")
    for helper in helpers:
        await ch.queue_declare(names.track_queue(helper))
    await ch.basic_publish("", queue, b"bad")
    await ch.basic_publish("", queue, b"good")
    await ch.close()
    return queue


async def test_batch_consumer_hands_back_a_message_whose_retry_move_failed(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare_with_unroutable_retries(conn, names)
    handled: list[bytes] = []

    async def handler(batch: list[Message]) -> None:
        handled.extend(m.body for m in batch)
        if batch[0].body == b"bad":
            raise ValueError("boom")

    policy = RetryPolicy(delays=UNROUTABLE_RETRY_DELAYS, max_attempts=3, queue=queue)
    consumer = conn.consumer(
        queue, handler, retry=policy, batch_size=1, batch_timeout=0.05, prefetch=10
    )
    async with running(consumer):
        # The unmoved "bad" message is requeued and handled again, so only the start of
        # the history is fixed. "good" is acked with multiple=False: the ack must not
        # cover "bad", whose move failed.
        assert await eventually(lambda: handled[:2] == [b"bad", b"good"] and consumer.stats.acked)
    # Neither moved (unroutable) nor acked: closing the channel hands "bad" back.
    deadline = time.monotonic() + WAIT
    while (depth := await ready(conn, queue)) != 1:
        assert time.monotonic() < deadline, f"the unmoved message was lost (ready={depth})"
        await asyncio.sleep(0.05)


async def test_consumer_keeps_consuming_after_a_failed_retry_move(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare_with_unroutable_retries(conn, names)
    seen: list[bytes] = []

    async def handler(message: Message) -> None:
        seen.append(message.body)
        if message.body == b"bad":
            raise ValueError("boom")

    # docs/topology.md: "if the republish is not confirmed (nack, timeout, unroutable,
    # channel closed) the original is not acked and the broker delivers it again".
    policy = RetryPolicy(delays=UNROUTABLE_RETRY_DELAYS, max_attempts=3, queue=queue)
    async with running(conn.consumer(queue, handler, retry=policy, prefetch=1)):
        progressed = await eventually(lambda: seen.count(b"bad") >= 2 or b"good" in seen)
    assert progressed, f"consumer stalled after a failed move; handled only {seen}"


async def test_resubscribe_keeps_consuming_the_server_named_queue_it_was_given(
    conn: AsyncConnection, names: Names
) -> None:
    exchange = names.exchange()
    work = Queue("", durable=False, exclusive=True)
    topology = Topology(
        [Exchange(exchange, "direct", durable=False)], [work], [Binding(exchange, work, "k")]
    )
    old_name = (await topology.aapply(conn, timeout=WAIT)).name_of(work)
    ch = await conn.channel()
    await ch.basic_publish(exchange, "k", b"m1")
    await ch.close()
    deliveries: list[tuple[bytes, bool]] = []

    async def handler(message: Message) -> None:
        deliveries.append((message.body, message.redelivered))
        if len(deliveries) == 1:
            # Any channel error (here 403 ACCESS_REFUSED) closes the consumer's channel:
            # the broker requeues m1 into its queue, the consumer resubscribes.
            assert message.channel is not None
            await message.channel.exchange_declare("amq.reserved-name", "direct")

    consumer = conn.consumer(old_name, handler)
    async with running(consumer):
        redelivered = await eventually(lambda: len(deliveries) >= 2)
    assert redelivered, (
        f"m1 never came back: the consumer moved from {old_name!r} to {consumer.queue!r}, "
        f"{await ready(conn, old_name)} message(s) stranded in the old queue"
    )
    assert deliveries == [(b"m1", False), (b"m1", True)]


async def test_auto_ack_consumer_buffers_at_most_prefetch_messages(
    conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)
    ch = await conn.channel()
    for _ in range(500):
        await ch.basic_publish("", queue, b"x")
    await ch.close()
    release = asyncio.Event()

    async def handler(message: Message) -> None:
        await release.wait()

    consumer = conn.consumer(queue, handler, ack="auto", prefetch=10)
    await consumer.start(timeout=WAIT)
    try:
        # docs/consuming.md: "Prefetch bounds how many unacknowledged messages, and so
        # how much memory, the consumer holds." Once the inbox is full the connection
        # stops reading, so nothing more can arrive after this point.
        assert await eventually(lambda: reading_paused(conn)), "reading never paused"
        held = len(consumer._flow.inbox)
    finally:
        release.set()
        await consumer.stop(drain=False, timeout=WAIT)
    assert held <= consumer.prefetch, f"{held} messages buffered with prefetch=10"


async def test_an_auto_ack_handler_gets_replies_on_its_own_connection_with_a_full_inbox(
    conn: AsyncConnection, names: Names
) -> None:
    # The inbox fills (prefetch 10, 300 waiting) while every handler declares and
    # publishes with a confirm on the consumer's own connection: the replies must be
    # read although the full inbox pauses reading.
    queue = await declare(conn, names)
    sink = await declare(conn, names, "sink")
    await publish(conn, queue, *(b"%d" % i for i in range(300)))
    other = await conn.channel()
    await other.confirm_select()
    handled: list[bytes] = []

    async def handler(message: Message) -> None:
        await other.queue_declare(queue, passive=True, timeout=WAIT)
        confirm = await other.basic_publish("", sink, message.body)
        assert confirm is not None
        await asyncio.wait_for(confirm, WAIT)
        handled.append(message.body)

    async with running(conn.consumer(queue, handler, ack="auto", prefetch=10)) as consumer:
        assert await eventually(lambda: len(handled) == 300, 6 * WAIT), (
            f"{len(handled)} of 300 handled"
        )
    assert consumer.stats.failed == 0
    assert sorted(handled, key=int) == [b"%d" % i for i in range(300)]
    await wait_ready(conn, sink, 300)


async def test_a_coroutine_callback_gets_replies_on_its_own_connection_with_a_full_queue(
    conn: AsyncConnection, names: Names
) -> None:
    # No basic_qos: the channel's own queue for the callback fills (1,024 messages) and
    # pauses reading, while the callback waits for a reply on the same connection.
    queue = await declare(conn, names)
    total = 1500
    await publish(conn, queue, *(b"%d" % i for i in range(total)))
    other = await conn.channel()
    handled: list[bytes] = []

    async def callback(message: Message) -> None:
        await other.queue_declare(queue, passive=True, timeout=WAIT)
        handled.append(message.body)

    ch = await conn.channel()
    tag = await ch.basic_consume(queue, callback, no_ack=True)
    try:
        assert await eventually(lambda: len(handled) == total, 6 * WAIT), (
            f"{len(handled)} of {total} handled"
        )
    finally:
        await ch.basic_cancel(tag, timeout=WAIT)
        await ch.close()
    assert sorted(handled, key=int) == [b"%d" % i for i in range(total)]


async def test_stop_returns_while_a_full_inbox_pauses_reading(
    conn: AsyncConnection, names: Names
) -> None:
    # prefetch=0: the consumer bounds its inbox itself (1,024 messages) by pausing the
    # connection's reading; stop() must still get its cancel-ok through.
    queue = await declare(conn, names)
    await publish(conn, queue, *(b"%d" % i for i in range(1100)))
    release = asyncio.Event()

    async def handler(message: Message) -> None:
        await release.wait()

    consumer = conn.consumer(queue, handler, prefetch=0)
    await consumer.start(timeout=WAIT)
    try:
        assert await eventually(lambda: reading_paused(conn)), "reading never paused"
        # A deadline that fails a hang, far above the round trips a stop needs; the
        # stop's own timeout is longer still, so only a reply that never came ends it.
        await asyncio.wait_for(consumer.stop(drain=False, timeout=600), 60)
    finally:
        release.set()
    assert consumer.stats.failed == 0
    await wait_ready(conn, queue, 1100)  # manual ack: everything went back to the queue


async def test_ack_of_a_delivery_from_before_recovery_is_not_sent(
    url: str, conn: AsyncConnection, names: Names
) -> None:
    queue = await declare(conn, names)
    params = parse_urls(url)[0]
    go = asyncio.Event()
    deliveries: list[tuple[int, bool]] = []
    with TcpProxy(params.host, params.port) as proxy:
        victim = AsyncConnection(
            proxy.url(),
            connection_timeout=5,
            recovery=RecoveryPolicy(initial_delay=0.05, max_delay=0.5),
        )
        await victim.connect()
        try:

            async def handler(message: Message) -> None:
                deliveries.append((message.delivery_tag, message.redelivered))
                if len(deliveries) == 1:
                    await go.wait()  # still running when the connection is recovered

            consumer = victim.consumer(queue, handler)
            async with running(consumer):
                await publish(conn, queue, b"m1")
                assert await eventually(lambda: len(deliveries) == 1)
                channel = consumer.channel
                assert channel is not None
                assert proxy.reset() == 1
                # Recovery resubscribes; the broker redelivers m1 on the new channel (it
                # waits in the inbox behind the first, still running, handler).
                assert await eventually(lambda: consumer.stats.delivered == 2)
                go.set()
                # DESIGN §2: "After recovery, acks for delivery tags of the old channel
                # are dropped with a warning, never sent (no 406 on the new channel)."
                assert await eventually(lambda: consumer.stats.acked == 1)
                # A round trip on the channel: a stale ack would have closed it by now.
                assert (await channel.queue_declare(queue, passive=True)).message_count == 0
                assert channel.close_exc is None, f"stale ack sent: {channel.close_exc!r}"
            assert [redelivered for _tag, redelivered in deliveries] == [False, True]
            assert consumer.stats.acked == 1
        finally:
            await victim.close()


def test_sync_consumer_stop_returns_after_its_timeout_while_a_handler_runs(
    sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    release = threading.Event()
    started = threading.Event()
    finished = threading.Event()
    ch = sync_conn.channel()
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"slow")

    def handler(message: Message) -> None:
        started.set()
        release.wait()
        finished.set()

    consumer = sync_conn.consumer(queue, handler)
    consumer.start(timeout=WAIT)
    try:
        assert started.wait(WAIT)
        stopped = threading.Event()
        stopper = threading.Thread(
            target=lambda: (consumer.stop(timeout=0.5), stopped.set()), daemon=True
        )
        stopper.start()
        # stop(timeout=0.5) stops waiting for handlers after 0.5 s: it returns while this
        # one is still blocked, and the message is not back in the queue meanwhile.
        assert stopped.wait(WAIT), "stop(timeout=0.5) waited for the running handler"
        assert not finished.is_set()
        assert ch.queue_declare(queue, passive=True).message_count == 0
    finally:
        release.set()
    stopper.join(WAIT)
    assert finished.wait(WAIT)
