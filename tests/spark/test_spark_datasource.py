"""The pyspark classes without a SparkSession or a broker: planning logic and pickling."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark import cloudpickle  # type: ignore[attr-defined]
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

import pyspark_rabbitmq  # type: ignore[import-untyped]
from rabbitry.exceptions import ConfigurationError
from rabbitry.spark import QueueStreamReader, RabbitMQDataSource, StreamQueueReader
from rabbitry.spark import datasource as ds


def _source(**options: str) -> RabbitMQDataSource:
    return RabbitMQDataSource(CaseInsensitiveDict(options))


def test_name_and_auto_registration_module() -> None:
    assert RabbitMQDataSource.name() == "rabbitmq"
    assert pyspark_rabbitmq.DefaultSource is RabbitMQDataSource


def test_reader_kind_follows_queue_type() -> None:
    schema = StructType()
    with pytest.raises(PySparkNotImplementedError):  # Spark then uses simpleStreamReader
        _source(queue="q").streamReader(schema)
    assert isinstance(_source(queue="q").simpleStreamReader(schema), QueueStreamReader)
    assert isinstance(
        _source(queue="s", queueType="stream").streamReader(schema), StreamQueueReader
    )


def test_options_are_validated_with_the_option_name() -> None:
    with pytest.raises(ConfigurationError, match="option maxMessagesPerBatch"):
        _source(queue="q", maxMessagesPerBatch="lots").simpleStreamReader(StructType())
    schema = StructType().add("body", "string").add("colour", "string")
    with pytest.raises(ConfigurationError, match="unknown column"):
        _source().writer(schema, False)


def test_stream_offsets_and_admission_control(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = _source(queue="s", queueType="stream", numPartitions="2").streamReader(StructType())
    assert isinstance(reader, StreamQueueReader)
    monkeypatch.setattr(ds, "stream_tail", lambda _options: 2500)
    assert reader.getDefaultReadLimit() == ReadMaxRows(100_000)
    assert reader.latestOffset({"offset": 0}, ReadMaxRows(1000)) == {"offset": 1000}
    assert reader.latestOffset({"offset": 2000}, ReadMaxRows(1000)) == {"offset": 2500}
    assert reader.latestOffset({"offset": 2500}, ReadAllAvailable()) == {"offset": 2500}
    reader.prepareForTriggerAvailableNow()
    monkeypatch.setattr(ds, "stream_tail", lambda _options: 9999)  # published later
    assert reader.latestOffset({"offset": 0}, ReadAllAvailable()) == {"offset": 2500}
    parts = reader.partitions({"offset": 100}, {"offset": 200})
    assert [(p.start, p.end) for p in parts] == [(100, 150), (150, 200)]  # type: ignore[attr-defined]


def test_everything_shipped_to_executors_pickles() -> None:
    schema = StructType().add("body", "binary")
    objects: list[Any] = [
        RabbitMQDataSource,
        _source(queue="q").simpleStreamReader(schema),
        _source(queue="s", queueType="stream").streamReader(schema),
        _source(queue="q").reader(schema),
        _source(exchange="x").writer(schema, False),
        _source(exchange="x").streamWriter(schema, False),
        ds.OffsetRange(1, 2),
        ds.QueueQuota(10, 0),
        ds.QueueShare(0, 10),
        ds.PublishCommit(0, 0, 5, 5, "a", "b"),
    ]
    for obj in objects:
        copy = cloudpickle.loads(cloudpickle.dumps(obj))  # type: ignore[no-untyped-call]
        assert type(copy) is type(obj) or copy is obj


def test_queue_reader_replay_is_empty() -> None:
    reader = _source(queue="q").simpleStreamReader(StructType())
    assert reader.initialOffset() == {"seq": 0}
    assert list(reader.readBetweenOffsets({"seq": 0}, {"seq": 10})) == []


def test_queue_streaming_refuses_num_partitions() -> None:
    # One consumer in the driver reads a classic/quorum queue: more partitions would be
    # silently ignored, so they are refused.
    with pytest.raises(ConfigurationError, match="option numPartitions: a streaming read"):
        _source(queue="q", numPartitions="4").simpleStreamReader(StructType())
    assert isinstance(
        _source(queue="s", queueType="stream", numPartitions="4").streamReader(StructType()),
        StreamQueueReader,
    )
