"""Streaming reads on a Spark standalone cluster survive every kind of kill, losing nothing.

A master and two workers on 127.0.0.1 (``spark_cluster``); three driver subprocesses,
one application each with one executor (spread over the workers), read a classic queue, a stream
(2 Spark partitions) and a super stream of 2 partitions at once, with
``Trigger.AvailableNow`` and an idempotent sink keyed by batch id. While they run:

1. every Python worker under the executors is ``SIGKILL``ed (stream reads run there),
2. a worker JVM is ``SIGKILL``ed (its executors go with it: their applications get new
   ones on the other worker), then started again,
3. each driver is ``SIGKILL``ed with its process group inside a micro-batch,

and new drivers restart the queries from their checkpoints. Then: the classic queue is
at-least-once (every message is in the output, every duplicate is flagged
``redelivered``, the queue is empty); the stream and the super stream are exactly-once
(every offset of every partition once).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import publish, settled_depth, spark_env
from tests.support.spark_standalone import kill_process_group

import rabbitry
from rabbitry import OutgoingMessage
from rabbitry.topology import SuperStream, partition_for, super_stream

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from tests.support.spark_standalone import SparkStandalone

pytestmark = [
    # Six drivers and their executors start on a busy 2-core machine: a deadline, not a measure.
    pytest.mark.timeout(900),
    # What Spark's processes do when killed does not depend on the broker's version; the
    # source's reads on RabbitMQ 4.x are checked by the other Spark tests in that run.
    pytest.mark.main_pass_only,
    # About 3 minutes of JVM starts on 2 cores: run by make test-spark-cluster, not make test.
    pytest.mark.spark_cluster,
]

_DRIVER = Path(__file__).with_name("crash_driver.py")
_TOTAL = 4000
_BATCH = 500  # 8 micro-batches per query
_BLOCK_AT = 6  # the batch the driver is killed in
_WAIT = 400.0


@dataclass
class Crash:
    """What happened to one driver's queries, for the tests to check."""

    outs: dict[str, Path] = field(default_factory=dict)
    checkpoints: dict[str, Path] = field(default_factory=dict)
    python_workers_killed: list[int] = field(default_factory=list)
    worker_killed: int = 0
    classic_depth: int = -1
    super_stream: SuperStream | None = None
    error: BaseException | None = None

    def rows(self, kind: str) -> dict[int, list[list[Any]]]:
        """Batch id -> rows ``[body, redelivered, offset, queue]`` of query ``kind``."""
        return {
            int(path.stem.split("-")[1]): json.loads(path.read_text())
            for path in self.outs[kind].glob("batch-*.json")
        }

    def check(self) -> None:
        if self.error is not None:
            raise self.error


def _driver(config: dict[str, Any], path: Path) -> subprocess.Popen[Any]:
    path.write_text(json.dumps(config))
    with (path.parent / f"{path.stem}.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(_DRIVER), str(path)],
            env=spark_env(),
            start_new_session=True,  # its own process group: the JVM goes with it
            stdout=subprocess.DEVNULL,
            stderr=log,
        )


