"""The peer benchmark's runner and report (``bench/peers/run_peers.py``, ``bench/bench_report.py``)
on a hand-made results file: which clients they accept and what they print. No broker: the
runner only re-renders (``--from-raw``) and the report only prints. Each script runs in a child
process, as ``make bench`` runs it, so its ``sys.path`` entries stay out of this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_PEERS = ROOT / "bench" / "peers" / "run_peers.py"
REPORT = ROOT / "bench" / "bench_report.py"

META = {
    "date": "2026-01-01",
    "repeats": 1,
    "elapsed_min": 0.1,
    "broker_version": "3.x",
    "broker_platform": "Erlang",
    "cpus": 2,
    "kernel": "6.x",
    "python": "3.11",
    "versions": ["rabbitry 0"],
}
# (client, scenario): (msgs/s, client CPU µs/msg)
CELLS = {
    ("raw", "s2b"): (10_000.0, 1.0),
    ("rabbitry_async", "s2b"): (12_000.0, 3.0),
    ("rabbitry_publisher_each", "s2b"): (20_000.0, 6.0),
    ("pika_select", "s2b"): (7_000.0, 18.0),
    ("raw", "s4"): (20_000.0, 2.0),
    ("rabbitry_sync", "s4"): (15_000.0, 10.0),
    ("rabbitry_consumer_sync", "s4"): (5_000.0, 100.0),
    ("pika_select", "s4"): (9_000.0, 20.0),
}


def write_raw(path: Path) -> Path:
    with path.open("w") as f:
        for (client, scenario), (rate, cpu) in CELLS.items():
            result = {
                "client": client,
                "scenario": scenario,
                "n": 1000,
                "msgs_per_s": rate,
                "cpu_us_per_msg": cpu,
                "broker_cpu_us_per_msg": 20.0,
                "other_cores": 0.5,
                "notes": [],
            }
            f.write(json.dumps(result) + "\n")
        f.write(json.dumps({"meta": META}) + "\n")
    return path


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    # Nothing listens on port 1: a script that tried to reach a broker would fail at once.
    env = dict(os.environ, BENCH_AMQP_HOST="127.0.0.1", BENCH_AMQP_PORT="1")
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=env,
    )


def test_the_default_clients_include_the_publisher_each_and_sync_consumer_rows(
    tmp_path: Path,
) -> None:
    # No --clients: the default list. Rows of clients outside it are dropped from the tables.
    proc = run(RUN_PEERS, "--from-raw", write_raw(tmp_path / "run.raw"), "--no-write")
    assert proc.returncode == 0, proc.stderr
    assert "| rabbitry AsyncPublisher (future each) | 20.0k |  |" in proc.stdout
    assert "| rabbitry Consumer (sync handler) |  | 5.00k |" in proc.stdout


def test_clients_option_accepts_the_new_rows_by_name(tmp_path: Path) -> None:
    raw = write_raw(tmp_path / "run.raw")
    proc = run(
        RUN_PEERS,
        "--from-raw",
        raw,
        "--no-write",
        "--clients",
        "raw,rabbitry_publisher_each,rabbitry_consumer_sync",
        "--scenarios",
        "s2b,s4",
    )
    assert proc.returncode == 0, proc.stderr
    assert "| rabbitry AsyncPublisher (future each) | 20.0k |  |" in proc.stdout
    assert "| rabbitry Consumer (sync handler) |  | 5.00k |" in proc.stdout
    assert "pika" not in proc.stdout


def test_an_unknown_client_name_is_refused_before_any_run() -> None:
    # Refused while parsing arguments, before connecting (which would fail: port 1).
    proc = run(RUN_PEERS, "--clients", "raw,rabbitry_publisher_eachh", "--no-write")
    assert proc.returncode == 2
    assert "unknown --clients rabbitry_publisher_eachh" in proc.stderr
    assert "rabbitry_consumer_sync" in proc.stderr  # the known names are listed


def test_report_puts_the_new_rows_against_the_limit_and_their_channel_api(
    tmp_path: Path,
) -> None:
    proc = run(REPORT, write_raw(tmp_path / "run.raw"), "--print")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "against the limit and the channel API" in out
    # msgs/s, ÷ limit, CPU, the channel-level row's CPU (rabbitry_async / rabbitry_sync), ÷ it
    assert (
        "| S2B | rabbitry AsyncPublisher (future each) | 20.0k | 2.00 | 6.0 | 3.0 | 2.00 |" in out
    )
    assert "| S4 | rabbitry Consumer (sync handler) | 5.00k | 0.25 | 100 | 10.0 | 10.00 |" in out


def test_report_never_takes_a_rabbitry_row_for_the_best_peer(tmp_path: Path) -> None:
    # The publisher row is the fastest S2b row of the file; the best peer is still pika.
    proc = run(REPORT, write_raw(tmp_path / "run.raw"), "--print")
    assert proc.returncode == 0, proc.stderr
    assert "| S2B | rabbitry AsyncConnection | 1.20 | pika SelectConnection 7.00k |" in proc.stdout
    assert "| S4 | rabbitry Connection (sync) | 0.75 | pika SelectConnection 9.00k |" in proc.stdout
