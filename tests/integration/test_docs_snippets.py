"""The runnable ``python`` blocks of README.md and docs/*.md run against the broker.

Each program runs as written, in a fresh interpreter, in page order (several pages build
on the same queues), with ``RABBITMQ_URL`` pointing at the test broker: the snippets
connect without a URL. A ``sigterm`` program (a service) gets SIGTERM a few seconds
after it has installed a handler for it, and must exit cleanly. Fragments are only
compiled, by ``tests/unit/test_docs_snippets.py``. The queues and exchanges the programs declare are
deleted before and after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.docs_snippets import FRAGMENT, ROOT, SIGTERM, Snippet, snippets

import rabbitry

PROGRAMS = [s for s in snippets() if s.kind != FRAGMENT]

# What the programs declare. A name missing here only leaves a queue or an exchange on
# the test broker; a name here that no program declares costs nothing.
_RETRY_TIERS = (".retry.1s", ".retry.10s", ".retry.60s", ".parking-lot")
QUEUES = [
    "hello",
    "jobs",
    "orders.incoming",
    "orders.outbox",
    "orders.process",
    *("orders.process" + tier for tier in _RETRY_TIERS),
    "invoices.billing",
    *("invoices.billing" + tier for tier in _RETRY_TIERS),
    "invoices.unroutable",
    "tutorial.tasks",
    "tutorial.rpc_queue",
    "tutorial.confirms",
    "tutorial.service",
]
EXCHANGES = [
    "orders",
    "orders.process.dlx",
    "invoices",
    "invoices.unrouted",
    "invoices.billing.dlx",
    "tutorial.logs",
    "tutorial.direct_logs",
    "tutorial.topic_logs",
]

RUN_TIMEOUT = 60.0
SERVICE_SECONDS = 3.0


def _delete_everything(url: str) -> None:
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        for queue in QUEUES:
            channel.queue_delete(queue, timeout=10)  # a missing queue is not an error
        for exchange in EXCHANGES:
            channel.exchange_delete(exchange, timeout=10)


def _catches(process: subprocess.Popen[str], signum: int, timeout: float) -> bool:
    """Wait until ``process`` has a handler for ``signum`` (``SigCgt`` in /proc); False if
    it exits first or ``timeout`` runs out."""
    bit = 1 << (signum - 1)
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
        except OSError:  # gone meanwhile
            return False
        caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & bit:
            return True
        time.sleep(0.02)
    return False


def _run(snippet: Snippet, workdir: Path, url: str) -> str:
    """Run one program; return a description of what went wrong, or ``""``."""
    script = workdir / f"snippet_{snippet.path.stem}_{snippet.line}.py"
    script.write_text(snippet.code, encoding="utf-8")
    env = {**os.environ, "RABBITMQ_URL": url}
    if snippet.kind == SIGTERM:
        process = subprocess.Popen(
            [sys.executable, str(script)],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # SIGTERM before the program handles it would end it by the default action
        # (exit code -15): wait until it catches the signal, then let it serve a while.
        ready = _catches(process, signal.SIGTERM, RUN_TIMEOUT)
        if ready:
            time.sleep(SERVICE_SECONDS)
        early = process.poll()
        if early is None and not ready:
            process.kill()
            output, _ = process.communicate()
            return f"{snippet.id}: no SIGTERM handler within {RUN_TIMEOUT} s\n{output}"
        process.send_signal(signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            return f"{snippet.id}: did not stop within {RUN_TIMEOUT} s of SIGTERM\n{output}"
        if early is not None:
            return f"{snippet.id}: exited ({early}) before SIGTERM\n{output}"
        code = process.returncode
    else:
        try:
            done = subprocess.run(
                [sys.executable, str(script)],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"{snippet.id}: still running after {RUN_TIMEOUT} s"
        code, output = done.returncode, done.stdout + done.stderr
    if code != 0:
        return f"{snippet.id}: exit code {code}\n{output}"
    return ""


def test_there_are_programs_to_run() -> None:
    assert len(PROGRAMS) >= 8
    assert any(s.kind == SIGTERM for s in PROGRAMS)


@pytest.mark.timeout(600)
def test_runnable_snippets_run(url: str, tmp_path: Path) -> None:
    # One test for all of them, in page order: the pages share queue names, so they must
    # not run in parallel; each failure names its page and line.
    _delete_everything(url)
    try:
        failures = [problem for s in PROGRAMS if (problem := _run(s, tmp_path, url))]
    finally:
        _delete_everything(url)
    assert not failures, "\n\n".join(failures)


def test_a_service_gets_sigterm_only_once_it_handles_it(tmp_path: Path, url: str) -> None:
    # A service that takes longer than SERVICE_SECONDS to start (an import on a busy
    # machine): a SIGTERM sent on a timer would end it by the default action.
    code = (
        "import signal, sys, time\n"
        f"time.sleep({SERVICE_SECONDS + 1})\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "time.sleep(60)\n"
    )
    slow = Snippet(ROOT / "docs" / "slow_service.md", 1, code, SIGTERM, "")
    assert _run(slow, tmp_path, url) == ""
