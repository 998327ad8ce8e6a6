"""tools/check_docstrings.py (run by ``make docs``) finds what a docstring misses.

It runs as ``make docs`` runs it, on a small module written here: one function and one
method documented in full, and their twins that miss each kind of section. The sans-IO
core's modules are checked by every public name they define, exported or not.
"""

from __future__ import annotations

import importlib.util
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


def unexported(key: str) -> str:
    """Not in ``__all__``."""
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


def test_every_name_also_checks_what_all_leaves_out(tmp_path: Path) -> None:
    done = _run(tmp_path, "--every-name", "docmod_sample")
    assert done.returncode == 1, done.stderr
    path = tmp_path / "docmod_sample.py"
    line = SAMPLE.splitlines().index("def unexported(key: str) -> str:") + 1
    reported = done.stdout.splitlines()
    assert f"{path}:{line} docmod_sample.unexported: missing Args for key; missing Returns" in (
        reported
    )
    assert len(reported) == 3  # bad, Store.put and unexported


def _checker_module() -> object:
    spec = importlib.util.spec_from_file_location("check_docstrings", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_every_protocol_module_is_checked_or_listed_as_pending() -> None:
    checker = _checker_module()
    checked = set(checker.SOURCE_MODULES)  # type: ignore[attr-defined]
    pending = set(checker.PROTOCOL_PENDING)  # type: ignore[attr-defined]
    assert not checked & pending
    modules = {
        f"rabbitry.protocol.{path.stem}"
        for path in (ROOT / "src" / "rabbitry" / "protocol").glob("*.py")
        if path.stem not in {"__init__", "spec"}  # spec.py: generated, see gen_spec.py
    }
    assert modules == checked | pending
