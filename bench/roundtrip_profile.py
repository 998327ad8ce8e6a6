"""Round-trip cost: publish one message and wait until our own consumer has it (S5).

    PYTHONPATH=src .venv/bin/python bench/roundtrip_profile.py [--n 3000] [--runs 5]
        [--api async sync] [--top 0]

For each API, against the broker at RABBITMQ_URL (default localhost), prints per round
trip:

* Python calls (C calls included, every thread that does the work: for the sync API
  the caller, the IO thread and the dispatcher), counted by ``cProfile``;
* event-loop iterations (``BaseEventLoop._run_once``) and ``epoll``/``select`` polls;
* client CPU µs (``time.process_time()``, the whole process, so the IO thread too),
  measured without the profiler; the median of ``--runs`` runs.

The counts are deterministic (a busy machine does not move them); the CPU figure is
the one to compare with ``make bench`` S5. The async loop is the harness's: a plain
``basic_consume`` callback sets a future the publishing task awaits. The sync loop is
the harness's too: ``basic_publish`` then ``next()`` of a ``channel.consume()``
iterator. ``--api async-rpc sync-rpc`` measures a blocking call instead: one
``queue_declare(passive=True)`` round trip to the broker. ``--top K`` also lists the K
most-called functions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import rabbitry  # noqa: E402
from integration.perf_paths import Measurement, _on_all_threads, _Profiles  # noqa: E402

BODY = b"x" * 128
WARMUP = 500


def _loop_counts(m: Measurement) -> tuple[float, float]:
    """Loop iterations and polls per round trip, from the profile."""
    runs = polls = 0
    for (filename, _line, name), count in m.calls.items():
        if name == "_run_once" and filename.endswith("base_events.py"):
            runs += count
        elif filename == "~" and (
            "'poll' of 'select.epoll'" in name or "'select' of 'select" in name
        ):
            polls += count
    return runs / m.n, polls / m.n


# ---------------------------------------------------------------------- async


async def _async_run(url: str, n: int, runs: int) -> tuple[Measurement, list[float]]:
    queue = f"rabbitry-rtt-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    async with rabbitry.AsyncConnection(url) as conn:
        ch = await conn.channel()
        await ch.queue_declare(queue, exclusive=True)
        fut: asyncio.Future[None] = loop.create_future()

        def on_message(message: rabbitry.Message) -> None:
            fut.set_result(None)

        await ch.basic_consume(queue, on_message, no_ack=True)
        publish = ch.basic_publish

        async def phase(k: int) -> None:
            nonlocal fut
            for _ in range(k):
                fut = loop.create_future()
                await publish("", queue, BODY)
                await fut

        await phase(WARMUP)
        profiles = _Profiles()
        profile = profiles.new()
        profile.enable()
        try:
            await phase(n)
        finally:
            profile.disable()
        m = Measurement("async", n, profiles.calls())
        cpu = []
        for _ in range(runs):
            t0 = time.process_time()
            await phase(n)
            cpu.append((time.process_time() - t0) / n * 1e6)
        return m, cpu


def run_async(url: str, n: int, runs: int) -> tuple[Measurement, list[float]]:
    return asyncio.run(_async_run(url, n, runs))


async def _async_rpc(url: str, n: int, runs: int) -> tuple[Measurement, list[float]]:
    queue = f"rabbitry-rtt-{uuid.uuid4().hex[:8]}"
    async with rabbitry.AsyncConnection(url) as conn:
        ch = await conn.channel()
        await ch.queue_declare(queue, exclusive=True)
        declare = ch.queue_declare

        async def phase(k: int) -> None:
            for _ in range(k):
                await declare(queue, passive=True)

        await phase(WARMUP)
        profiles = _Profiles()
        profile = profiles.new()
        profile.enable()
        try:
            await phase(n)
        finally:
            profile.disable()
        m = Measurement("async-rpc", n, profiles.calls())
        cpu = []
        for _ in range(runs):
            t0 = time.process_time()
            await phase(n)
            cpu.append((time.process_time() - t0) / n * 1e6)
        return m, cpu


def run_async_rpc(url: str, n: int, runs: int) -> tuple[Measurement, list[float]]:
    return asyncio.run(_async_rpc(url, n, runs))


# ----------------------------------------------------------------------- sync


def run_sync(url: str, n: int, runs: int) -> tuple[Measurement, list[float]]:
    queue = f"rabbitry-rtt-{uuid.uuid4().hex[:8]}"
    with rabbitry.Connection(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, exclusive=True)
        it = ch.consume(queue, no_ack=True)
        publish = ch.basic_publish

        def phase(k: int) -> None:
            for _ in range(k):
                publish("", queue, BODY)
                next(it)

        phase(WARMUP)
        profiles = _Profiles()
        with _on_all_threads(conn, profiles):
            phase(n)
        m = Measurement("sync", n, profiles.calls())
        cpu = []
        for _ in range(runs):
            t0 = time.process_time()
            phase(n)
            cpu.append((time.process_time() - t0) / n * 1e6)
        it.close()
        return m, cpu


def run_sync_rpc(url: str, n: int, runs: int) -> tuple[Measurement, list[float]]:
    queue = f"rabbitry-rtt-{uuid.uuid4().hex[:8]}"
    with rabbitry.Connection(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, exclusive=True)
        declare = ch.queue_declare

        def phase(k: int) -> None:
            for _ in range(k):
                declare(queue, passive=True)

        phase(WARMUP)
        profiles = _Profiles()
        with _on_all_threads(conn, profiles):
            phase(n)
        m = Measurement("sync-rpc", n, profiles.calls())
        cpu = []
        for _ in range(runs):
            t0 = time.process_time()
            phase(n)
            cpu.append((time.process_time() - t0) / n * 1e6)
        return m, cpu


RUNNERS: dict[str, Any] = {
    "async": run_async,
    "sync": run_sync,
    "async-rpc": run_async_rpc,
    "sync-rpc": run_sync_rpc,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="round trips per measured run")
    ap.add_argument("--runs", type=int, default=5, help="CPU runs (the median is shown)")
    ap.add_argument("--api", nargs="+", default=["async", "sync"], choices=list(RUNNERS))
    ap.add_argument("--top", type=int, default=0, help="also list the K most-called functions")
    args = ap.parse_args()
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    for api in args.api:
        m, cpu = RUNNERS[api](url, args.n, args.runs)
        iterations, polls = _loop_counts(m)
        print(
            f"{api}: {m.calls_per_msg:.1f} calls, {iterations:.2f} loop iterations, "
            f"{polls:.2f} polls, {statistics.median(cpu):.1f} CPU µs per round trip "
            f"(CPU runs: {', '.join(f'{c:.1f}' for c in cpu)})"
        )
        for name, per_msg in m.top(args.top):
            print(f"  {per_msg:7.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
