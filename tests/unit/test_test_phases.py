"""The suite's two phases (tools/run_pytest.py): the serial phase collects only the
modules that can hold serial tests, and a serial mark it would miss fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.conftest import (
    _check_serial_marks_are_in_their_modules,
    names_serial,
    pytest_collection_modifyitems,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("pytestmark = pytest.mark.serial\n", True),
        ("@pytest.mark.serial\ndef test_x(): ...\n", True),
        ("from pytest import mark\n@mark.serial\ndef test_x(): ...\n", True),
        ("def test_x(): ...\n", False),
        ("def test_serialize(): ...\n", False),  # a word that merely contains it
    ],
)
def test_a_module_names_the_serial_mark(source: str, expected: bool) -> None:
    assert names_serial(source) is expected


def test_the_serial_phase_does_not_import_modules_without_serial_tests(tmp_path: Path) -> None:
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.serial\n\n\ndef test_marked():\n    pass\n"
    )
    (tmp_path / "test_plain.py").write_text(
        "raise RuntimeError('imported although it marks no test')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml")),
            *("-p", "tests.conftest", "-p", "no:xdist", "-p", "no:cacheprovider"),
            *("--phase=serial", "--collect-only", "-q", str(tmp_path)),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    listed = [line for line in result.stdout.splitlines() if "::" in line]
    assert [line.rsplit("/", 1)[-1] for line in listed] == ["test_marked.py::test_marked"]


@dataclass
class _Item:
    """What the check reads of a pytest item: its path and its serial mark."""

    path: Path
    serial: bool

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "serial" and self.serial else None


def test_a_serial_mark_from_outside_its_module_fails_the_run(tmp_path: Path) -> None:
    marked_here = tmp_path / "test_here.py"
    marked_here.write_text("pytestmark = pytest.mark.serial\n")
    marked_elsewhere = tmp_path / "test_elsewhere.py"
    marked_elsewhere.write_text("def test_x(): ...\n")
    items = [
        _Item(marked_here, serial=True),
        _Item(marked_elsewhere, serial=True),
        _Item(marked_elsewhere, serial=False),
    ]
    with pytest.raises(pytest.UsageError, match=r"test_elsewhere\.py") as raised:
        _check_serial_marks_are_in_their_modules(items)  # type: ignore[arg-type]
    assert "test_here.py" not in str(raised.value)
    _check_serial_marks_are_in_their_modules([items[0], items[2]])  # type: ignore[list-item]


@dataclass
class _Marked:
    """An item with the marks it carries."""

    name: str
    marks: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name in self.marks else None


@dataclass
class _Config:
    """What the collection hook reads of pytest's config, and what it deselects."""

    rabbitmq4: bool
    spark_cluster: bool
    deselected: list[_Marked]

    def getoption(self, name: str) -> object:
        return {"rabbitmq4": self.rabbitmq4, "spark_cluster": self.spark_cluster, "phase": "all"}[
            name
        ]

    @property
    def hook(self) -> _Config:
        return self

    def pytest_deselected(self, items: list[_Marked]) -> None:
        self.deselected += items


@pytest.mark.parametrize(
    ("rabbitmq4", "spark_cluster", "kept", "deselected"),
    [
        (False, False, ["plain", "main"], ["only-4", "cluster"]),
        (True, False, ["plain", "only-4"], ["main", "cluster"]),
        (False, True, ["plain", "main", "cluster"], ["only-4"]),
    ],
)
def test_each_run_deselects_the_tests_of_the_others(
    rabbitmq4: bool, spark_cluster: bool, kept: list[str], deselected: list[str]
) -> None:
    items = [
        _Marked("plain"),
        _Marked("main", ("main_pass_only",)),
        _Marked("only-4", ("rabbitmq4",)),
        _Marked("cluster", ("spark_cluster", "main_pass_only")),
    ]
    config = _Config(rabbitmq4, spark_cluster, [])
    pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    assert [item.name for item in items] == kept
    assert [item.name for item in config.deselected] == deselected
