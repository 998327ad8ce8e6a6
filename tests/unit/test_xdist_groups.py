"""The pytest-xdist groups of tests/conftest.py: tests that must not run at the same time
share a group, and a group runs on one worker."""

from __future__ import annotations

from tests.conftest import xdist_group


def test_the_readme_quick_start_never_runs_beside_the_documentation_programs() -> None:
    # Both run the README's quick start on the shared broker; the documentation programs
    # delete its queue "hello" before and after they run.
    install = xdist_group("tests/integration/test_install.py::test_wheel_installs")
    programs = xdist_group("tests/integration/test_docs_snippets.py::test_runnable_snippets_run")
    assert install is not None
    assert install == programs


def test_a_test_outside_every_group_has_none() -> None:
    assert xdist_group("tests/integration/test_publisher.py::test_x") is None


def test_the_spark_crash_tests_have_their_own_group() -> None:
    # The first matching prefix decides: the crash tests are not in the session's group.
    assert xdist_group("tests/spark/test_spark_crash.py::test_a") == "spark-crash"
    assert xdist_group("tests/spark/test_spark_cluster.py::test_a") == "spark-cluster"
    assert xdist_group("tests/spark/test_spark_write.py::test_a") == "spark"
