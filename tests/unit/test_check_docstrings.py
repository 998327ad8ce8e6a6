"""tools/check_docstrings.py (run by ``make docs``) finds what a docstring misses.

It runs as ``make docs`` runs it, on a small module written here: one function and one
method documented in full, and their twins that miss each kind of section.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "tools" / "check_docstrings.py"

SAMPLE = '''\
"""A module to check."""

__all__ = ["Store", "bad", "good", "no_parameters"]


def good(key: str, *values: int, strict: bool = False) -> int:
    """Count the values of a key.

    Args:
        key: the key.
        *values: the values.
        strict (bool): fail on a negative value.

    Returns:
        How many values there are.

    Raises:
        ValueError: a value is negative and ``strict`` is set.
    """
    if strict and any(v < 0 for v in values):
        raise ValueError(key)
    return len(values)


def bad(key: str, limit: int) -> int:
    """Count something.

    Args:
        key: the key.
    """
    if limit < 0:
        raise ValueError(key)
    return limit


def no_parameters() -> int:
    """Nothing to document beyond this line."""
    return 1


class Store:
    """A store."""

    def get(self, key: str) -> str:
        """The value of a key.

        Args:
            key: the key.

        Returns:
            The value.

        Raises:
            KeyError: there is none.
        """
        raise KeyError(key)

    def put(self, key: str, value: str) -> None:
        """Store a value.

        Raises:
            KeyError: never.
        """
        if not key:
            raise LookupError(key)

    @property
    def size(self) -> int:
        return 0

    def _private(self, key: str) -> str:
        return key
'''


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "docmod_sample.py").write_text(SAMPLE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run(
        [sys.executable, str(CHECKER), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_each_missing_section_is_reported_and_fails_the_check(tmp_path: Path) -> None:
    done = _run(tmp_path, "docmod_sample")
    assert done.returncode == 1, done.stderr
    path = tmp_path / "docmod_sample.py"
    lines = SAMPLE.splitlines()
    bad = lines.index("def bad(key: str, limit: int) -> int:") + 1
    put = lines.index("    def put(self, key: str, value: str) -> None:") + 1
    assert done.stdout.splitlines() == [
        f"{path}:{bad} docmod_sample.bad: missing Args for limit; missing Returns; "
        "missing Raises for ValueError",
        f"{path}:{put} docmod_sample.Store.put: missing Args for key, value; "
        "missing Raises for LookupError",
    ]


def test_a_module_documented_in_full_passes(tmp_path: Path) -> None:
    sample = SAMPLE.split("def bad(")[0]
    (tmp_path / "docmod_good.py").write_text(
        sample.replace('["Store", "bad", "good", "no_parameters"]', '["good"]'),
        encoding="utf-8",
    )
    done = _run(tmp_path, "docmod_good")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""
    assert "1 functions, 0 with a docstring that misses something" in done.stderr
