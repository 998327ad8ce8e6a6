"""The ``rabbitry`` logger has a NullHandler: an application without logging setup sees
nothing on stderr, and one with a setup gets every record (they still propagate)."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import TYPE_CHECKING

import rabbitry

if TYPE_CHECKING:
    import pytest


def test_package_logger_has_a_null_handler() -> None:
    logger = logging.getLogger(rabbitry.__name__)
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    assert logger.propagate


def test_no_stderr_output_without_logging_setup() -> None:
    code = "import logging, rabbitry; logging.getLogger('rabbitry.test').warning('quiet')"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr == ""


def test_records_still_reach_the_application(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        logging.getLogger("rabbitry.test").warning("seen")
    assert "seen" in caplog.text


def test_the_command_line_shows_warnings() -> None:
    code = (
        "import logging, sys; from rabbitry.cli import main; "
        "logging.getLogger('rabbitry.test').warning('before'); "
        "main(['--version']); logging.getLogger('rabbitry.test').warning('shown')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "shown" in done.stderr
    assert "before" not in done.stderr
