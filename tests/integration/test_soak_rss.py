"""A short RSS soak: publish + consume at full speed in a child process and
check that its RSS stays flat after the warm-up. A size check, not a timing one: the
child runs ``bench/soak_rss.py`` (the 10-minute soak of docs/benchmarks.md) for a few
seconds per API, both APIs at once; a leak of even ~100 bytes per message grows RSS by
several MB here. About 13 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak_rss.py"
SECONDS = 12
WARMUP = 4
MAX_GROWTH_PCT = 10.0

# Counts calls and bytes: runs alone, after the rest of the suite (tools/run_pytest.py).
pytestmark = pytest.mark.serial


APIS = ("async", "sync")


@pytest.fixture(scope="module")
def soaks(url: str) -> Iterator[dict[str, subprocess.Popen[str]]]:
    """Both soaks, started together: each child measures its own RSS, so they need not
    take turns (a slower child sends fewer messages; the check is on size, not speed)."""
    env = dict(os.environ, RABBITMQ_URL=url)
    children = {
        api: subprocess.Popen(
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
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for api in APIS
    }
    yield children
    for child in children.values():  # one a test selection left out
        if child.poll() is None:
            child.kill()
            child.communicate()


@pytest.mark.parametrize("api", APIS)
def test_rss_stays_flat_while_publishing_and_consuming(
    soaks: dict[str, subprocess.Popen[str]], api: str
) -> None:
    proc = soaks[api]
    try:
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"soak failed:\n{stdout}\n{stderr}"
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["messages"] > 0
    assert summary["growth_pct_max"] <= MAX_GROWTH_PCT, (
        f"{api}: RSS grew {summary['growth_pct_max']} % after the warm-up "
        f"({summary['rss_after_warmup_kib']} -> {summary['rss_max_kib']} KiB over "
        f"{summary['messages']} messages); limit {MAX_GROWTH_PCT} %: {summary}"
    )
