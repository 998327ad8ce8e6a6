"""Run the whole pytest suite several times on a fresh clone of HEAD and list what failed.

``make flake-hunt N=5 [LOAD=1]`` runs this. Each run is what ``make test`` runs after
its lint, types and docs steps (``tools/run_pytest.py``: the parallel phase, then the
serial one), in a fresh clone of the committed ``HEAD``, so uncommitted changes and files
that only exist in the working tree (a stale ``.pytest_cache``, generated files) cannot
make it pass.

The clone reuses this tree's virtualenv instead of building its own: its own ``src`` is
put first on ``PYTHONPATH``, and the script checks that ``import rabbitry`` really loads
the clone's code before it starts.

``--rabbitmq4 PATHS`` makes each run also do what ``make test`` does next: the tests under
PATHS again against a RabbitMQ 4.x node (``pytest --rabbitmq4``); a run passes only if
both passes do, and a test that failed in the 4.x pass is listed with ``[4.x]``.
``--spark-cluster PATHS`` adds ``make test``'s last pass: the Spark kill tests under PATHS
on a standalone cluster (``pytest --spark-cluster -m spark_cluster``), alone.

``--load`` keeps one core busy for the whole hunt (a process spinning in a loop, pinned
to the last CPU), the way a busy CI machine would. It is killed at the end.

Output: one line per run (start, duration, exit status, test counts), then every test
that failed at least once, with how many runs it failed in. The logs and JUnit reports
stay in the hunt's directory, printed at the start.

Usage::

    python tools/flake_hunt.py [--runs N] [--load] [--workers W] [--keep-clone]
                               [--rabbitmq4 PATHS] [--spark-cluster PATHS]
                               [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    number: int
    started: datetime.datetime
    seconds: float = 0.0
    status: int | None = None
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    failed: list[str] = field(default_factory=list)

    def line(self) -> str:
        counts = ", ".join(f"{n} {what}" for what, n in sorted(self.counts.items()) if n)
        result = "passed" if self.status == 0 else f"FAILED (exit status {self.status})"
        return (
            f"run {self.number}: {self.started:%Y-%m-%d %H:%M} UTC, "
            f"{self.seconds / 60:.1f} min, {result}; {counts or 'no JUnit report'}"
        )


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_clone(workdir: Path, commit: str) -> Path:
    clone = workdir / "repo"
    git("clone", "--quiet", "--no-checkout", str(ROOT), str(clone))
    git("checkout", "--quiet", "--detach", commit, cwd=clone)
    return clone


def clone_env(clone: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(clone / "src"), str(clone), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.pop("PYTEST_ADDOPTS", None)
    return env


def check_imports_clone(python: Path, clone: Path, env: dict[str, str]) -> None:
    where = subprocess.run(
        [str(python), "-c", "import rabbitry; print(rabbitry.__file__)"],
        cwd=clone,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(clone.resolve()):
        sys.exit(f"flake-hunt: the venv imports rabbitry from {where}, not from the clone")


def start_load() -> subprocess.Popen[bytes]:
    """A process that keeps one CPU busy (the last one, if affinity can be set)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(hog.pid, {cpus[-1]})
    return hog


def read_junit(directory: Path) -> tuple[collections.Counter[str], list[str]]:
    """Outcome counts and the ids of failed tests from the JUnit reports of one run.

    Reports of the RabbitMQ 4.x pass are in the subdirectory ``rabbitmq4``; their tests
    are named with a ``[4.x]`` prefix.
    """
    counts: collections.Counter[str] = collections.Counter()
    failed: list[str] = []
    for report in sorted(directory.rglob("*.xml")):
        prefix = "[4.x] " if report.parent.name == "rabbitmq4" else ""
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("name", "?").split("@", 1)[0]  # drop the xdist_group suffix
            test = f"{prefix}{case.get('classname', '?')}::{name}"
            kinds = {child.tag for child in case}
            skipped = case.find("skipped")
            if kinds & {"failure", "error"}:
                counts["failed" if "failure" in kinds else "errors"] += 1
                failed.append(test)
            elif skipped is not None:
                xfail = skipped.get("type") == "pytest.xfail"
                counts["xfailed" if xfail else "skipped"] += 1
            else:
                counts["passed"] += 1
    return counts, failed


