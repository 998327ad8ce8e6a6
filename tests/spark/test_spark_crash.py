"""The driver is SIGKILLed (whole process group) mid-batch and restarted from its checkpoint."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import publish, settled_depth, spark_env

import rabbitry

if TYPE_CHECKING:
    from collections.abc import Iterator

# Two drivers start, get killed and restart; slow machines need more than the default.
pytestmark = pytest.mark.timeout(480)

_SCRIPT = Path(__file__).with_name("crash_driver.py")
_TOTAL = 5000


def _run(
    queue: str, kind: str, checkpoint: Path, out: Path, block_at: int
) -> subprocess.Popen[Any]:
    options = {
        "queue": queue,
        "queueType": kind,
        "maxMessagesPerBatch": "1000",
        "maxRecordsPerTrigger": "1000",
    }
    if kind == "stream":  # offset ranges read in parallel; a queue has one consumer
        options["numPartitions"] = "2"
    config = {
        "master": "local[2]",
        "block_at": block_at,
        "queries": [{"options": options, "checkpoint": str(checkpoint), "out": str(out)}],
    }
    path = out.parent / f"driver-{block_at}.json"
    path.write_text(json.dumps(config))
    return subprocess.Popen(
        [sys.executable, str(_SCRIPT), str(path)],
        env=spark_env(),
        start_new_session=True,  # its own process group: the JVM and workers die with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kill_in_batch(queue: str, kind: str, tmp_path: Path) -> tuple[Path, Path]:
    checkpoint, out = tmp_path / "chk", tmp_path / "out"
    out.mkdir()
    proc = _run(queue, kind, checkpoint, out, block_at=2)
    try:
        deadline = time.monotonic() + 200
        while not (out / "in-batch-2").exists():
            assert proc.poll() is None, "the driver exited before batch 2"
            assert time.monotonic() < deadline, "batch 2 never started"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert not (out / "batch-2.json").exists()
    restart = _run(queue, kind, checkpoint, out, block_at=-1)
    assert restart.wait(240) == 0
    return checkpoint, out


def _rows(out: Path) -> dict[int, list[list[Any]]]:
    return {
        int(path.stem.split("-")[1]): json.loads(path.read_text())
        for path in out.glob("batch-*.json")
    }


@pytest.fixture(scope="module")
def crashed(url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Both scenarios (classic, stream) run at once: the Spark start-ups dominate."""
    results: dict[str, Any] = {}
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        queues = {}
        for kind in ("classic", "stream"):
            name = f"rabbitry-spark-crash-{kind}-{uuid.uuid4().hex[:8]}"
            arguments = {"x-queue-type": kind} if kind == "stream" else {}
            channel.queue_declare(name, durable=True, arguments=arguments)
            queues[kind] = name
            publish(conn, name, _TOTAL)
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futures = {
                    kind: pool.submit(_kill_in_batch, queue, kind, tmp_path_factory.mktemp(kind))
                    for kind, queue in queues.items()
                }
                for kind, future in futures.items():
                    try:
                        results[kind] = future.result()
                    except Exception as exc:  # reported by the test of that kind
                        results[kind] = exc
            results["classic-depth"] = settled_depth(conn, queues["classic"])
            yield results
        finally:
            for name in queues.values():
                channel.queue_delete(name)


def _result(crashed: dict[str, Any], kind: str) -> tuple[Path, Path]:
    result = crashed[kind]
    if isinstance(result, Exception):
        raise result
    return result  # type: ignore[no-any-return]


def test_classic_driver_killed_mid_batch(crashed: dict[str, Any]) -> None:
    _, out = _result(crashed, "classic")
    rows = [row for batch in _rows(out).values() for row in batch]
    bodies = [row[0] for row in rows]
    assert set(bodies) == set(range(_TOTAL))  # missing = 0
    counts: dict[int, int] = {}
    for body in bodies:
        counts[body] = counts.get(body, 0) + 1
    duplicated = {body for body, count in counts.items() if count > 1}
    assert all(row[1] for row in rows if row[0] in duplicated)  # flagged redelivered
    # batch 2 (planned, never committed) came back through redelivery
    assert sum(1 for row in rows if row[1]) >= 1000
    assert crashed["classic-depth"] == 0  # everything acked, nothing requeued


def test_stream_driver_killed_mid_batch_replays_identical_ranges(
    crashed: dict[str, Any],
) -> None:
    checkpoint, out = _result(crashed, "stream")
    batches = _rows(out)
    offsets = [row[2] for batch in batches.values() for row in batch]
    assert sorted(offsets) == list(range(_TOTAL))  # 0 missing, 0 duplicates

    def end_of(batch_id: int) -> int:
        lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
        return int(json.loads(lines[-1])["offset"])

    # batch 2 was replayed with exactly the range written to the offset log before the kill
    assert sorted(row[2] for row in batches[2]) == list(range(end_of(1), end_of(2)))
