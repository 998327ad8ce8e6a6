"""``--fail-on-skip`` (tests/conftest.py): in ``make test`` a skipped test fails the run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    # The sample lives in the test's own temporary directory, never in the source tree:
    # the suite's conftest (which defines the option) is loaded as a plugin, and the
    # project's configuration (markers, pythonpath) comes from pyproject.toml.
    (tmp / "test_sample.py").write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(ROOT),
            "-p",
            "tests.conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            *options,
            str(tmp / "test_sample.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


SAMPLE = """
import pytest

def test_runs():
    pass

def test_needs_something():
    pytest.skip("no such thing here")

@pytest.mark.rabbitmq4
def test_only_on_4():
    raise AssertionError("must not run without --rabbitmq4")
"""

MODULE_SKIP = """
import pytest

pytest.importorskip("a_module_that_does_not_exist")

def test_never_runs():
    pass
"""


def test_a_skipped_test_fails_the_run_and_rabbitmq4_tests_are_deselected(tmp_path: Path) -> None:
    result = _run(tmp_path, SAMPLE, "--fail-on-skip")
    assert result.returncode == 1, result.stdout
    assert "--fail-on-skip: 1 skipped" in result.stdout
    assert "test_needs_something" in result.stdout and "no such thing here" in result.stdout
    assert "1 passed, 1 skipped, 1 deselected" in result.stdout


def test_a_skipped_module_fails_the_run(tmp_path: Path) -> None:
    result = _run(tmp_path, MODULE_SKIP, "--fail-on-skip")
    assert result.returncode == 1, result.stdout
    assert "--fail-on-skip: 1 skipped" in result.stdout


def test_the_sample_run_writes_nothing_into_the_source_tree(tmp_path: Path) -> None:
    _run(tmp_path, SAMPLE, "--fail-on-skip")
    assert not [p for p in (ROOT / "tests").rglob("test_sample.py")]
    assert (tmp_path / "test_sample.py").is_file()