def run_passes(
    python: Path,
    reports: Path,
    *,
    workers: int,
    pytest_args: list[str],
    rabbitmq4: str | None = None,
    spark_cluster: str | None = None,
) -> list[list[str]]:
    """The commands of one run, in ``make test``'s order, each writing JUnit under ``reports``.

    The suite (``tools/run_pytest.py``); then, when asked, the RabbitMQ 4.x pass on the
    paths in ``rabbitmq4`` and the Spark cluster pass on the paths in ``spark_cluster``
    (space-separated).
    """
    suite = [str(python), "tools/run_pytest.py", f"--workers={workers}"]
    passes = [[*suite, f"--junit-dir={reports}", "--", *pytest_args]]
    if rabbitmq4:
        passes.append(
            [
                *suite,
                f"--junit-dir={reports / 'rabbitmq4'}",
                "--",
                "--rabbitmq4",
                *rabbitmq4.split(),
                *pytest_args,
            ]
        )
    if spark_cluster:
        passes.append(
            [
                str(python),
                "-m",
                "pytest",
                "--spark-cluster",
                "-m",
                "spark_cluster",
                "--fail-on-skip",
                f"--junitxml={reports / 'spark-cluster' / 'cluster.xml'}",
                *spark_cluster.split(),
                *pytest_args,
            ]
        )
    return passes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="how many runs (default 5)")
    parser.add_argument("--load", action="store_true", help="keep one core busy meanwhile")
    parser.add_argument(
        "--workers", type=int, default=3, help="pytest-xdist workers (default 3, as make test)"
    )
    parser.add_argument("--keep-clone", action="store_true", help="keep the clone afterwards")
    parser.add_argument(
        "--rabbitmq4",
        metavar="PATHS",
        help="then these tests (space-separated paths) against a RabbitMQ 4.x node, each run",
    )
    parser.add_argument(
        "--spark-cluster",
        metavar="PATHS",
        help="then the Spark kill tests in these paths on a standalone cluster, each run",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to every pytest session")
    args = parser.parse_args(argv)

    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        sys.exit("flake-hunt: no virtualenv in this tree; run `make venv` first")
    commit = git("rev-parse", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no"):
        print("flake-hunt: uncommitted changes are not tested, only HEAD", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="rabbitry-flake-hunt-"))
    clone = make_clone(workdir, commit)
    env = clone_env(clone)
    check_imports_clone(python, clone, env)
    subprocess.run(["bash", "scripts/ensure-broker.sh"], cwd=clone, env=env, check=True)
    print(
        f"flake-hunt: {args.runs} run(s) of {commit[:10]} in {clone}, "
        f"{args.workers} worker(s), load: {'one core busy' if args.load else 'none'}, "
        f"RabbitMQ 4.x pass: {args.rabbitmq4 or 'none'}; "
        f"Spark cluster pass: {args.spark_cluster or 'none'}; "
        f"logs in {workdir}",
        flush=True,
    )

    runs: list[Run] = []
    hog = start_load() if args.load else None
    try:
        for number in range(1, args.runs + 1):
            run = Run(number, datetime.datetime.now(datetime.UTC))
            reports = workdir / f"run-{number}"
            passes = run_passes(
                python,
                reports,
                workers=args.workers,
                pytest_args=args.pytest_args,
                rabbitmq4=args.rabbitmq4,
                spark_cluster=args.spark_cluster,
            )
            started = time.monotonic()
            with (workdir / f"run-{number}.log").open("wb") as log:
                statuses = [
                    subprocess.run(
                        one, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
                    ).returncode
                    for one in passes
                ]
            run.status = next((status for status in statuses if status), 0)
            run.seconds = time.monotonic() - started
            run.counts, run.failed = read_junit(reports)
            runs.append(run)
            print(run.line(), flush=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        if not args.keep_clone:
            shutil.rmtree(clone, ignore_errors=True)

    print("\nflake-hunt: per run")
    for run in runs:
        print(f"  {run.line()}")
    failures = collections.Counter(test for run in runs for test in set(run.failed))
    if failures:
        print(f"flake-hunt: tests that failed at least once (of {len(runs)} runs)")
        for test, count in failures.most_common():
            print(f"  {count}/{len(runs)}  {test}")
    else:
        print(f"flake-hunt: no test failed in {len(runs)} run(s)")
    return 0 if all(run.status == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
