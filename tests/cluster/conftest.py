"""Fixtures of the cluster tier: one throw-away 3-node cluster shared by the module's tests.

Every test in this directory gets the ``cluster`` marker (``-m cluster`` runs only these,
``-m 'not cluster'`` deselects them). The cluster (``tests.support.cluster``) is three
private nodes beside the shared broker, which these tests never touch; it takes about
20-25 s to form, so it is made once per session. After each test an autouse guard heals
it: frozen members are resumed, stopped or killed ones started again, and the test waits
until all three run as one cluster, with no partition. When the RabbitMQ server package
is missing the tests fail with a message saying so: a run that skipped them must not look
green.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.support.cluster import RabbitCluster
from tests.support.node import SCRIPTS_ENV, find_scripts_dir, leftovers

if TYPE_CHECKING:
    from collections.abc import Iterator

_HERE = Path(__file__).resolve().parent

#: Plugins every member runs: the consistent-hash exchange for rabbitry.sharding.
PLUGINS = ("rabbitmq_consistent_hash_exchange",)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def rmq_cluster() -> Iterator[RabbitCluster]:
    """Three clustered throw-away nodes (see :class:`tests.support.cluster.RabbitCluster`):
    ``urls``, ``urls_from(i)``, ``leader(queue)``, ``kill(i)``, ``stop(i)``, ``start(i)``,
    ``pause(i, s)`` / ``paused(i, s)``, ``resume(i)``, ``partitions()``, ``heal()``."""
    if find_scripts_dir() is None:
        pytest.fail(
            "The cluster tests start their own RabbitMQ nodes, but the unwrapped "
            "rabbitmq-server scripts were not found (/usr/lib/rabbitmq/bin, or set "
            f"${SCRIPTS_ENV}). Install the rabbitmq-server package (`make broker` does), "
            "or deselect these tests explicitly with -m 'not cluster'.",
            pytrace=False,
        )
    cluster = RabbitCluster(plugins=PLUGINS)
    try:  # try/finally: also stops the nodes on Ctrl-C during formation
        cluster.start_all()
        yield cluster
    finally:
        cluster.stop_all()
    problems = leftovers(only=[node.short_name for node in cluster.nodes])
    if problems:
        pytest.fail("throw-away nodes were not cleaned up: " + "; ".join(problems))


@pytest.fixture(autouse=True)
def _heal_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the cluster: every member running, one cluster, no partition."""
    cluster = (
        request.getfixturevalue("rmq_cluster") if "rmq_cluster" in request.fixturenames else None
    )
    yield
    if cluster is not None:
        cluster.heal()
        assert cluster.partitions() == "[]", "the cluster is partitioned after the test"


@pytest.fixture
def unique() -> Iterator[str]:
    """A name prefix unique to this test."""
    yield f"rabbitry-cluster-{uuid.uuid4().hex[:10]}"
