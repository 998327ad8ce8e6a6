"""Ack coalescing against the real broker: acks of contiguous deliveries made within one
loop iteration leave as one ``multiple`` ack, and the broker settles exactly the same
deliveries (a message the application still holds is never acked by a merged ack)."""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import rabbitry
from rabbitry.protocol import spec
from rabbitry.protocol.frames import FRAME_METHOD, FrameReader

if TYPE_CHECKING:
    from .conftest import Names

N = 600


class AckRecorder:
    """Wraps a transport's ``write`` and decodes the basic.ack frames written."""

    def __init__(self, transport: Any) -> None:
        self._reader = FrameReader(1 << 20)
        self.acks: list[tuple[int, bool]] = []
        write = transport.write

        def recording_write(data: bytes) -> None:
            for kind, _channel, payload in self._reader.feed(bytes(data)):
                if kind == FRAME_METHOD:
                    method = spec.decode_method(payload)
                    if isinstance(method, spec.BasicAck):
                        self.acks.append((method.delivery_tag, method.multiple))
            write(data)

        transport.write = recording_write


class ReadCounter:
    """Counts the reads of a connection: calls of its protocol's ``data_received``.

    Deliveries that arrive in one read are handled, and acked, in one loop iteration, so
    the number of reads, not the clock, bounds how many ack frames coalescing may leave.
    """

    def __init__(self, transport: Any) -> None:
        self.reads = 0
        protocol = transport.get_protocol()
        received = protocol.data_received

        def counting_data_received(data: bytes) -> None:
            self.reads += 1
            received(data)

        protocol.data_received = counting_data_received


async def _fill(ch: rabbitry.AsyncChannel, queue: str, n: int) -> None:
    await ch.queue_declare(queue)
    for i in range(n):
        await ch.basic_publish("", queue, str(i).encode())
    await ch.queue_declare(queue, passive=True)  # publishes are routed by now


async def _ready(conn: rabbitry.AsyncConnection, queue: str) -> int:
    ch = await conn.channel()
    try:
        for _ in range(100):  # requeued messages reappear shortly after the close
            count = (await ch.queue_declare(queue, passive=True)).message_count
            if count:
                return count
            await asyncio.sleep(0.02)
        return 0
    finally:
        await ch.close()


async def test_async_acks_of_one_burst_leave_as_multiple_acks(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    ch = await conn.channel()
    await _fill(ch, queue, N)
    await ch.basic_qos(N)
    recorder = AckRecorder(conn._transport)
    reads = ReadCounter(conn._transport)
    done = asyncio.get_running_loop().create_future()
    seen: list[int] = []

    def on_message(message: rabbitry.Message) -> None:
        seen.append(message.delivery_tag)
        message.ack()
        if len(seen) == N:
            done.set_result(None)

    await ch.basic_consume(queue, on_message)
    await asyncio.wait_for(done, 30)
    await ch.queue_declare(queue, passive=True)  # a round trip after the last ack
    await ch.close()

    assert seen == list(range(1, N + 1))
    # Every ack frame is a merged run except possibly a lone first one per burst.
    assert recorder.acks[-1] == (N, True) or recorder.acks[-1] == (N, False)
    # At most two ack frames per read of deliveries (a lone first ack, then a merged
    # run); however the broker's frames were split into reads.
    assert len(recorder.acks) <= 2 * reads.reads, (
        f"{len(recorder.acks)} ack frames for {N} acks in {reads.reads} reads: "
        "they were not coalesced"
    )
    print(f"async: {len(recorder.acks)} ack frames, {reads.reads} reads")
    # The broker settled all of them: nothing comes back after the channel closed.
    assert await _ready(conn, queue) == 0


async def test_async_a_held_message_is_not_acked_by_a_merged_ack(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    ch = await conn.channel()
    await _fill(ch, queue, N)
    await ch.basic_qos(N)
    recorder = AckRecorder(conn._transport)
    done = asyncio.get_running_loop().create_future()
    held: list[rabbitry.Message] = []
    count = 0

    def on_message(message: rabbitry.Message) -> None:
        nonlocal count
        count += 1
        if message.delivery_tag == 1:
            held.append(message)  # the application keeps the first one unacked
        else:
            message.ack()
        if count == N:
            done.set_result(None)

    await ch.basic_consume(queue, on_message)
    await asyncio.wait_for(done, 30)
    await ch.queue_declare(queue, passive=True)
    # No ack frame may cover tag 1: no multiple ack at all while 1 is held.
    assert all(not multiple for _tag, multiple in recorder.acks)
    await ch.close()  # the held message goes back to the queue
    assert await _ready(conn, queue) == 1


def test_sync_acks_from_the_dispatcher_leave_as_multiple_acks(url: str, names: Names) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        for i in range(N):
            ch.basic_publish("", queue, str(i).encode())
        ch.basic_qos(N)
        engine = conn._async
        recorder = AckRecorder(engine._transport)
        reads = ReadCounter(engine._transport)
        done = threading.Event()
        seen: list[int] = []

        def on_message(message: rabbitry.Message) -> None:
            seen.append(message.delivery_tag)
            message.ack()
            if len(seen) == N:
                done.set()

        ch.basic_consume(queue, on_message)
        assert done.wait(30)
        ch.queue_declare(queue, passive=True)
        ch.close()
        assert seen == list(range(1, N + 1))
        assert recorder.acks and recorder.acks[-1][0] == N
        assert len(recorder.acks) <= 2 * reads.reads, (
            f"{len(recorder.acks)} ack frames for {N} acks in {reads.reads} reads: "
            "they were not coalesced"
        )
        print(f"sync: {len(recorder.acks)} ack frames, {reads.reads} reads")
        ch = conn.channel()
        assert ch.queue_declare(queue, passive=True).message_count == 0
