"""Benchmark regression check that is not a timing assertion.

Every hot path of ``perf_paths.py`` is measured against the real broker over 2,000
messages in steady state:

* on a channel, async and sync API: publish without confirms (``*.publish``), confirmed
  publish (``*.publish_confirm``), ``publish_batch`` (``*.publish_batch``), consume with
  an ack of each (``*.consume_ack``);
* ``AsyncPublisher.publish`` with every message's confirm future awaited
  (``async.publisher_each``);
* a handler that returns, the consumer acking each message: ``AsyncConsumer`` with an
  async handler (``async.consumer_handler``), ``Consumer`` with a plain one on its
  handler thread (``sync.consumer_handler``).

Two counts per message are compared with the budget recorded in ``perf_budget.json``:

* Python function calls (C calls included, every thread that does the work), within
  ``HEADROOM`` of the recorded figure, however fast or busy the machine is. Timing
  moves some paths' figures by a few percent (how many confirms or deliveries share a
  frame or a read), hence the headroom: the check catches growth of a fifth (some 4
  calls per message on a path of 20, 14 on one of 70); ``bench/profile_paths.py``
  shows smaller changes function by function.
* Bytes left allocated per message after ``gc.collect()`` (tracemalloc): at most
  ``LEAK_BYTES_PER_MSG``, less than the smallest object, so a per-message leak fails.

After a deliberate change (an optimisation, or a feature worth its cost), re-record:

    RABBITRY_PERF_BUDGET_RECORD=1 PYTHONPATH=src .venv/bin/python -m pytest \\
        tests/integration/test_perf_budget.py

which takes the highest of three measurements of each path and rewrites its entry (with
``-k``, only the selected paths' entries change). The whole module takes 10-20 s.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from .perf_paths import PATHS, Measurement, measure

BUDGET_FILE = Path(__file__).with_name("perf_budget.json")
HEADROOM = 1.20
LEAK_BYTES_PER_MSG = 16.0
N = 2000
RECORD = os.environ.get("RABBITRY_PERF_BUDGET_RECORD") == "1"

# Counts calls and bytes: runs alone, after the rest of the suite (tools/run_pytest.py).
pytestmark = pytest.mark.serial


def _load() -> dict[str, dict[str, object]]:
    if not BUDGET_FILE.exists():
        return {}
    data: dict[str, dict[str, object]] = json.loads(BUDGET_FILE.read_text())
    return data


def _record(path: str, runs: list[Measurement]) -> None:
    worst = max(runs, key=lambda m: m.calls_per_msg)
    data = _load()
    data[path] = {
        "calls_per_msg": round(worst.calls_per_msg, 1),
        "calls_budget": round(worst.calls_per_msg * HEADROOM, 1),
        "retained_bytes_per_msg": round(max(m.retained_bytes_per_msg for m in runs), 1),
        "top": {name: round(per_msg, 2) for name, per_msg in worst.top(40)},
    }
    BUDGET_FILE.write_text(json.dumps(dict(sorted(data.items())), indent=2) + "\n")


def _growth_report(m: Measurement, recorded_top: dict[str, float]) -> str:
    now = dict(m.top(40))
    # Below the smallest recorded figure a name may be absent from the recording only
    # because the recording keeps the top 40.
    floor = min(recorded_top.values(), default=0.0)
    rows = []
    for name in sorted(set(now) | set(recorded_top), key=lambda k: -now.get(k, 0.0)):
        before, after = recorded_top.get(name), now.get(name)
        if before is None and (after is None or after <= floor):
            continue
        if before is None or after is None or abs(after - before) >= 0.5:
            rows.append(
                f"    {name}: {'-' if before is None else f'{before:.2f}'} -> "
                f"{'-' if after is None else f'{after:.2f}'} calls/msg"
            )
    return "\n".join(rows[:15]) or "    (no single function moved by 0.5 calls/msg or more)"


@pytest.mark.parametrize("path", PATHS)
def test_calls_and_memory_per_message_stay_within_budget(url: str, path: str) -> None:
    queue = f"rabbitry-test-perf-budget-{path}-{uuid.uuid4().hex[:8]}"
    if RECORD:
        _record(path, [measure(path, url, f"{queue}-{i}", n=N) for i in range(3)])
        return
    budget = _load().get(path)
    assert budget is not None, (
        f"{path}: no budget in {BUDGET_FILE.name}; record one with "
        "RABBITRY_PERF_BUDGET_RECORD=1 (see this module's docstring)"
    )
    m = measure(path, url, queue, n=N)
    calls, retained = m.calls_per_msg, m.retained_bytes_per_msg
    allowed = float(budget["calls_budget"])  # type: ignore[arg-type]
    recorded = float(budget["calls_per_msg"])  # type: ignore[arg-type]
    top: dict[str, float] = budget.get("top", {})  # type: ignore[assignment]
    assert calls <= allowed, (
        f"{path}: {calls:.1f} Python calls per message, above the budget of "
        f"{allowed:.1f} (recorded {recorded:.1f}; now {calls / recorded - 1:+.0%}). "
        f"Functions whose calls per message moved since the recording:\n"
        f"{_growth_report(m, top)}\n"
        "If the growth is deliberate, re-record the budget (see the module docstring)."
    )
    assert retained <= LEAK_BYTES_PER_MSG, (
        f"{path}: {retained:.1f} bytes per message stay allocated after "
        f"{N} messages and gc.collect() (limit {LEAK_BYTES_PER_MSG:.0f}): something is "
        "kept per message (a leak)"
    )
