"""Durable outbox vs in-memory confirmed publishing, measured in the same run.

Usage (from the repository root, broker on 127.0.0.1:5672 or $RABBITMQ_URL)::

    PYTHONPATH=src .venv/bin/python bench/outbox_bench.py [--count 30000] [--batch 1000]
        [--repeats 3] [--size 128] [--synchronous FULL] [--dir DIR]

Rows, each to a fresh exclusive queue, every message confirmed by the broker before the
timer stops:

- ``memory batch``: ``AsyncPublisher.publish_batch`` of ``--batch`` messages (the
  in-memory confirmed rate, the reference).
- ``memory publish``: ``AsyncPublisher.publish`` per message (window 1000), then
  ``wait_for_confirms``.
- ``outbox batch``: ``AsyncOutboxPublisher.publish_many`` of ``--batch`` messages (one
  transaction each), then ``flush()`` (every row acked and deleted).
- ``outbox publish x64``: 64 tasks calling ``publish()`` concurrently (group commit),
  then ``flush()``.

Prints msgs/s, client CPU µs per message (process time of this process, which includes
the outbox's writer thread) and the ratio to ``memory batch``; the median of
``--repeats`` runs, rows interleaved in each repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

from rabbitry import AsyncConnection, AsyncPublisher, SQLiteOutbox

Scenario = Callable[[AsyncConnection, str, int, int, bytes, str], Awaitable[None]]


async def memory_batch(conn: AsyncConnection, queue: str, count: int, batch: int,
                       body: bytes, _dir: str) -> None:  # fmt: skip
    publisher: AsyncPublisher = await conn.publisher(max_in_flight=max(1000, batch))
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        outcomes = await publisher.publish_batch([body] * n, routing_key=queue)
        assert not any(outcomes), outcomes[:3]
        sent += n
    await publisher.close()


async def memory_publish(conn: AsyncConnection, queue: str, count: int, _batch: int,
                         body: bytes, _dir: str) -> None:  # fmt: skip
    publisher = await conn.publisher(max_in_flight=1000)
    for _ in range(count):
        await publisher.send(body, routing_key=queue)
    await publisher.wait_for_confirms()
    await publisher.close()


async def outbox_batch(conn: AsyncConnection, queue: str, count: int, batch: int,
                       body: bytes, directory: str) -> None:  # fmt: skip
    path = os.path.join(directory, f"bench-{time.monotonic_ns()}.db")
    outbox = SQLiteOutbox(path, synchronous=ARGS.synchronous)
    publisher = await conn.publisher(max_in_flight=1000, outbox=outbox)
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        await publisher.publish_many([body] * n, routing_key=queue)
        sent += n
    await publisher.flush()
    stats = publisher.stats()
    assert stats.acked == count and stats.pending == 0, stats
    await publisher.close()


async def outbox_publish(conn: AsyncConnection, queue: str, count: int, _batch: int,
                         body: bytes, directory: str) -> None:  # fmt: skip
    path = os.path.join(directory, f"bench-{time.monotonic_ns()}.db")
    outbox = SQLiteOutbox(path, synchronous=ARGS.synchronous)
    publisher = await conn.publisher(max_in_flight=1000, outbox=outbox)
    tasks = 64

    async def worker(share: int) -> None:
        for _ in range(share):
            await publisher.publish(body, routing_key=queue)

    await asyncio.gather(*(worker(count // tasks) for _ in range(tasks)))
    await publisher.flush()
    await publisher.close()


SCENARIOS: dict[str, tuple[Scenario, int]] = {
    # name: (function, divisor of --count: the per-message rows use fewer messages)
    "memory batch": (memory_batch, 1),
    "memory publish": (memory_publish, 1),
    "outbox batch": (outbox_batch, 1),
    "outbox publish x64": (outbox_publish, 1),
}


async def run_one(url: str, name: str, count: int, directory: str) -> tuple[float, float]:
    scenario, divisor = SCENARIOS[name]
    count //= divisor
    body = os.urandom(ARGS.size // 2).hex().encode()[: ARGS.size]
    conn = AsyncConnection(url)
    await conn.connect()
    try:
        channel = await conn.channel()
        queue = (await channel.queue_declare("", exclusive=True)).queue
        wall, cpu = time.perf_counter(), time.process_time()
        await scenario(conn, queue, count, ARGS.batch, body, directory)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        got = (await channel.queue_declare(queue, passive=True)).message_count
        if got < count - count % 64:
            raise SystemExit(f"{name}: the queue holds {got} of {count} messages")
    finally:
        await conn.close()
    return count / wall, cpu / count * 1e6


async def main() -> None:
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in SCENARIOS}
    with tempfile.TemporaryDirectory(dir=ARGS.dir) as directory:
        for _ in range(ARGS.repeats):
            for name in SCENARIOS:
                results[name].append(await run_one(url, name, ARGS.count, directory))
    reference = statistics.median(r for r, _ in results["memory batch"])
    print(f"count {ARGS.count}, batch {ARGS.batch}, body {ARGS.size} B, "
          f"synchronous={ARGS.synchronous}, repeats {ARGS.repeats} (medians)")  # fmt: skip
    print()
    print("| row | msgs/s | client CPU µs/msg | ÷ memory batch |")
    print("|---|---:|---:|---:|")
    for name, values in results.items():
        rate = statistics.median(r for r, _ in values)
        cpu = statistics.median(c for _, c in values)
        print(f"| {name} | {rate / 1000:.1f}k | {cpu:.1f} | {rate / reference:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=30_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL")
    parser.add_argument("--dir", default=None, help="where the outbox files go (default: TMPDIR)")
    ARGS = parser.parse_args()
    sys.exit(asyncio.run(main()))
