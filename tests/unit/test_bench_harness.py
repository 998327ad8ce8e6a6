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


# A second run for the goals table: S5 with latencies, S4 with no raw cell (S4m has one),
# S1 with the AsyncPublisher but not its "future each" variant, which has no S1.
GOAL_CELLS = {
    ("raw", "s5"): (5_000.0, 30.0),
    ("rabbitry_async", "s5"): (4_500.0, 20.0),
    ("rabbitry_sync", "s5"): (3_000.0, 60.0),
    ("raw", "s1"): (50_000.0, 0.1),
    ("rabbitry_async", "s1"): (48_000.0, 2.0),
    ("rabbitry_sync", "s1"): (40_000.0, 2.4),
    ("rabbitry_publisher", "s1"): (45_000.0, 2.2),
    ("pika_select", "s1"): (30_000.0, 13.2),
    ("rabbitry_async", "s4"): (30_000.0, 10.0),
    ("raw", "s4m"): (40_000.0, 4.0),
    ("rabbitry_async", "s4m"): (38_000.0, 8.0),
}
# (client, scenario): (p50 µs, p99 µs) of the S5 cells
LATENCY = {
    ("raw", "s5"): (150.0, 300.0),
    ("rabbitry_async", "s5"): (180.0, 400.0),
    ("rabbitry_sync", "s5"): (300.0, 600.0),
}


def write_raw(path: Path, cells: dict[tuple[str, str], tuple[float, float]] = CELLS) -> Path:
    with path.open("w") as f:
        for (client, scenario), (rate, cpu) in cells.items():
            result: dict[str, object] = {
                "client": client,
                "scenario": scenario,
                "n": 1000,
                "msgs_per_s": rate,
                "cpu_us_per_msg": cpu,
                "broker_cpu_us_per_msg": 20.0,
                "other_cores": 0.5,
                "notes": [],
            }
            if (client, scenario) in LATENCY:
                p50, p99 = LATENCY[(client, scenario)]
                result.update(lat_p50_us=p50, lat_p99_us=p99)
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


def test_report_lists_every_goal_with_its_ratio_and_whether_it_is_met(tmp_path: Path) -> None:
    proc = run(REPORT, write_raw(tmp_path / "run.raw"), "--print")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "### Goals in this run" in out
    assert "targets" not in out
    assert "Goal 4's reference peer is\npika SelectConnection (`pika_select`)" in out
    goal_3 = "S2B AsyncPublisher (future each) CPU ≤ 1.2× async channel API"
    assert (
        f"| 3 | {goal_3} | 2.00× | rabbitry_publisher_each 6.0 ÷ rabbitry_async 3.0 µs | no |"
        in out
    )
    goal_4 = "S2B AsyncPublisher (future each): pika CPU ≥ 3× its CPU"
    assert (
        f"| 4 | {goal_4} | 3.00× | pika_select 18.0 ÷ rabbitry_publisher_each 6.0 µs | yes |" in out
    )
    goal_5 = "S4 sync msgs/s ≥ 0.9× raw | 0.75× | rabbitry_sync 15.0k ÷ raw 20.0k msgs/s | no |"
    assert f"| 5 | {goal_5}" in out
    # A goal whose cells the run lacks is listed, not dropped.
    goal_1 = (
        "S5 async p50 ≤ 1.15× raw p50 | no rabbitry_async cell; no raw cell |  | not measured |"
    )
    assert f"| 1 | {goal_1}" in out
    assert (
        "| 2 | sync ≤ 1.3× async client CPU, every scenario | no scenario with both APIs |" in out
    )
    assert out.count("| 3 | ") == 8
    assert out.count("| 4 | ") == 8
    assert out.count("| 5 | ") == 10


def test_goals_use_the_raw_cell_of_the_same_scenario_and_the_s1_publisher(
    tmp_path: Path,
) -> None:
    proc = run(REPORT, write_raw(tmp_path / "run.raw", GOAL_CELLS), "--print")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "| 1 | S5 async msgs/s ≥ 0.85× raw | 0.90× | rabbitry_async 4.50k ÷ raw 5.00k" in out
    assert (
        "| 1 | S5 async p50 ≤ 1.15× raw p50 | 1.20× | rabbitry_async 180 ÷ raw 150 µs | no |" in out
    )
    assert "| 1 | S5 sync msgs/s ≥ 0.75× raw | 0.60× |" in out
    assert (
        "| 1 | S5 async client CPU ≤ 25 µs per round trip | 20.0 µs | rabbitry_async | yes |" in out
    )
    assert "| 1 | S5 sync client CPU ≤ 35 µs per round trip | 60.0 µs | rabbitry_sync | no |" in out
    # S1 1.20, S5 3.00: one over.
    sync_cpu = (
        "| 2 | sync ≤ 1.3× async client CPU, every scenario | max 3.00× (S5) | over in S5 (of 2"
    )
    assert sync_cpu in out
    # No S4 raw cell: not measured, and the S4m limit is not taken instead.
    assert "| 5 | S4 async msgs/s ≥ 0.9× raw | no raw cell |  | not measured |" in out
    assert "| 5 | S4M async msgs/s ≥ 0.9× raw | 0.95× | rabbitry_async 38.0k ÷ raw 40.0k" in out
    # "future each" has no S1: the AsyncPublisher's S1 cell stands for it.
    s1_part = "S1 AsyncPublisher (future each) CPU ≤ 1.2× async channel API | 1.10× |"
    assert f"| 3 | {s1_part} rabbitry_publisher 2.2 ÷ rabbitry_async 2.0 µs | yes |" in out
    s1_pika = "S1 AsyncPublisher (future each): pika CPU ≥ 3× its CPU | 6.00× |"
    assert f"| 4 | {s1_pika} pika_select 13.2 ÷ rabbitry_publisher 2.2 µs | yes |" in out
