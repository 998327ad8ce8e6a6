"""``--rabbitmq4``: run the session against a RabbitMQ 4.x node that the run starts itself.

With the option, the controlling pytest process starts a node with
``scripts/rabbitmq4.sh start`` (Debian 13's rabbitmq-server in a cached debootstrap root,
built when missing) before any test is collected, points ``RABBITMQ_URL``,
``RABBITRY_TEST_MANAGEMENT_URL`` and ``RABBITRY_TEST_RABBITMQCTL`` (see :func:`rabbitmqctl`)
at it for the whole session (pytest-xdist workers
inherit the environment) and stops it again in ``pytest_unconfigure``: the node's data,
logs and epmd name are gone when pytest exits.

Each run takes an AMQP port from ``5682, 5692, ... 5772`` with an exclusive ``flock``, so
two runs on one machine (two worktrees, a CI job beside a developer) get two nodes. The
shared broker's ports (5672, 15672, 25672) are never used.

Without the option nothing happens: the suites use ``RABBITMQ_URL`` as before.

The :func:`broker_version` fixture gives the version of the broker at ``RABBITMQ_URL`` as a
tuple, for the tests whose expectations differ between RabbitMQ 3.x and 4.x.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Final

import pytest

import rabbitry
from rabbitry.config import default_url

__all__ = ["broker_version", "management_url", "rabbitmqctl"]

_SCRIPT: Final = Path(__file__).resolve().parents[2] / "scripts" / "rabbitmq4.sh"
_PORTS: Final = range(5682, 5773, 10)
_LOCK_DIR: Final = Path(tempfile.gettempdir()) / "rabbitry-rmq4-ports"
#: The management API of the broker under test, when the run knows one.
MANAGEMENT_URL_ENV: Final = "RABBITRY_TEST_MANAGEMENT_URL"
#: A command (shell words) that runs rabbitmqctl against the broker under test.
RABBITMQCTL_ENV: Final = "RABBITRY_TEST_RABBITMQCTL"


class _Node:
    """The node this process started, with the lock on its port."""

    def __init__(self) -> None:
        self.port: int | None = None
        self._fd: int | None = None

    def lease_port(self) -> int:
        _LOCK_DIR.mkdir(mode=0o777, exist_ok=True)
        for port in _PORTS:
            fd = os.open(_LOCK_DIR / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.port, self._fd = port, fd
            return port
        raise pytest.UsageError(
            f"--rabbitmq4: every port of {_PORTS.start}-{_PORTS.stop - 1} (step 10) is held by "
            f"another test run (locks in {_LOCK_DIR})"
        )

    def run(self, command: str) -> str:
        env = dict(os.environ, RABBITRY_RMQ4_PORT=str(self.port))
        done = subprocess.run(
            ["bash", str(_SCRIPT), command],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise pytest.UsageError(
                f"--rabbitmq4: `scripts/rabbitmq4.sh {command}` failed "
                f"(exit {done.returncode}):\n{done.stderr.strip()}"
            )
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


_node = _Node()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rabbitmq4",
        action="store_true",
        default=False,
        help="start a RabbitMQ 4.x node (scripts/rabbitmq4.sh) and point RABBITMQ_URL at it "
        "for this session; it is stopped and deleted at the end",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("rabbitmq4") or hasattr(config, "workerinput"):
        return  # xdist workers inherit RABBITMQ_URL from the controller
    port = _node.lease_port()
    try:
        # A node left on this port by a run that was killed (no unconfigure) is stopped
        # first: every session starts from an empty node.
        _node.run("stop")
        url = _node.run("start")
    except BaseException:
        with contextlib.suppress(pytest.UsageError):
            _node.run("stop")
        _node.release()
        raise
    os.environ["RABBITMQ_URL"] = url
    os.environ[MANAGEMENT_URL_ENV] = f"http://guest:guest@127.0.0.1:{port + 10000}/"
    os.environ[RABBITMQCTL_ENV] = shlex.join(
        ["env", f"RABBITRY_RMQ4_PORT={port}", "bash", str(_SCRIPT), "ctl"]
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    if _node.port is None or hasattr(config, "workerinput"):
        return
    try:
        _node.run("stop")
    finally:
        _node.release()
        _node.port = None


def pytest_report_header(config: pytest.Config) -> str | None:
    if _node.port is None:
        return None
    return f"rabbitmq4: RABBITMQ_URL={os.environ['RABBITMQ_URL']} (started for this run)"


def rabbitmqctl() -> list[str] | None:
    """The command that runs rabbitmqctl against the broker under test, or None.

    ``$RABBITRY_TEST_RABBITMQCTL`` (set by ``--rabbitmq4``), else the ``rabbitmqctl`` on
    ``PATH`` (which talks to the local default node, the shared broker).
    """
    command = os.environ.get(RABBITMQCTL_ENV)
    if command:
        return shlex.split(command)
    found = shutil.which("rabbitmqctl")
    return [found] if found else None


def _server_version(url: str) -> tuple[int, ...]:
    with rabbitry.Connection(url, connection_timeout=10) as connection:
        return connection.server_version


@pytest.fixture(scope="session")
def broker_version() -> tuple[int, ...]:
    """The version of the broker at ``RABBITMQ_URL``, e.g. ``(3, 10, 8)`` or ``(4, 0, 5)``."""
    return _server_version(default_url())


@pytest.fixture(scope="session")
def management_url() -> str | None:
    """The management API of the broker at ``RABBITMQ_URL``, when the run started it."""
    return os.environ.get(MANAGEMENT_URL_ENV)
