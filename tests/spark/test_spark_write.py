"""The writer refuses to lose rows, and its memory does not grow with the partition."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
from tests.support.broker_ctl import rabbitmqctl

from rabbitry.config import parse_urls
from rabbitry.spark._core import PublishFailed
from rabbitry.spark._options import parse_write_options
from rabbitry.spark._write import UnroutableRows, publish_rows

if TYPE_CHECKING:
    from collections.abc import Iterator

    import rabbitry

pytest.importorskip("pyspark")
# Several Spark jobs per test; the first test of a session also starts Spark.
pytestmark = pytest.mark.timeout(300)


def test_unroutable_rows_fail_the_write(spark: Any, conn: rabbitry.Connection) -> None:
    key = f"rabbitry-spark-nowhere-{uuid.uuid4().hex[:8]}"
    df = spark.range(100).coalesce(1).selectExpr("cast(id as string) as body")
    writer = df.write.format("rabbitmq").option("exchange", "amq.direct").option("routingKey", key)
    with pytest.raises(Exception, match="UnroutableRows") as info:
        writer.mode("append").save()
    text = str(info.value)
    assert f"exchange 'amq.direct' routing key '{key}'" in text
    found = re.search(r"(\d+) row\(s\) were unroutable", text)
    assert found is not None and 1 <= int(found.group(1)) <= 100
    # opting out is explicit: the broker drops the rows and the write succeeds
    writer.option("mandatory", "false").mode("append").save()


def test_unroutable_rows_error_names_route_and_count(url: str) -> None:
    key = f"rabbitry-spark-nowhere-{uuid.uuid4().hex[:8]}"
    options = parse_write_options({"url": url, "exchange": "amq.direct", "routingKey": key})
    rows = ({"body": b"x"} for _ in range(10))
    with pytest.raises(UnroutableRows) as info:
        publish_rows(options, rows, "job:0", 0, 0)
    assert info.value.returned >= 1
    assert set(info.value.routes) == {("amq.direct", key)}


@pytest.fixture
def refused_writer_url(url: str) -> Iterator[str]:
    """The URL of a user of the broker who may write to no exchange but ``only-this``
    (created with rabbitmqctl, deleted afterwards)."""
    user = f"rabbitry-spark-no-write-{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    params = parse_urls(url)[0]
    rabbitmqctl(url, "add_user", user, password)
    try:
        rabbitmqctl(
            url, "set_permissions", "-p", params.virtual_host, user, "^$", "^only-this$", ".*"
        )
        host = f"[{params.host}]" if ":" in params.host else params.host
        vhost = quote(params.virtual_host, safe="")
        yield f"amqp://{user}:{password}@{host}:{params.port}/{vhost}"
    finally:
        rabbitmqctl(url, "delete_user", user)


# RabbitMQ 3.x says "access to exchange", 4.x "write access to exchange".
_REFUSED = (
    r"403\) ACCESS_REFUSED - (write )?access to exchange 'amq.default' "
    r"in vhost '[^']*' refused"
)


def test_a_write_the_broker_refuses_names_the_403_and_its_text(refused_writer_url: str) -> None:
    options = parse_write_options({"url": refused_writer_url, "routingKey": "anywhere"})
    with pytest.raises(PublishFailed, match=_REFUSED):
        publish_rows(options, ({"body": b"x"} for _ in range(5)), "job:0", 0, 0)


def test_a_spark_write_without_permission_fails_with_the_broker_reason(
    spark: Any, refused_writer_url: str
) -> None:
    df = spark.range(10).coalesce(1).selectExpr("cast(id as string) as body")
    writer = df.write.format("rabbitmq").option("url", refused_writer_url)
    with pytest.raises(Exception, match=_REFUSED):
        writer.option("routingKey", "anywhere").mode("append").save()


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")  # pragma: no cover


# 300,000 rows of 100 bytes: keeping a future per row (the old writer) grew the process by
# about 32 MB here; the writer keeps only its confirm window.
_ROWS = 300_000
_GROWTH_LIMIT_MB = 10.0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_writer_memory_is_bounded_by_its_window(url: str, conn: rabbitry.Connection) -> None:
    channel = conn.channel()
    queue = f"rabbitry-spark-mem-{uuid.uuid4().hex[:8]}"
    # the broker keeps only the newest 1000: this measures the writer, not the queue
    channel.queue_declare(queue, arguments={"x-max-length": 1000, "x-overflow": "drop-head"})
    warm: list[float] = []
    body = b"x" * 100

    def rows() -> Iterator[dict[str, Any]]:
        for index in range(_ROWS):
            if index == 20_000:
                warm.append(_rss_mb())  # window full, buffers allocated
            yield {"body": body}

    options = parse_write_options({"url": url, "routingKey": queue, "persistent": "false"})
    try:
        result = publish_rows(options, rows(), "mem:0", 0, 0)
        growth = _rss_mb() - warm[0]
    finally:
        channel.queue_delete(queue)
    assert result.confirmed == _ROWS
    assert growth < _GROWTH_LIMIT_MB, f"the writer grew by {growth:.1f} MB over {_ROWS} rows"
