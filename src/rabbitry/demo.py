"""``python -m rabbitry.demo``: a short, visible round trip through a real broker.

``make demo-quick`` runs it (``make demo`` runs the reference pipeline in the
repository's ``examples/orders_pipeline/``). It declares a
throw-away topology, publishes messages with publisher confirms through the asyncio API,
consumes and acknowledges them through the thread-safe API, and prints each step with
the numbers it measured. It exits non-zero if anything is lost.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from . import AsyncConnection, Connection, Properties
from .config import default_url, parse_url

__all__ = ["main"]

COUNT = 10_000


def _say(text: str) -> None:
    print(text, flush=True)


async def _publish(url: str, exchange: str, queue: str, count: int) -> float:
    async with AsyncConnection(url, connection_name="rabbitry-demo-publisher") as conn:
        _say(
            f"[async] connected to {conn.params.display_url()} "
            f"(heartbeat {conn.heartbeat} s, frame_max {conn.frame_max})"
        )
        channel = await conn.channel()
        await channel.exchange_declare(exchange, "direct", auto_delete=True)
        await channel.queue_declare(queue, arguments={"x-expires": 600_000})
        await channel.queue_bind(queue, exchange, "demo")
        _say(f"[async] declared exchange {exchange!r} -> queue {queue!r}")
        await channel.confirm_select()
        started = time.perf_counter()
        pending = []
        for index in range(count):
            props = Properties(message_id=str(index), headers={"index": index})
            confirm = await channel.basic_publish(
                exchange, "demo", f"message {index}".encode(), properties=props
            )
            assert confirm is not None
            pending.append(confirm)
            if len(pending) >= 1000:
                await asyncio.gather(*pending)
                pending.clear()
                _say(f"[async] {index + 1:>6} published and confirmed")
        await asyncio.gather(*pending)
        elapsed = time.perf_counter() - started
        _say(
            f"[async] {count} messages confirmed by the broker in {elapsed:.2f} s "
            f"({count / elapsed:,.0f} msg/s)"
        )
        return elapsed


def _consume(url: str, exchange: str, queue: str, count: int) -> set[str]:
    seen: set[str] = set()
    with Connection(url, connection_name="rabbitry-demo-consumer") as conn:
        channel = conn.channel()
        started = time.perf_counter()
        for message in channel.consume(queue, prefetch=500, timeout=5):
            assert message.properties.message_id is not None
            seen.add(message.properties.message_id)
            message.ack()
            if len(seen) % 2000 == 0:
                _say(f"[sync]  {len(seen):>6} consumed and acked")
            if len(seen) == count:
                break
        elapsed = time.perf_counter() - started
        _say(
            f"[sync]  {len(seen)} messages consumed in {elapsed:.2f} s "
            f"({len(seen) / max(elapsed, 1e-9):,.0f} msg/s)"
        )
        channel.queue_delete(queue)
        channel.exchange_delete(exchange)
        _say(f"[sync]  deleted queue {queue!r} and exchange {exchange!r}")
    return seen


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    args = sys.argv[1:] if argv is None else argv
    url = args[0] if args else default_url()
    parse_url(url)  # fail early, with a clear message, on a bad URL
    suffix = uuid.uuid4().hex[:8]
    exchange, queue = f"rabbitry.demo.{suffix}", f"rabbitry.demo.{suffix}"
    asyncio.run(_publish(url, exchange, queue, COUNT))
    seen = _consume(url, exchange, queue, COUNT)
    missing = COUNT - len(seen)
    if missing:
        _say(f"FAILED: {missing} of {COUNT} messages were not consumed")
        return 1
    _say(f"OK: {COUNT} published with confirms, {len(seen)} consumed exactly once, 0 lost")
    return 0


if __name__ == "__main__":
    sys.exit(main())
