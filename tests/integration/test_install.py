"""The way in of the README works: build the sdist and the wheel (both carry the
license), install the wheel into a clean virtualenv, run the quick start against the
broker; then with the ``cli`` extra, run ``rabbitry``.

rabbitry is not on the package index, so this is the only install path users have.
Building uses ``python -m build``'s isolated environment (setuptools from the package
index); the ``cli`` extra installs click and rich from it too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from typing import TYPE_CHECKING

import pytest
from tests.support.docs_snippets import ROOT, snippets

if TYPE_CHECKING:
    from pathlib import Path

TIMEOUT = 300


def _clean_env() -> dict[str, str]:
    """This environment without ``PYTHONPATH``: with a source tree on it, the clean
    virtualenv's pip would find the tree's ``rabbitry.egg-info`` (the build writes it)
    and take rabbitry for installed, and its python would import the tree's code."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.timeout(2 * TIMEOUT)
def test_wheel_installs_into_a_clean_virtualenv_and_the_quick_start_runs(
    url: str, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    # The sdist, then the wheel built from it: what the sdist carries is enough.
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    (wheel,) = dist.glob("rabbitry-*.whl")
    (sdist,) = dist.glob("rabbitry-*.tar.gz")
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0" in license_text
    with zipfile.ZipFile(wheel) as archive:
        (licensed,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licensed).decode("utf-8") == license_text
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: Apache-2.0" in archive.read(metadata).decode("utf-8")
        # The library and the Spark registration module only: the reference pipeline
        # (examples/) is an application in the repository, not part of the package.
        names = [n for n in archive.namelist() if ".dist-info/" not in n]
        assert {n.split("/")[0] for n in names} == {"rabbitry", "pyspark_rabbitmq.py"}, names
        assert not [n for n in names if "examples/" in n or "orders_pipeline" in n]
    with tarfile.open(sdist) as archive:
        assert any(name.endswith("/LICENSE") for name in archive.getnames())

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python, pip = venv / "bin" / "python", venv / "bin" / "pip"
    _run(pip, "install", "-q", wheel, cwd=tmp_path)
    # No extras: nothing but rabbitry itself.
    installed = _run(pip, "list", "--format=freeze", cwd=tmp_path)
    assert {line.split("==")[0] for line in installed.split()} <= {"pip", "setuptools", "rabbitry"}

    quick_start = next(s for s in snippets() if s.path.name == "README.md")
    script = tmp_path / "quick_start.py"
    script.write_text(quick_start.code, encoding="utf-8")
    env = _clean_env()
    env["RABBITMQ_URL"] = url
    # Run from tmp_path with the venv's interpreter: the clone's src/ is not importable.
    out = _run(python, script, cwd=tmp_path, env=env)
    assert "b'hello'" in out

    _run(pip, "install", "-q", f"rabbitry[cli] @ {wheel.as_uri()}", cwd=tmp_path)
    version = _run(venv / "bin" / "rabbitry", "--version", cwd=tmp_path, env=env)
    assert "0.1.0" in version
