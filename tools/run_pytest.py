"""Run the whole pytest suite the way ``make test`` does: in parallel, then the serial tests.

Two pytest sessions, one after the other (docs/testing.md, "Parallel and serial phases"):

1. ``--phase parallel``: every test not marked ``serial``, on ``--workers`` pytest-xdist
   workers with ``--dist loadgroup``, so each ``xdist_group`` (the 3-node cluster, the
   Spark session, the management node) stays on one worker.
2. ``--phase serial``: the tests marked ``serial`` (performance budgets, RSS soaks), in
   this process alone, after everything else: they count calls and bytes and must not
   share the machine with the rest of the suite.

Both run with ``--fail-on-skip`` (tests/conftest.py): a skipped test fails the run.
Extra arguments after ``--`` go to both sessions (``-x``, ``-k``, paths, ``-m``...).

Exit status: the first failing session's status. A session that selects nothing (pytest's
exit status 5) is fine as long as the other one ran tests; when neither ran any, the
status is 5, so a run that tested nothing still fails the build.

Usage::

    python tools/run_pytest.py [--workers N] [--junit-dir DIR] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED


def combine(statuses: list[int]) -> int:
    """The overall exit status of the sessions (see the module docstring)."""
    failed = [status for status in statuses if status not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    if all(status == NO_TESTS for status in statuses):
        return NO_TESTS
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="pytest-xdist workers for the parallel phase; 0 runs it in this process",
    )
    parser.add_argument(
        "--junit-dir",
        type=Path,
        help="write parallel.xml and serial.xml (JUnit XML) into this directory",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to both pytest sessions")
    args = parser.parse_args(argv)

    phases: list[tuple[str, list[str]]] = [
        ("parallel", ["-n", str(args.workers), "--dist", "loadgroup"] if args.workers else []),
        ("serial", ["-p", "no:xdist"]),
    ]
    statuses: list[int] = []
    for phase, options in phases:
        command = [sys.executable, "-m", "pytest", f"--phase={phase}", "--fail-on-skip", *options]
        if args.junit_dir is not None:
            args.junit_dir.mkdir(parents=True, exist_ok=True)
            command.append(f"--junitxml={args.junit_dir / f'{phase}.xml'}")
        command += args.pytest_args
        print(f"run_pytest: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        status = subprocess.run(command, check=False).returncode
        print(
            f"run_pytest: {phase} phase: exit status {status} "
            f"in {time.monotonic() - started:.0f} s",
            flush=True,
        )
        statuses.append(status)
    return combine(statuses)


if __name__ == "__main__":
    sys.exit(main())
