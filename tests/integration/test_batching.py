"""Micro-batching through the real broker: envelopes in Spring AMQP's ``lengthHeader4``
format published by the batching publishers (both APIs), read back byte by byte with
``struct`` and as records by the consumers and the ``consume()`` iterators; the size
cap; an envelope's outcome shared by its records; a failing record sending the whole
envelope through the retry policy; unknown formats refused."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import (
    AsyncBatchingPublisher,
    AsyncConnection,
    BatchFormatError,
    BatchingPublisher,
    Message,
    Nacked,
    Properties,
    Queue,
    RetryPolicy,
    Topology,
    Unroutable,
)
from rabbitry.batching import BatchRecord
from rabbitry.shovel import Shovel

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.integration.conftest import Names

WAIT = 20.0
SPRING = {"springBatchFormat": "lengthHeader4"}


def by_hand(*records: bytes) -> bytes:
    """An envelope body as the format describes it (not rabbitry's encoder)."""
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


def split_by_hand(body: bytes) -> list[bytes]:
    out, offset = [], 0
    while offset < len(body):
        (size,) = struct.unpack_from(">I", body, offset)
        out.append(body[offset + 4 : offset + 4 + size])
        offset += 4 + size
    assert offset == len(body)
    return out


async def get_raw(channel: rabbitry.AsyncChannel, queue: str) -> list[Message]:
    """Every message of ``queue`` as stored, without splitting (basic.get, no ack)."""
    out = []
    while (message := await channel.basic_get(queue, no_ack=True)) is not None:
        out.append(message)
    return out


async def test_async_envelopes_carry_the_documented_bytes_and_headers(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    props = Properties(content_type="application/json", headers={"tenant": "acme"})
    async with AsyncBatchingPublisher(
        # A linger no test run reaches: the splits below are decided by batch_records
        # alone (a short one expires whenever the loop stalls while a batch is sent).
        publisher,
        batch_records=10,
        linger=30,
        properties=props,
        persistent=True,
    ) as batching:
        futures = [await batching.publish(b'{"n": %d}' % i, routing_key=queue) for i in range(25)]
    await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    assert batching.stats.records == 25 and batching.stats.envelopes == 3
    raw = await get_raw(channel, queue)
    assert [len(split_by_hand(m.body)) for m in raw] == [10, 10, 5]
    assert [r for m in raw for r in split_by_hand(m.body)] == [b'{"n": %d}' % i for i in range(25)]
    first = raw[0].properties
    assert first.headers == {
        "tenant": "acme",
        "springBatchFormat": "lengthHeader4",
        "amqp_batchSize": 10,
    }
    assert (first.content_type, first.delivery_mode) == ("application/json", 2)
    assert first.message_id  # one id per envelope, for de-duplication
    await publisher.close()


async def test_async_iterator_and_consumer_hand_out_records(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    async with AsyncBatchingPublisher(publisher, batch_records=7, linger=0.01) as batching:
        futures = [await batching.publish(b"r%d" % i, routing_key=queue) for i in range(20)]
    await asyncio.wait_for(asyncio.gather(*futures), WAIT)
    # A plain message among the envelopes passes through unchanged.
    await (await publisher.send(b"plain", routing_key=queue))
    got = []
    async for message in channel.consume(queue, prefetch=5, timeout=1):
        got.append(message.body)
        assert isinstance(message, BatchRecord) == (message.body != b"plain")
        message.ack()
    assert got == [b"r%d" % i for i in range(20)] + [b"plain"]
    # Linger alone sends a batch that never fills.
    lingering = AsyncBatchingPublisher(publisher, batch_records=100, linger=0.05)
    last = [await lingering.publish(b"l%d" % i, routing_key=queue) for i in range(3)][-1]
    await asyncio.wait_for(last, WAIT)
    assert lingering.stats.envelopes == 1
    async for message in channel.consume(queue, timeout=1):
        message.ack()
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0
    # The handler-based consumer: one record per call, envelopes acked when done.
    async with AsyncBatchingPublisher(publisher, batch_records=7, linger=0.01) as batching:
        for i in range(20):
            await batching.publish(b"c%d" % i, routing_key=queue)
    await batching.wait_for_confirms(timeout=WAIT)
    handled: list[bytes] = []
    done = asyncio.Event()

    async def handle(message: Message) -> None:
        handled.append(message.body)
        if len(handled) == 20:
            done.set()

    async with conn.consumer(queue, handle, prefetch=2) as consumer:
        await asyncio.wait_for(done.wait(), WAIT)
    assert handled == [b"c%d" % i for i in range(20)]
    assert consumer.stats.acked == 3  # three envelopes (7 + 7 + 6 records)
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0
    await publisher.close()


def test_sync_publisher_consumer_and_iterator_round_trip(url: str, names: Names) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher() as publisher:
            # linger=30: batch_records alone splits, whatever the threads' timing; the
            # flush sends the last, short batch.
            with BatchingPublisher(publisher, batch_records=10, linger=30) as batching:
                futures = [batching.publish(b"s%d" % i, routing_key=queue) for i in range(35)]
                batching.flush()
                for future in futures:
                    future.result(WAIT)
            assert (batching.stats.envelopes, batching.stats.singles) == (4, 0)
            seen: list[bytes] = []
            lock = threading.Lock()

            def handle(message: Message) -> None:
                with lock:
                    seen.append(message.body)

            with conn.consumer(queue, handle) as consumer:
                deadline = time.monotonic() + WAIT
                while len(seen) < 35 and time.monotonic() < deadline:
                    time.sleep(0.02)
            assert seen == [b"s%d" % i for i in range(35)]
            assert consumer.stats.acked == 4
            # The sync iterator; linger alone sends the last, short batch.
            with BatchingPublisher(publisher, batch_records=100, linger=0.05) as batching:
                last = [batching.publish(b"i%d" % i, routing_key=queue) for i in range(5)][-1]
                last.result(WAIT)  # no flush: the linger thread sent it
            got = []
            for message in channel.consume(queue, timeout=1):
                got.append(message.body)
                message.ack()
            assert got == [b"i%d" % i for i in range(5)]
            assert channel.queue_declare(queue, passive=True).message_count == 0


async def test_hand_built_spring_envelope_is_split_for_consumers(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    records = [b"alpha", b"", b"\x00\x01\x02" * 50]
    props = Properties(headers={**SPRING, "x": 1}, content_type="text/plain")
    for _ in range(2):
        await (await publisher.send(by_hand(*records), routing_key=queue, properties=props))
    got = []
    async for message in channel.consume(queue, timeout=1):
        got.append((message.body, message.properties.headers, message.properties.content_type))
        message.ack()
        if len(got) == 3:
            break
    assert got == [(r, {"x": 1}, "text/plain") for r in records]
    handled: list[bytes] = []
    done = asyncio.Event()

    async def handle(message: Message) -> None:
        handled.append(message.body)
        if len(handled) == 3:
            done.set()

    async with conn.consumer(queue, handle):
        await asyncio.wait_for(done.wait(), WAIT)
    assert handled == records
    await publisher.close()


async def test_envelopes_never_exceed_batch_bytes(conn: AsyncConnection, names: Names) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    record = b"r" * 128  # 132 bytes in an envelope
    # linger=30: only batch_bytes splits. With the default 5 ms, a loop stalled while an
    # envelope was handed over let the linger send the next batch with one record.
    async with AsyncBatchingPublisher(
        publisher, batch_records=1000, batch_bytes=1000, linger=30
    ) as batching:
        for _ in range(50):
            await batching.publish(record, routing_key=queue)
        big = await batching.publish(b"B" * 5000, routing_key=queue)  # alone, plain
    await batching.wait_for_confirms(timeout=WAIT)
    await asyncio.wait_for(big, WAIT)
    raw = await get_raw(channel, queue)
    envelopes = [m for m in raw if m.properties.headers]
    assert all(len(m.body) <= 1000 for m in envelopes)
    # 7 × 132 ≤ 1000 < 8 × 132: seven envelopes of 7, then the 50th record, alone, goes
    # as a plain message (a batch of one), then the big record, also alone.
    assert [len(split_by_hand(m.body)) for m in envelopes] == [7] * 7
    assert [m.body for m in raw[7:]] == [record, b"B" * 5000]
    assert raw[-1].properties.headers is None
    assert batching.stats.singles == 2
    await publisher.close()


async def test_a_returned_envelope_fails_every_record(conn: AsyncConnection, names: Names) -> None:
    publisher = await conn.publisher()
    nowhere = names.queue("none")  # never declared
    async with AsyncBatchingPublisher(publisher, batch_records=5, mandatory=True) as batching:
        futures = [await batching.publish(b"x", routing_key=nowhere) for _ in range(5)]
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(o, Unroutable) for o in outcomes)
    assert len({id(o) for o in outcomes}) == 1  # the envelope's one return
    assert batching.stats.envelopes == 1
    # A nack (a full queue refusing publishes) fails every record of the envelope too.
    full = names.queue("full")
    channel = await conn.channel()
    await channel.queue_declare(full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    async with AsyncBatchingPublisher(publisher, batch_records=4) as batching:
        futures = [await batching.publish(b"y", routing_key=full) for _ in range(4)]
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(o, Nacked) for o in outcomes), outcomes
    await publisher.close()


async def test_a_failing_record_sends_the_whole_envelope_through_the_retry_policy(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue("work")
    policy = RetryPolicy([0.2], queue=queue)
    retry_names = policy.names(queue)
    names.track_exchange(retry_names.dlx)
    for extra in (*retry_names.retry_queues, retry_names.parking_lot):
        assert extra is not None
        names.track_queue(extra)
    await Topology(queues=[Queue(queue)]).with_retry(queue, policy).aapply(conn)
    publisher = await conn.publisher()
    async with AsyncBatchingPublisher(publisher, batch_records=4) as batching:
        for i in range(4):
            await batching.publish(b"r%d" % i, routing_key=queue)
    await batching.wait_for_confirms(timeout=WAIT)
    calls: list[bytes] = []
    failed_once = False
    done = asyncio.Event()

    async def handle(message: Message) -> None:
        nonlocal failed_once
        calls.append(message.body)
        if message.body == b"r2" and not failed_once:
            failed_once = True
            raise RuntimeError("r2 fails once")
        if message.body == b"r3" and calls.count(b"r3") == 2:
            done.set()

    with caplog.at_level(logging.ERROR, logger="rabbitry.consumer"):
        async with conn.consumer(queue, handle, retry=policy) as consumer:
            await asyncio.wait_for(done.wait(), WAIT)
    # r3 was still handed out after r2 failed (every record is seen before the
    # envelope's outcome is decided); the retry brought every record again.
    assert calls == [b"r0", b"r1", b"r2", b"r3", b"r0", b"r1", b"r2", b"r3"]
    assert (consumer.stats.retried, consumer.stats.acked) == (1, 1)
    assert any("r2 fails once" in r.getMessage() or r.exc_info for r in caplog.records)
    channel = await conn.channel()
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0
    await publisher.close()


async def test_an_unknown_batch_format_is_parked_not_handed_out(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue("work")
    policy = RetryPolicy([0.2], queue=queue)
    retry_names = policy.names(queue)
    names.track_exchange(retry_names.dlx)
    for extra in (*retry_names.retry_queues, retry_names.parking_lot):
        assert extra is not None
        names.track_queue(extra)
    await Topology(queues=[Queue(queue)]).with_retry(queue, policy).aapply(conn)
    publisher = await conn.publisher()
    odd = Properties(headers={"springBatchFormat": "lengthHeader8"})
    await (await publisher.send(b"\x00" * 16, routing_key=queue, properties=odd))
    handled: list[Message] = []

    async def handle(message: Message) -> None:
        handled.append(message)

    channel = await conn.channel()
    async with conn.consumer(queue, handle, retry=policy) as consumer:
        deadline = time.monotonic() + WAIT
        while consumer.stats.parked < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert handled == [] and consumer.stats.parked == 1
    parked = await channel.basic_get(retry_names.parking_lot, no_ack=True)
    assert parked is not None and parked.body == b"\x00" * 16
    # The iterator raises it, with the envelope unsettled for the caller.
    await (await publisher.send(b"\x00" * 16, routing_key=queue, properties=odd))
    with pytest.raises(BatchFormatError, match="lengthHeader8") as caught:
        async for _ in channel.consume(queue, timeout=5):
            pass
    assert caught.value.message is not None
    caught.value.message.reject(requeue=False)
    await publisher.close()


async def test_a_truncated_envelope_is_refused_by_the_iterator(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    truncated = by_hand(b"abc", b"defg")[:-2]
    await (
        await publisher.send(truncated, routing_key=queue, properties=Properties(headers=SPRING))
    )
    with pytest.raises(BatchFormatError, match="truncated"):
        async for _ in channel.consume(queue, timeout=5):
            pass
    await publisher.close()


async def test_list_handlers_get_records_and_a_failed_record_parks_its_envelope(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue("work")
    policy = RetryPolicy(max_attempts=1, queue=queue)  # no retries: straight to the lot
    retry_names = policy.names(queue)
    names.track_exchange(retry_names.dlx)
    for extra in (*retry_names.retry_queues, retry_names.parking_lot):
        assert extra is not None
        names.track_queue(extra)
    await Topology(queues=[Queue(queue)]).with_retry(queue, policy).aapply(conn)
    publisher = await conn.publisher()
    async with AsyncBatchingPublisher(publisher, batch_records=3) as batching:
        for body in (b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"):
            await batching.publish(body, routing_key=queue)
    await batching.wait_for_confirms(timeout=WAIT)
    await (await publisher.send(b"plain", routing_key=queue))
    seen: list[list[bytes]] = []
    done = asyncio.Event()

    async def handle(messages: list[Message]) -> list[Message]:
        seen.append([m.body for m in messages])
        if sum(map(len, seen)) >= 7:
            done.set()
        return [m for m in messages if m.body == b"b1"]  # one record of envelope b fails

    async with conn.consumer(
        queue, handle, batch_size=10, batch_timeout=0.5, retry=policy
    ) as consumer:
        await asyncio.wait_for(done.wait(), WAIT)
        deadline = time.monotonic() + WAIT
        while consumer.stats.parked < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert [b for batch in seen for b in batch] == [
        b"a0",
        b"a1",
        b"a2",
        b"b0",
        b"b1",
        b"b2",
        b"plain",
    ]
    assert consumer.stats.parked == 1
    channel = await conn.channel()
    parked = await channel.basic_get(retry_names.parking_lot, no_ack=True)
    assert parked is not None and split_by_hand(parked.body) == [b"b0", b"b1", b"b2"]
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0
    await publisher.close()


def test_a_shovel_moves_envelopes_unchanged_and_raw_iteration_sees_them(
    url: str, names: Names
) -> None:
    source, target = names.queue("from"), names.queue("to")
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(source)
        channel.queue_declare(target)
        with conn.publisher() as publisher:
            # linger=30: the three records make one envelope even if this thread stalls
            # between them (the default 5 ms linger would send what it has).
            with BatchingPublisher(publisher, batch_records=3, linger=30) as batching:
                for i in range(3):
                    batching.publish(b"m%d" % i, routing_key=source)
            batching.wait_for_confirms(timeout=WAIT)
        moved = Shovel(url, source, url, "", target, idle_timeout=0.5).run()
        assert moved.moved == 1  # one message: the envelope
        (raw,) = list(channel.consume(target, timeout=1, unpack_batches=False))
        assert split_by_hand(raw.body) == [b"m0", b"m1", b"m2"]
        assert raw.properties.headers == {"springBatchFormat": "lengthHeader4", "amqp_batchSize": 3}
        raw.ack()


async def test_a_cancelled_caller_does_not_take_other_callers_records_with_it(
    url: str, names: Names
) -> None:
    """The caller whose record sealed a batch is cancelled while the batch waits for the
    publisher's window: the envelope (which holds another caller's record) is still
    sent, and every record's future settles."""
    queue = names.queue()
    async with AsyncConnection(url) as admin:
        await (await admin.channel()).queue_declare(queue)
    with TcpProxy("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])) as proxy:
        async with AsyncConnection(proxy.url()) as conn:
            publisher = await conn.publisher(max_in_flight=1)
            batching = AsyncBatchingPublisher(publisher, batch_records=2, linger=30)
            proxy.hold("downstream")  # no confirm: the first envelope keeps the window (1)
            first = [await batching.publish(b"a0", routing_key=queue)]
            first.append(await batching.publish(b"a1", routing_key=queue))
            other = await batching.publish(b"b0", routing_key=queue)
            sealing = asyncio.ensure_future(batching.publish(b"b1", routing_key=queue))
            # b1 sealed [b0, b1] (nothing open) and the batch left the queue of sealed
            # ones: it waits for the window now.
            acc = batching._acc
            assert await _until(lambda: acc.open is None and not acc.sealed)
            sealing.cancel()
            assert (await asyncio.gather(sealing, return_exceptions=True))[0] is not None
            proxy.release("downstream")
            await asyncio.wait_for(asyncio.gather(*first, other), WAIT)
            await batching.close()
            await publisher.wait_for_confirms(timeout=WAIT)
    async with AsyncConnection(url) as admin:
        channel = await admin.channel()
        bodies = [r for m in await get_raw(channel, queue) for r in split_by_hand(m.body)]
    assert bodies == [b"a0", b"a1", b"b0", b"b1"]


SYNC_INTERRUPT = r"""
import faulthandler, os, signal, sys, threading, time
import rabbitry
from rabbitry import BatchingPublisher
from tests.support.proxy import TcpProxy

url, port, queue = sys.argv[1], int(sys.argv[2]), sys.argv[3]
faulthandler.dump_traceback_later(90, exit=True)  # a hang prints every thread's stack
with TcpProxy("127.0.0.1", port) as proxy, rabbitry.Connection(proxy.url()) as conn:
    publisher = conn.publisher(max_in_flight=1)
    batching = BatchingPublisher(publisher, batch_records=2, linger=30)
    proxy.hold("downstream")
    first = [batching.publish(body, routing_key=queue) for body in (b"a0", b"a1")]
    other = []
    thread = threading.Thread(
        target=lambda: other.append(batching.publish(b"b0", routing_key=queue))
    )
    thread.start()
    thread.join()

    main = threading.main_thread().ident

    def waiting_for_the_window():
        # The main thread holds the sealed [b0, b1] batch and waits for a slot of the
        # publisher's window (no confirm can free one: the proxy holds them back), in
        # the window's condition wait.
        frame = sys._current_frames().get(main)
        if frame is None or frame.f_code.co_filename != threading.__file__:
            return False
        while frame is not None:
            if frame.f_code.co_qualname == "Window.acquire":
                return True
            frame = frame.f_back
        return False

    # Ctrl-C once: later SIGINTs are ignored, so the interrupter can repeat its signal.
    raised = []

    def on_sigint(signum, frame):
        if not raised:
            raised.append(signum)
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)

    def interrupt_when_blocked():
        deadline = time.monotonic() + 60
        while not raised:
            if time.monotonic() > deadline:
                os._exit(3)
            if waiting_for_the_window():
                # To the main thread itself: a process-directed signal may be taken by
                # another thread, and the main thread, asleep in a lock wait, would not
                # see it then. Repeated until the handler has run: a signal that lands
                # after the main thread's last check for signals but before it blocks
                # in the lock wait is only handled once it wakes up, and nothing else
                # would wake it.
                signal.pthread_kill(main, signal.SIGINT)
            time.sleep(0.05)

    threading.Thread(target=interrupt_when_blocked, daemon=True).start()
    try:
        batching.publish(b"b1", routing_key=queue)
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted")
    proxy.release("downstream")
    for future in [*first, *other]:
        future.result(20)
    batching.close()
    publisher.wait_for_confirms(timeout=20)
    print("settled")
"""


def test_an_interrupted_publishing_thread_does_not_lose_other_threads_records(
    url: str, names: Names, tmp_path: Path
) -> None:
    """Ctrl-C in the thread handing a full batch to the publisher: the envelope goes
    back in line and the linger thread sends it; the other thread's record settles."""
    queue = names.queue()
    with rabbitry.Connection(url) as admin:
        admin.channel().queue_declare(queue)
    script = tmp_path / "interrupt.py"
    script.write_text(SYNC_INTERRUPT)
    port = url.rsplit(":", 1)[1].split("/")[0]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
    result = subprocess.run(
        [sys.executable, str(script), url, port, queue],
        capture_output=True,
        text=True,
        timeout=110,  # past the script's own 90 s stack dump, before pytest-timeout
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["interrupted", "settled"], result.stdout
    with rabbitry.Connection(url) as admin:
        channel = admin.channel()
        bodies = []
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            bodies.extend(split_by_hand(message.body))
    assert bodies == [b"a0", b"a1", b"b0", b"b1"]


async def _until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


@pytest.mark.parametrize("batch_size", [None, 10])
async def test_a_deduplicating_consumer_handles_a_repeated_envelope_once(
    conn: AsyncConnection, names: Names, batch_size: int | None
) -> None:
    """The same envelope and the same plain message, each delivered twice (as after a
    resend): a consumer with ``dedup=`` hands their records out once, per message
    handler or list handler alike."""
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    envelope = Properties(message_id="envelope-1", headers=SPRING)
    for _ in range(2):
        await (await publisher.send(by_hand(b"r0", b"r1"), routing_key=queue, properties=envelope))
    for _ in range(2):
        plain = Properties(message_id="plain-1")
        await (await publisher.send(b"plain", routing_key=queue, properties=plain))
    seen: list[bytes] = []

    async def one(message: Message) -> None:
        seen.append(message.body)

    async def many(messages: list[Message]) -> None:
        seen.extend(m.body for m in messages)

    async with conn.consumer(
        queue,
        many if batch_size else one,  # type: ignore[arg-type]
        batch_size=batch_size,
        batch_timeout=0.5 if batch_size else None,
        dedup=rabbitry.MemoryDedupStore(),
    ) as consumer:
        deadline = time.monotonic() + WAIT
        while (len(seen) < 3 or consumer.stats.deduplicated < 2) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert sorted(seen) == [b"plain", b"r0", b"r1"]
    assert consumer.stats.deduplicated == 2
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0


async def test_an_async_iterator_left_inside_an_envelope_returns_it_to_the_queue(
    conn: AsyncConnection, names: Names
) -> None:
    """``break`` after the first record of a 3-record envelope: the envelope goes back
    to the queue at once, so the next iterator on the same channel gets every record
    again (the first one flagged redelivered), not nothing until the channel closes."""
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    publisher = await conn.publisher()
    await (
        await publisher.send(
            by_hand(b"r0", b"r1", b"r2"), routing_key=queue, properties=Properties(headers=SPRING)
        )
    )
    async for message in channel.consume(queue, timeout=5):
        assert message.body == b"r0"
        message.ack()
        break
    again = []
    async for message in channel.consume(queue, timeout=2):
        again.append((message.body, message.redelivered))
        message.ack()
    assert again == [(b"r0", True), (b"r1", True), (b"r2", True)]
    assert (await channel.queue_declare(queue, passive=True)).message_count == 0


def test_a_sync_iterator_left_inside_an_envelope_returns_it_to_the_queue(
    url: str, names: Names
) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher() as publisher:
            envelope = Properties(headers=SPRING)
            publisher.publish(
                by_hand(b"r0", b"r1", b"r2"), routing_key=queue, properties=envelope
            ).result(WAIT)
        for message in channel.consume(queue, timeout=5):
            assert message.body == b"r0"
            message.ack()
            break
        again = []
        for message in channel.consume(queue, timeout=2):
            again.append((message.body, message.redelivered))
            message.ack()
        assert again == [(b"r0", True), (b"r1", True), (b"r2", True)]
        assert channel.queue_declare(queue, passive=True).message_count == 0
