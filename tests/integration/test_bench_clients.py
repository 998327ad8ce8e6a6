"""Smoke runs of the peer benchmark's high-level rabbitry rows against the broker.

Each case runs ``bench/peers/worker.py`` once, as ``run_peers.py`` does, with a small
count, and checks from its ``RESULT`` line that every message went through: every publish
confirmed (``rabbitry_publisher_each``), every pre-filled message delivered and acked
(``rabbitry_consumer_sync``). The figures it measures are not checked. The harness logs in
as guest/guest; the host and port come from ``RABBITMQ_URL``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rabbitry.config import parse_urls

if TYPE_CHECKING:
    import rabbitry

    from .conftest import Names

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "bench" / "peers"
# More than one confirm window (1000) with a shorter last chunk; more than the prefetch
# (1000) and not a multiple of the S4m batch (100), so a last partial batch is settled.
PUBLISH_COUNT = 2_150
CONSUME_COUNT = 1_050


async def run_worker(url: str, client: str, scenario: str, queue: str, n: int) -> dict[str, Any]:
    params = parse_urls(url)[0]
    env = dict(
        os.environ,
        BENCH_AMQP_HOST=params.host,
        BENCH_AMQP_PORT=str(params.port),
        # This checkout's rabbitry, whatever the environment has installed.
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PEERS / "worker.py"),
        client,
        scenario,
        queue,
        str(n),
        cwd=PEERS,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, f"worker failed:\n{out.decode()}\n{err.decode()}"
    lines = [line for line in out.decode().splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"no RESULT line:\n{out.decode()}\n{err.decode()}"
    result: dict[str, Any] = json.loads(lines[0][len("RESULT ") :])
    assert "msgs_per_s" in result, result  # not "unsupported" or "error"
    assert result["n"] == n
    return result


@pytest.mark.parametrize("scenario", ["s2b", "s3"])
async def test_publisher_each_confirms_every_message(url: str, names: Names, scenario: str) -> None:
    queue = names.queue()  # the worker declares and deletes it; the fixture is the backstop
    result = await run_worker(url, "rabbitry_publisher_each", scenario, queue, PUBLISH_COUNT)
    assert result["confirmed"] == PUBLISH_COUNT
    assert not [note for note in result["notes"] if "failed" in note], result["notes"]


@pytest.mark.parametrize("scenario", ["s4", "s4m"])
async def test_sync_consumer_acks_every_prefilled_message(
    url: str, conn: rabbitry.AsyncConnection, names: Names, scenario: str
) -> None:
    queue = names.queue()
    ch = await conn.channel()
    await ch.queue_declare(queue)
    publisher = await conn.publisher()
    outcomes = await publisher.publish_batch([b"x" * 128] * CONSUME_COUNT, routing_key=queue)
    assert outcomes == [None] * CONSUME_COUNT
    await publisher.close()

    result = await run_worker(url, "rabbitry_consumer_sync", scenario, queue, CONSUME_COUNT)
    stats = result["consumer_stats"]
    assert stats["delivered"] == CONSUME_COUNT
    assert stats["acked"] == CONSUME_COUNT
    assert stats["failed"] == stats["requeued"] == stats["released"] == 0
