"""tools/flake_hunt.py runs the passes of make test and reads the JUnit reports of each."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]

_REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.spark.test_a" name="test_ok@spark" time="1.0"/>
<testcase classname="tests.spark.test_a" name="test_bad@spark" time="1.0">
<failure message="assert 1000 == 0"/></testcase>
</testsuite></testsuites>
"""


@pytest.fixture(scope="module")
def flake_hunt() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flake_hunt", ROOT / "tools" / "flake_hunt.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("flake_hunt", module)
    spec.loader.exec_module(module)
    return module


def test_a_failure_of_the_rabbitmq4_pass_counts_and_is_named_as_such(
    flake_hunt: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "parallel.xml").write_text(_REPORT)
    (tmp_path / "rabbitmq4").mkdir()
    (tmp_path / "rabbitmq4" / "parallel.xml").write_text(_REPORT)
    counts, failed = flake_hunt.read_junit(tmp_path)
    assert counts == {"passed": 2, "failed": 2}
    assert failed == [
        "tests.spark.test_a::test_bad",
        "[4.x] tests.spark.test_a::test_bad",
    ]


def test_a_run_ends_with_the_spark_cluster_pass_when_asked(
    flake_hunt: ModuleType, tmp_path: Path
) -> None:
    python = tmp_path / "python"
    passes = flake_hunt.run_passes(
        python,
        tmp_path / "run-1",
        workers=3,
        pytest_args=["-x"],
        rabbitmq4="tests/integration tests/spark",
        spark_cluster="tests/spark/test_spark_cluster.py",
    )
    assert [one[1] for one in passes] == ["tools/run_pytest.py", "tools/run_pytest.py", "-m"]
    cluster = passes[-1]
    assert cluster[:8] == [
        str(python),
        "-m",
        "pytest",
        "--spark-cluster",
        "-m",
        "spark_cluster",
        "--fail-on-skip",
        f"--junitxml={tmp_path / 'run-1' / 'spark-cluster' / 'cluster.xml'}",
    ]
    assert cluster[8:] == ["tests/spark/test_spark_cluster.py", "-x"]
    without = flake_hunt.run_passes(python, tmp_path / "run-1", workers=3, pytest_args=[])
    assert len(without) == 1


def test_a_failure_of_the_spark_cluster_pass_counts(flake_hunt: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "parallel.xml").write_text(_REPORT)
    (tmp_path / "spark-cluster").mkdir()
    (tmp_path / "spark-cluster" / "cluster.xml").write_text(
        _REPORT.replace("tests.spark.test_a", "tests.spark.test_spark_cluster")
    )
    counts, failed = flake_hunt.read_junit(tmp_path)
    assert counts == {"passed": 2, "failed": 2}
    assert "tests.spark.test_spark_cluster::test_bad" in failed
