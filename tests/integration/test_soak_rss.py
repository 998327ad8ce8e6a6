"""A short RSS soak: publish + consume at full speed in a child process and
check that its RSS stays flat after the warm-up. A size check, not a timing one: the
child runs ``bench/soak_rss.py`` (the 10-minute soak of docs/benchmarks.md) for a few
seconds per API; a leak of even ~100 bytes per message grows RSS by several MB here.
About 25 s for both APIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak_rss.py"
SECONDS = 12
WARMUP = 4
MAX_GROWTH_PCT = 10.0

# Counts calls and bytes: runs alone, after the rest of the suite (tools/run_pytest.py).
pytestmark = pytest.mark.serial


@pytest.mark.parametrize("api", ["async", "sync"])
def test_rss_stays_flat_while_publishing_and_consuming(url: str, api: str) -> None:
    env = dict(os.environ, RABBITMQ_URL=url)
    proc = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--seconds",
            str(SECONDS),
            "--warmup",
            str(WARMUP),
            "--interval",
            "0.5",
            "--api",
            api,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, f"soak failed:\n{proc.stdout}\n{proc.stderr}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["messages"] > 0
    assert summary["growth_pct_max"] <= MAX_GROWTH_PCT, (
        f"{api}: RSS grew {summary['growth_pct_max']} % after the warm-up "
        f"({summary['rss_after_warmup_kib']} -> {summary['rss_max_kib']} KiB over "
        f"{summary['messages']} messages); limit {MAX_GROWTH_PCT} %: {summary}"
    )
