"""scripts/rabbitmq4.sh: its checks and messages (nothing here builds or starts a node)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "rabbitmq4.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_url_names_the_port() -> None:
    assert run("url").stdout.strip() == "amqp://guest:guest@127.0.0.1:5682/"
    assert run("url", RABBITRY_RMQ4_PORT="5692").stdout.strip().endswith(":5692/")


@pytest.mark.parametrize(
    ("port", "message"),
    [
        ("abc", "must be a port in 1024-35000, got 'abc'"),
        ("40000", "must be a port in 1024-35000"),
        ("5672", "would give port 5672, which the shared node uses"),
        ("4369", "would give port 4369, which the shared node uses"),
        ("5670", "would give port 35681, which the shared node uses"),
        ("5671", "would give port 5671, which the shared node uses"),
    ],
)
def test_ports_that_would_meet_the_shared_node_are_refused(port: str, message: str) -> None:
    done = run("url", RABBITRY_RMQ4_PORT=port)
    assert done.returncode == 1
    assert "rabbitmq4: error: " in done.stderr and message in done.stderr


def test_without_a_command_it_prints_its_usage() -> None:
    done = run()
    assert done.returncode == 2
    assert "Usage: scripts/rabbitmq4.sh COMMAND" in done.stderr


def test_status_of_a_node_that_does_not_run(tmp_path: Path) -> None:
    done = run("status", RABBITRY_RMQ4_PORT="5772", RABBITRY_RMQ4_CACHE=str(tmp_path))
    assert done.returncode == 1
