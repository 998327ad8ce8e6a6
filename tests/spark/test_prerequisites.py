"""The Spark tests' prerequisites are installed: a missing one fails the run, not skips it."""

from __future__ import annotations

from tests.spark.conftest import MISSING, PREREQUISITES


def test_pyspark_and_pyarrow_are_installed() -> None:
    assert not MISSING, (
        f"{', '.join(MISSING)} not installed, so the Spark tests were not collected. "
        f"Install the spark extra (pip install -e '.[spark]', it brings "
        f"{' and '.join(PREREQUISITES)}) or deselect them explicitly with -m 'not spark'."
    )
