"""A read whose ``queueType`` is not the queue's type is refused, naming the option.

AMQP 0-9-1 cannot return a queue's type, but the source asks the broker through a
consumer with ``x-stream-offset``, which only a stream accepts (classic and quorum
queues refuse it naming their type). Read as a queue, a stream delivers only what is
published after the read started: without the check, a batch read of a stream holding
messages returned no row and a streaming query skipped what the stream held, with no
error. A quorum queue read as classic skipped the delivery-count refusal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import publish

import rabbitry
from rabbitry.exceptions import ConfigurationError
from rabbitry.spark._batch import plan_queue_read
from rabbitry.spark._core import QueueConsumer, broker_queue_type
from rabbitry.spark._options import parse_read_options

if TYPE_CHECKING:
    from collections.abc import Callable


def test_the_broker_states_each_queue_type(
    url: str, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    with rabbitry.Connection(url) as fresh:  # it has not declared the queues itself
        for kind in ("classic", "quorum", "stream"):
            queue = make_queue(kind)
            publish(conn, queue, 3)
            assert broker_queue_type(fresh, queue) == kind
            # The probe took nothing and left the connection usable.
            ok = fresh.channel().queue_declare(queue, passive=True)
            assert ok.consumer_count == 0
            if kind != "stream":
                assert ok.message_count == 3


def test_a_stream_read_as_a_queue_is_refused_before_any_row(
    spark: Any, url: str, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    stream = make_queue("stream")
    publish(conn, stream, 50)
    with pytest.raises(Exception, match=r"option queueType: queue .* is a stream queue"):
        spark.read.format("rabbitmq").option("url", url).option("queue", stream).load().count()
    consumer = QueueConsumer(parse_read_options({"url": url, "queue": stream}))
    try:
        with pytest.raises(ConfigurationError, match=r"set queueType=stream"):
            consumer.read(0)
    finally:
        consumer.close()
    rows = (
        spark.read.format("rabbitmq")
        .option("url", url)
        .option("queue", stream)
        .option("queueType", "stream")
        .load()
        .count()
    )
    assert rows == 50


def test_a_quorum_queue_read_as_classic_is_refused(
    url: str, conn: rabbitry.Connection, make_queue: Callable[..., str]
) -> None:
    queue = make_queue("quorum")
    publish(conn, queue, 5)
    with pytest.raises(ConfigurationError, match=r"is a quorum queue .* got 'classic'"):
        plan_queue_read(parse_read_options({"url": url, "queue": queue}))
    consumer = QueueConsumer(parse_read_options({"url": url, "queue": queue}))
    try:
        with pytest.raises(ConfigurationError, match=r"set queueType=quorum"):
            consumer.read(0)
    finally:
        consumer.close()
    # Nothing was taken.
    assert conn.channel().queue_declare(queue, passive=True).message_count == 5


def test_a_missing_queue_is_named_as_the_queue_option(url: str) -> None:
    consumer = QueueConsumer(parse_read_options({"url": url, "queue": "rabbitry-spark-no-such"}))
    try:
        with pytest.raises(ConfigurationError, match=r"^option queue: queue .* does not exist"):
            consumer.read(0)
    finally:
        consumer.close()