def _wait(drivers: dict[str, subprocess.Popen[Any]], what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _WAIT
    while not done():
        for kind, proc in drivers.items():
            status = proc.poll()
            assert status is None, f"the {kind} driver exited (status {status}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {_WAIT:.0f} s"
        time.sleep(0.2)


def _batches(out: Path) -> int:
    return sum(1 for _ in out.glob("batch-*.json"))


def _declare(conn: rabbitry.Connection, run: str) -> tuple[dict[str, dict[str, str]], Any]:
    """The three sources, filled with ``_TOTAL`` messages each; their options, the cleanup."""
    channel = conn.channel()
    classic, stream = f"rabbitry-cluster-classic-{run}", f"rabbitry-cluster-stream-{run}"
    channel.queue_declare(classic, durable=True)
    channel.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    publish(conn, classic, _TOTAL)
    publish(conn, stream, _TOTAL)
    layout = SuperStream(f"rabbitry-cluster-super-{run}", 2)
    topology = super_stream(layout.name, layout.partitions)
    topology.apply(conn)
    messages = [
        OutgoingMessage(str(n), exchange=layout.name, routing_key=layout.binding_key_for(str(n)))
        for n in range(_TOTAL)
    ]
    with conn.publisher(max_in_flight=2000, mandatory=True) as publisher:
        assert not [o for o in publisher.publish_batch(messages) if o is not None]

    def delete() -> None:
        channel.queue_delete(classic)
        channel.queue_delete(stream)
        topology.delete(conn)
        channel.close()

    options = {
        "classic": {"queue": classic, "maxMessagesPerBatch": str(_BATCH)},
        "stream": {
            "queue": stream,
            "queueType": "stream",
            "numPartitions": "2",
            "maxRecordsPerTrigger": str(_BATCH),
        },
        "super": {
            "superStream": layout.name,
            "superStreamPartitions": str(layout.partitions),
            "maxRecordsPerTrigger": str(_BATCH),
        },
    }
    return options, (layout, delete)


def _run_and_kill(
    cluster: SparkStandalone, crash: Crash, options: dict[str, Any], base: Path
) -> None:
    configs = {}
    for kind, opts in options.items():
        crash.outs[kind], crash.checkpoints[kind] = base / f"out-{kind}", base / f"chk-{kind}"
        crash.outs[kind].mkdir()
        query = {
            "options": opts,
            "out": str(crash.outs[kind]),
            "checkpoint": str(crash.checkpoints[kind]),
        }
        # One application per source, each with one executor of one core.
        configs[kind] = {
            "master": cluster.master_url,
            "cores": 1,
            "block_at": _BLOCK_AT,
            "queries": [query],
        }
    outs = list(crash.outs.values())

    def every(count: int) -> Callable[[], bool]:
        return lambda: all(_batches(out) >= count for out in outs)

    drivers = {kind: _driver(config, base / f"{kind}-1.json") for kind, config in configs.items()}
    try:
        _wait(drivers, "a first micro-batch of every query", every(1))
        _wait(drivers, "a Python worker on an executor", lambda: bool(cluster.python_worker_pids()))
        crash.python_workers_killed = cluster.kill_python_workers()

        _wait(drivers, "3 micro-batches of every query", every(3))
        cluster.kill_worker(0)
        crash.worker_killed += 1
        _wait(drivers, "4 micro-batches of every query", every(4))
        cluster.start_worker(0)

        blocked = [out / f"in-batch-{_BLOCK_AT}" for out in outs]
        _wait(drivers, f"batch {_BLOCK_AT} of every query", lambda: all(map(Path.exists, blocked)))
    finally:
        _kill(drivers.values())
    for out in outs:
        assert not (out / f"batch-{_BLOCK_AT}.json").exists()

    restarts = {}
    for kind, config in configs.items():
        config["block_at"] = -1
        restarts[kind] = _driver(config, base / f"{kind}-2.json")
    try:
        deadline = time.monotonic() + _WAIT
        for kind, restart in restarts.items():
            status = restart.wait(max(1.0, deadline - time.monotonic()))
            log = (base / f"{kind}-2.log").read_text(errors="replace")[-3000:]
            assert status == 0, f"the restarted {kind} driver exited with {status}:\n{log}"
    finally:
        _kill(restarts.values())


def _kill(drivers: Iterable[subprocess.Popen[Any]]) -> None:
    """SIGKILL each driver's process group (its JVM and Python workers) and reap it."""
    for driver in drivers:
        kill_process_group(driver, timeout=60)


@pytest.fixture(scope="module")
def crash(
    spark_cluster: SparkStandalone, url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Crash]:
    with rabbitry.Connection(url) as conn:
        options, (layout, delete) = _declare(conn, uuid.uuid4().hex[:8])
        result = Crash(super_stream=layout)
        try:
            base = tmp_path_factory.mktemp("cluster-crash")
            _run_and_kill(spark_cluster, result, options, base)
        except BaseException as exc:  # each test reports it
            result.error = exc
        try:
            result.classic_depth = settled_depth(conn, options["classic"]["queue"])
            yield result
        finally:
            delete()


def test_every_fault_was_injected(crash: Crash) -> None:
    crash.check()
    assert crash.python_workers_killed
    assert crash.worker_killed == 1


def test_classic_queue_loses_nothing_and_flags_every_duplicate(crash: Crash) -> None:
    crash.check()
    rows = [row for batch in crash.rows("classic").values() for row in batch]
    counts = collections.Counter(row[0] for row in rows)
    assert set(counts) == set(range(_TOTAL))  # missing = 0
    duplicated = {body for body, count in counts.items() if count > 1}
    assert all(row[1] for row in rows if row[0] in duplicated)  # flagged redelivered
    assert crash.classic_depth == 0  # everything acked, nothing requeued


def test_stream_reads_every_offset_once_and_replays_the_logged_range(crash: Crash) -> None:
    crash.check()
    batches = crash.rows("stream")
    offsets = [row[2] for batch in batches.values() for row in batch]
    assert sorted(offsets) == list(range(_TOTAL))  # 0 missing, 0 duplicates

    def end_of(batch_id: int) -> int:
        path = crash.checkpoints["stream"] / "offsets" / str(batch_id)
        return int(json.loads(path.read_text().splitlines()[-1])["offset"])

    # the batch the driver died in ran again with the range logged before the kill
    replayed = sorted(row[2] for row in batches[_BLOCK_AT])
    assert replayed == list(range(end_of(_BLOCK_AT - 1), end_of(_BLOCK_AT)))


def test_super_stream_reads_every_offset_of_every_partition_once(crash: Crash) -> None:
    crash.check()
    layout = crash.super_stream
    assert layout is not None
    rows = [row for batch in crash.rows("super").values() for row in batch]
    assert sorted(row[0] for row in rows) == list(range(_TOTAL))  # 0 missing, 0 duplicates
    for row in rows:
        assert row[3] == layout.queues[partition_for(str(row[0]), layout.partitions)]
    for queue in layout.queues:
        offsets = sorted(row[2] for row in rows if row[3] == queue)
        assert offsets == list(range(len(offsets)))
