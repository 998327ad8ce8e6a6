"""Fixtures of the Spark tests: one local SparkSession per run, a real broker.

Every test here gets the ``spark`` marker. Spark's Python workers must run this venv's
interpreter (``PYSPARK_PYTHON``), otherwise they fail with a bare "worker failed to
connect back".

Without pyspark or pyarrow the Spark tests *fail*, they do not skip: the test modules
are left out of the collection (they import pyspark) and
``test_prerequisites.py`` fails, naming what is missing. Deselect the Spark tests
explicitly instead (``-m 'not spark'``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import rabbitry
from rabbitry.config import default_url
from rabbitry.exceptions import channel_error_for

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.support.spark_standalone import SparkStandalone

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent.parent

#: pytest-timeout for a Spark test that sets none (the suite's default is 120 s).
SPARK_TIMEOUT = 300

#: What the Spark tests need that the core library does not.
PREREQUISITES = ("pyspark", "pyarrow")


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ImportError:
        return True


MISSING = [name for name in PREREQUISITES if _missing(name)]
if MISSING:
    collect_ignore_glob = ["test_spark_*.py", "test_orders_pipeline.py"]

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.spark)
            if item.get_closest_marker("timeout") is None:
                # The first test of a worker also boots the JVM (about a minute on a busy
                # 2-core machine). A deadline against a hang, not a measurement: a
                # timeout that fires inside a py4j call also wrecks the session for
                # every later test.
                item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))


def spark_env() -> dict[str, str]:
    """Environment for a Spark subprocess (driver scripts of the crash tests)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT / "src"), str(_ROOT)])
    return env


@pytest.fixture(scope="session")
def url() -> str:
    return default_url()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,3]")  # 2 threads, tasks retried
        .appName("rabbitry-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkStandalone]:
    """A Spark standalone master and two workers on 127.0.0.1, for the session.

    Each worker offers 3 cores and 2 GiB: room for the executors (1 core, 512 MiB) of 3
    applications, also when one worker is down.
    """
    from tests.support.spark_standalone import SparkStandalone

    with SparkStandalone(workers=2, cores=3, memory="2g") as cluster:
        yield cluster
    assert not cluster.leftovers()


@pytest.fixture
def conn(url: str) -> Iterator[rabbitry.Connection]:
    with rabbitry.Connection(url) as connection:
        yield connection


@pytest.fixture
def make_queue(conn: rabbitry.Connection) -> Iterator[Callable[..., str]]:
    """``make_queue(kind="classic")`` declares a uniquely named queue, deleted afterwards."""
    channel = conn.channel()
    names: list[str] = []

    def make(kind: str = "classic") -> str:
        name = f"rabbitry-spark-{kind}-{uuid.uuid4().hex[:10]}"
        arguments = {} if kind == "classic" else {"x-queue-type": kind}
        channel.queue_declare(name, durable=True, arguments=arguments)
        names.append(name)
        return name

    yield make
    for name in names:
        channel.queue_delete(name)


def refuse_like_a_classic_queue(queue: str, arguments: Any) -> None:
    """What a classic queue answers a consumer with ``x-stream-offset`` (for fake channels:
    the source asks the broker for the queue's type that way)."""
    if "x-stream-offset" in (arguments or {}):
        raise channel_error_for(
            406,
            f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for queue '{queue}' in "
            "vhost '/' of queue type rabbit_classic_queue",
            60,
            20,
        )


def publish(conn: rabbitry.Connection, queue: str, count: int, start: int = 0) -> None:
    """Publish ``count`` messages ``b"<n>"`` (n from ``start``) to ``queue``, confirmed."""
    with conn.publisher(max_in_flight=2000) as publisher:
        outcomes = publisher.publish_batch(
            [str(n).encode() for n in range(start, start + count)], routing_key=queue
        )
    assert not [o for o in outcomes if o is not None]


def broker_address(url: str) -> tuple[str, int]:
    """Host and port of the broker at ``url`` (what a fault proxy forwards to)."""
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (5671 if parts.scheme == "amqps" else 5672)


def through(proxy_url: str, url: str) -> str:
    """``url`` with its host and port replaced by those of ``proxy_url``."""
    proxy, parts = urlsplit(proxy_url), urlsplit(url)
    netloc = proxy.netloc.rsplit("@", 1)[-1]
    if "@" in parts.netloc:
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" + netloc
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def depth(conn: rabbitry.Connection, queue: str) -> int:
    channel = conn.channel()
    try:
        return channel.queue_declare(queue, passive=True).message_count
    finally:
        channel.close()


def consumers(conn: rabbitry.Connection, queue: str) -> int:
    """Consumers on ``queue`` now."""
    channel = conn.channel()
    try:
        return channel.queue_declare(queue, passive=True).consumer_count
    finally:
        channel.close()


def settled_depth(conn: rabbitry.Connection, queue: str, timeout: float = 30.0) -> int:
    """The queue's depth once no consumer is left on it.

    The broker requeues a consumer's unacknowledged messages when its channel closes, so
    once the consumer count is 0 whatever was not acked is back in the queue.
    """
    channel = conn.channel()
    try:
        deadline = time.monotonic() + timeout
        while (ok := channel.queue_declare(queue, passive=True)).consumer_count:
            assert time.monotonic() < deadline, f"{queue}: still {ok.consumer_count} consumer(s)"
            time.sleep(0.05)
        return ok.message_count
    finally:
        channel.close()
