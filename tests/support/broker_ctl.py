"""``rabbitmqctl`` against the broker at ``RABBITMQ_URL``, for tests that ask it what it holds.

Only listings, ``eval`` of read-only expressions and a forced close of a connection the
test itself opened: the shared broker is never stopped or reconfigured.

A test that needs this *fails* when ``rabbitmqctl`` is missing or cannot reach the
broker, like the rest of the integration suite does without a broker: a skipped check
looks green and proves nothing. Deselect such a test explicitly instead (``--deselect``
or ``-k``).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from tests.support import rabbitmq4

from rabbitry.config import parse_urls

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_TIMEOUT = 60.0  # a deadline for one CLI call on a busy machine, not a measurement


def rabbitmqctl(url: str, *args: str) -> str:
    """Run ``rabbitmqctl *args`` against the broker of ``url`` and return its stdout.

    Fails the calling test (with the reason) when the broker is not on this machine,
    when ``rabbitmqctl`` is not installed, or when the command fails.
    """
    host = parse_urls(url)[0].host
    if host not in _LOCAL_HOSTS:
        pytest.fail(
            f"rabbitmqctl can only reach a broker on this machine; RABBITMQ_URL names {host}. "
            "Deselect this test explicitly to run without it.",
            pytrace=False,
        )
    command = rabbitmq4.rabbitmqctl()  # the broker under test (--rabbitmq4), else PATH's
    ctl = command[0] if command else shutil.which("rabbitmqctl", path="/usr/sbin")
    if ctl is None:
        pytest.fail(
            "rabbitmqctl is not installed (the rabbitmq-server package provides it). "
            "Deselect this test explicitly to run without it.",
            pytrace=False,
        )
    try:
        result = subprocess.run(
            [*(command or [ctl]), *args],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"rabbitmqctl {' '.join(args)} did not answer in {_TIMEOUT:.0f} s")
    if result.returncode != 0:
        pytest.fail(
            f"rabbitmqctl {' '.join(args)} failed ({result.returncode}): "
            f"{(result.stderr or result.stdout).strip()}"
        )
    return result.stdout
