"""RSS soak: publish and consume at full speed for a while and watch this process's RSS.

    PYTHONPATH=src .venv/bin/python bench/soak_rss.py --minutes 10 [--api async|sync]

One connection publishes 128-byte messages with publisher confirms (a window of 1000
unconfirmed) to a fresh queue, and a consumer on a second connection acks each one
(prefetch 1000). The publisher keeps at most ``--backlog`` messages unconsumed, so the
queue (and the broker's memory) stays small whatever the relative speeds.

RSS (``VmRSS`` of ``/proc/self/status``) is sampled every ``--interval`` seconds. The
first ``--warmup`` seconds are left out of the verdict: imports, buffers and caches
settle there. The summary compares every later sample with the first one after the
warm-up; ``--json`` prints it as one JSON line (what the test suite reads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import uuid
from collections import deque
from typing import Any

import rabbitry

URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
BODY = os.urandom(128)
WINDOW = 1000


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class Sampler:
    """Samples RSS and the message counters on a timer thread."""

    def __init__(self, interval: float, counters: dict[str, int]) -> None:
        self.interval = interval
        self.counters = counters
        self.samples: list[dict[str, float]] = []
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(
                {
                    "t": round(time.monotonic() - self._start, 1),
                    "rss_kib": rss_kib(),
                    "published": self.counters["published"],
                    "consumed": self.counters["consumed"],
                }
            )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def run_async(seconds: float, backlog: int, counters: dict[str, int], queue: str) -> None:
    async with (
        rabbitry.AsyncConnection(URL) as pub_conn,
        rabbitry.AsyncConnection(URL) as sub_conn,
    ):
        pub = await pub_conn.channel()
        await pub.confirm_select()
        await pub.queue_declare(queue)
        sub = await sub_conn.channel()
        await sub.basic_qos(WINDOW)
        room = asyncio.Event()

        def on_message(message: rabbitry.Message) -> None:
            message.ack()
            counters["consumed"] += 1
            if counters["published"] - counters["consumed"] < backlog // 2:
                room.set()

        tag = await sub.basic_consume(queue, on_message)
        pending: deque[asyncio.Future[None]] = deque()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(200):
                if len(pending) >= WINDOW:
                    await pending.popleft()
                    while pending and pending[0].done():
                        pending.popleft().result()
                fut = await pub.basic_publish("", queue, BODY)
                assert fut is not None
                pending.append(fut)
                counters["published"] += 1
            if counters["published"] - counters["consumed"] >= backlog:
                room.clear()
                await room.wait()
        for fut in pending:
            await fut
        while counters["consumed"] < counters["published"]:
            await asyncio.sleep(0.05)
        await sub.basic_cancel(tag)
        await pub.queue_delete(queue)


def run_sync(seconds: float, backlog: int, counters: dict[str, int], queue: str) -> None:
    with rabbitry.Connection(URL) as pub_conn, rabbitry.Connection(URL) as sub_conn:
        pub = pub_conn.channel()
        pub.confirm_select()
        pub.queue_declare(queue)
        sub = sub_conn.channel()
        sub.basic_qos(WINDOW)
        room = threading.Condition()
        lock = threading.Lock()

        def on_message(message: rabbitry.Message) -> None:
            message.ack()
            with lock:
                counters["consumed"] += 1
            if counters["published"] - counters["consumed"] < backlog // 2:
                with room:
                    room.notify()

        tag = sub.basic_consume(queue, on_message)
        pending: deque[Any] = deque()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(200):
                if len(pending) >= WINDOW:
                    pending.popleft().result()
                    while pending and pending[0].done():
                        pending.popleft().result()
                pending.append(pub.basic_publish("", queue, BODY))
                counters["published"] += 1
            with room:
                room.wait_for(
                    lambda: counters["published"] - counters["consumed"] < backlog, timeout=5
                )
        for fut in pending:
            fut.result()
        while counters["consumed"] < counters["published"]:
            time.sleep(0.05)
        sub.basic_cancel(tag)
        pub.queue_delete(queue)


def summarize(samples: list[dict[str, float]], warmup: float, seconds: float) -> dict[str, Any]:
    steady = [s for s in samples if s["t"] >= warmup]
    if len(steady) < 2:
        raise SystemExit("not enough samples after the warm-up: run longer")
    base = steady[0]["rss_kib"]
    peak = max(s["rss_kib"] for s in steady)
    low = min(s["rss_kib"] for s in steady)
    last = steady[-1]
    span = last["t"] - steady[0]["t"]
    return {
        "seconds": seconds,
        "warmup_s": warmup,
        "samples": len(samples),
        "rss_start_kib": samples[0]["rss_kib"],
        "rss_after_warmup_kib": base,
        "rss_min_kib": low,
        "rss_max_kib": peak,
        "rss_end_kib": last["rss_kib"],
        "growth_pct_max": round((peak - base) / base * 100, 2),
        "growth_pct_end": round((last["rss_kib"] - base) / base * 100, 2),
        "drop_pct_min": round((low - base) / base * 100, 2),
        "messages": last["consumed"],
        "msgs_per_s_steady": round(
            (last["consumed"] - steady[0]["consumed"]) / span if span > 0 else 0.0
        ),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="instead of --minutes")
    ap.add_argument("--api", choices=("async", "sync"), default="async")
    ap.add_argument("--warmup", type=float, default=None, help="default: 10%% of the run")
    ap.add_argument("--interval", type=float, default=None, help="default: run / 60, >= 0.5 s")
    ap.add_argument("--backlog", type=int, default=20_000)
    ap.add_argument("--json", action="store_true", help="print only the summary, as JSON")
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else (args.minutes or 10) * 60
    warmup = args.warmup if args.warmup is not None else seconds * 0.1
    interval = args.interval if args.interval is not None else max(0.5, seconds / 60)
    counters = {"published": 0, "consumed": 0}
    queue = f"rabbitry-soak-{uuid.uuid4().hex[:8]}"
    sampler = Sampler(interval, counters)
    sampler.start()
    if args.api == "async":
        asyncio.run(run_async(seconds, args.backlog, counters, queue))
    else:
        run_sync(seconds, args.backlog, counters, queue)
    sampler.stop()
    summary = summarize(sampler.samples, warmup, seconds)
    summary["api"] = args.api
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{'t s':>7} {'RSS KiB':>9} {'published':>10} {'consumed':>10}")
    for s in sampler.samples:
        print(f"{s['t']:7.1f} {s['rss_kib']:9d} {s['published']:10d} {s['consumed']:10d}")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
