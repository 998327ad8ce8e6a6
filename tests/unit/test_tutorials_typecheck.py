"""The tutorials' programs (docs/tutorial-*.md) pass ``mypy --strict``, as a reader's
project that type-checks would run them."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from tests.support.docs_snippets import FRAGMENT, ROOT, snippets

if TYPE_CHECKING:
    from pathlib import Path

TUTORIALS = [s for s in snippets() if s.path.name.startswith("tutorial-") and s.kind != FRAGMENT]


def test_every_tutorial_has_a_program() -> None:
    pages = {s.path.name for s in TUTORIALS}
    assert pages == {p.name for p in (ROOT / "docs").glob("tutorial-*.md")}


def test_the_tutorials_programs_pass_mypy_strict(tmp_path: Path) -> None:
    files = []
    for snippet in TUTORIALS:
        # One module per program; the name says where it comes from.
        path = tmp_path / f"{snippet.path.stem.replace('-', '_')}_line_{snippet.line}.py"
        path.write_text(snippet.code)
        files.append(path.name)
    # An empty configuration: the reader's strictness, not this repository's overrides.
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            "mypy.ini",
            "--python-version",
            "3.11",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            *files,
        ],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
