"""Arrow batches of the source and the sink against the row path they replace (no JVM,
no broker).

Reads: the record batches of :class:`ArrowRows` must equal what PySpark makes of the
row tuples of :func:`message_rows` (its own ``records_to_arrow_batches``). Writes: an
Arrow batch must give the same messages as the same rows as dicts.
"""

from __future__ import annotations

import concurrent.futures
import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import DataSource
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)
from pyspark.sql.worker.plan_data_source_read import records_to_arrow_batches
from tests.spark.conftest import refuse_like_a_classic_queue

from rabbitry.batching import encode_records, envelope_headers
from rabbitry.protocol.message import Message
from rabbitry.protocol.spec import BasicProperties
from rabbitry.spark._arrow import READ_ARROW_SCHEMA, ArrowRows
from rabbitry.spark._batch import consume_share
from rabbitry.spark._core import QueueConsumer
from rabbitry.spark._options import ConnectOptions, parse_read_options, parse_write_options
from rabbitry.spark._rows import PROPERTY_FIELDS, READ_SCHEMA, message_rows
from rabbitry.spark._write import PublishFailed, publish_batches, publish_rows

SPARK_SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("routing_key", StringType()),
        StructField("exchange", StringType()),
        StructField("queue", StringType()),
        StructField("offset", LongType()),
        StructField("delivery_tag", LongType()),
        StructField("redelivered", BooleanType()),
        StructField("delivery_count", IntegerType()),
        StructField("message_id", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField(
            "properties",
            StructType(
                [
                    StructField(name, StringType() if kind == "STRING" else IntegerType())
                    for name, kind in PROPERTY_FIELDS
                ]
            ),
        ),
    ]
)


class _Source(DataSource):
    @classmethod
    def name(cls) -> str:
        return "rabbitmq"


def _spark_batches(rows: list[tuple[Any, ...]]) -> pa.Table:
    """What PySpark makes of row tuples (the path the readers used to take)."""
    batches = list(records_to_arrow_batches(iter(rows), 10_000, SPARK_SCHEMA, _Source({})))
    return pa.Table.from_batches(batches, schema=READ_ARROW_SCHEMA)


def _message(tag: int, body: bytes = b"hi", redelivered: bool = False, **props: Any) -> Message:
    return Message(
        body=body,
        properties=BasicProperties(**props),
        delivery_tag=tag,
        redelivered=redelivered,
        exchange="ex" if tag % 2 else "",
        routing_key=f"rk{tag}",
    )


def _envelope(tag: int, *records: bytes) -> Message:
    headers = envelope_headers({"h": "shared"}, len(records))
    return Message(
        body=encode_records(list(records)),
        properties=BasicProperties(headers=headers, app_id="batcher", message_id="env"),
        delivery_tag=tag,
        redelivered=True,
        exchange="ex",
        routing_key="rk",
    )


def _mix() -> list[Message]:
    when = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    return [
        _message(1),  # no headers, no properties
        _message(2, body=b""),  # empty body
        _message(
            3,
            redelivered=True,
            headers={
                "x-delivery-count": 3,
                "n": 1,
                "f": 1.5,
                "flag": True,
                "t": {"a": [1, 2], "b": {"c": "d"}},
                "l": [1, "x", b"y"],
                "b": b"raw\xff",
                "ts": when,
                "d": Decimal("12.345"),
                "none": None,
                "text": "plain",
            },
        ),
        _message(
            4,
            content_type="text/plain",
            content_encoding="gzip",
            delivery_mode=2,
            priority=5,
            correlation_id="c",
            reply_to="r",
            expiration="60000",
            type="t",
            user_id="guest",
            app_id="app",
            message_id="m4",
            timestamp=when,
        ),
        _message(5, message_id="m5", timestamp=1_700_000_000),  # seconds, as one may build it
        _message(6, timestamp=datetime(2024, 5, 6, 7, 8, tzinfo=timezone(timedelta(hours=2)))),
        _message(7, headers={}),  # an empty table: no map, as for no headers
        _message(8, headers={"x-stream-offset": 42, "x-delivery-count": "not a number"}),
        _envelope(9, b"r0", b"", b"r2"),
        _message(10, body=bytes(range(256)) * 40),
    ]


def _rows_of(messages: list[Message], consecutive: bool) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    offset = 100
    for message in messages:
        added = message_rows(message, "q", offset, consecutive=consecutive)
        rows.extend(added)
        offset += len(added) if consecutive else 1
    return rows


def _arrow_of(
    messages: list[Message], consecutive: bool, **limits: int
) -> tuple[list[Any], ArrowRows]:
    builder = ArrowRows("q", **limits)
    batches: list[Any] = []
    offset = 100
    for message in messages:
        added = builder.add(message, offset, consecutive=consecutive)
        batches.extend(builder.ready())
        offset += added if consecutive else 1
    batches.extend(builder.finish())
    return batches, builder


def test_the_arrow_schema_is_the_read_schema_as_spark_converts_it() -> None:
    ddl = READ_SCHEMA.lower().replace(": ", ":").replace(", ", ",")
    assert SPARK_SCHEMA.simpleString() == "struct<" + re.sub(r"(^|,)(\w+) ", r"\1\2:", ddl) + ">"
    assert to_arrow_schema(SPARK_SCHEMA, timezone="UTC").equals(READ_ARROW_SCHEMA)


@pytest.mark.parametrize("consecutive", [False, True])
def test_reader_batches_equal_the_rows_spark_made_from_tuples(consecutive: bool) -> None:
    messages = _mix()
    expected = _spark_batches(_rows_of(messages, consecutive))
    batches, builder = _arrow_of(messages, consecutive)
    assert len(batches) == 1
    assert all(batch.schema.equals(READ_ARROW_SCHEMA) for batch in batches)
    got = pa.Table.from_batches(batches)
    assert got.num_rows == len(messages) + 2  # the envelope gives three rows
    assert got.to_pylist() == expected.to_pylist()
    assert got.equals(expected)
    assert builder.rows == got.num_rows
    assert builder.bytes == sum(len(b) for b in got.column("body").to_pylist())
    assert builder.redelivered == 4  # message 3 and the envelope's three records


def test_reader_batches_are_bounded_and_never_split_a_delivery() -> None:
    messages = _mix()
    expected = _spark_batches(_rows_of(messages, True))
    batches, _ = _arrow_of(messages, True, max_rows=4)
    # 4, then 4 (message 8 closes it), then the envelope's three records and message 10
    assert [b.num_rows for b in batches] == [4, 4, 4]
    assert pa.Table.from_batches(batches).equals(expected)
    batches, _ = _arrow_of(messages, True, max_bytes=10_000)
    assert [b.num_rows for b in batches] == [12]
    batches, _ = _arrow_of(messages, True, max_bytes=1)
    # the empty body of message 2 does not close a batch
    assert [b.num_rows for b in batches] == [1, 2, 1, 1, 1, 1, 1, 3, 1]
    assert pa.Table.from_batches(batches).equals(expected)


class _FakeChannel:
    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.acks: list[int] = []
        self.is_open = True
        self.epoch = 0
        self.stale_settlements = 0

    def basic_qos(self, prefetch: int) -> None:
        pass

    def basic_consume(self, queue: str, callback: Any, arguments: Any = None, **_: Any) -> str:
        refuse_like_a_classic_queue(queue, arguments)
        for message in self.messages:
            callback(message)
        return "tag"

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.acks.append(tag)

    def queue_declare(self, queue: str, **_: Any) -> Any:
        return None

    def close(self) -> None:
        pass  # the one channel the fake connection hands out stays usable


class _FakeConnection:
    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.is_open = True
        self.close_exc = None

    def channel(self) -> Any:
        return self._channel

    def publisher(self, **_: Any) -> Any:
        return self._channel

    def close(self, timeout: float | None = None) -> None:
        self.is_open = False


def test_queue_consumer_reads_the_same_rows_into_arrow() -> None:
    messages = _mix()
    options = parse_read_options(
        {"queue": "q", "maxMessagesPerBatch": "100", "pollTimeoutMs": "1", "idleTimeoutMs": "1"}
    )
    tuples = QueueConsumer(options, connect=lambda _c: _FakeConnection(_FakeChannel(messages)))  # type: ignore[arg-type,return-value]
    rows, end = tuples.read(7)
    arrow = QueueConsumer(options, connect=lambda _c: _FakeConnection(_FakeChannel(messages)))  # type: ignore[arg-type,return-value]
    builder = ArrowRows("q")
    assert arrow.read_into(7, builder) == end == 7 + len(rows)
    expected = pa.Table.from_batches(list(_spark_batches(rows).to_batches()))
    assert pa.Table.from_batches(builder.finish()).equals(expected)


def test_destructive_read_acks_a_batch_before_handing_it_to_spark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    messages = [_message(tag) for tag in range(1, 11)]
    channel = _FakeChannel(messages)
    monkeypatch.setattr(ConnectOptions, "connect", lambda self, suffix="": _FakeConnection(channel))
    options = parse_read_options({"queue": "q", "pollTimeoutMs": "1", "consume": "destructive"})
    reader = consume_share(options, 10, 0)  # prefetch 10: batches of 5 deliveries
    # Acknowledged (and confirmed by a basic.qos round trip) before Spark gets the rows:
    # a connection that recovers later cannot bring them back into the same read.
    first = next(reader)
    assert first.num_rows == 5 and channel.acks == [5]
    second = next(reader)
    assert second.num_rows == 5 and channel.acks == [5, 10]
    with pytest.raises(StopIteration):
        next(reader)
    assert channel.acks == [5, 10]
    rows = _rows_of(messages, True)
    rows = [(*row[:4], index, *row[5:]) for index, row in enumerate(rows)]
    assert pa.Table.from_batches([first, second]).equals(_spark_batches(rows))


# ---------------------------------------------------------------- writes


class _Recorder:
    """A publisher and channel that records what is published and confirms it."""

    def __init__(self) -> None:
        self.published: list[tuple[bytes, str, str, dict[str, Any]]] = []

    def exchange_declare(self, name: str, passive: bool = False) -> None:
        pass

    def close(self) -> None:
        pass

    def publish(
        self, body: bytes, *, exchange: str, routing_key: str, properties: BasicProperties
    ) -> concurrent.futures.Future[None]:
        fields = {name: getattr(properties, name) for name in BasicProperties.FIELDS}
        self.published.append((body, exchange, routing_key, fields))
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_result(None)
        return future


def _published(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, str], publish: Any, data: Any
) -> tuple[Any, list[tuple[bytes, str, str, dict[str, Any]]]]:
    recorder = _Recorder()
    monkeypatch.setattr(
        ConnectOptions, "connect", lambda self, suffix="": _FakeConnection(recorder)
    )
    result = publish(parse_write_options(options), data, "job:1", 1, 0)
    return result, recorder.published


_WRITE_SCHEMA = pa.schema(
    [
        ("body", pa.binary()),
        ("routing_key", pa.string()),
        ("exchange", pa.string()),
        ("message_id", pa.string()),
        ("headers", pa.map_(pa.string(), pa.string())),
        (
            "properties",
            pa.struct(
                [
                    ("content_type", pa.string()),
                    ("priority", pa.int32()),
                    ("delivery_mode", pa.int32()),
                    ("app_id", pa.string()),
                ]
            ),
        ),
    ]
)

_WRITE_ROWS: list[dict[str, Any]] = [
    {
        "body": b"a",
        "routing_key": None,
        "exchange": None,
        "message_id": None,
        "headers": None,
        "properties": None,
    },
    {
        "body": b"",
        "routing_key": "rk",
        "exchange": "ex",
        "message_id": "mine",
        "headers": {"h": "1", "n": None},
        "properties": {"content_type": "t/p", "priority": 3, "delivery_mode": 1},
    },
    {
        "body": b"\x00\xff",
        "routing_key": "",
        "exchange": "",
        "message_id": None,
        "headers": {},
        "properties": {"app_id": "x", "priority": None},
    },
]


@pytest.mark.parametrize("persistent", ["true", "false"])
def test_the_writer_publishes_the_same_messages_from_arrow(
    monkeypatch: pytest.MonkeyPatch, persistent: str
) -> None:
    options = {"routingKey": "default", "exchange": "amq.topic", "persistent": persistent}
    batch = pa.RecordBatch.from_pylist(_WRITE_ROWS, schema=_WRITE_SCHEMA)
    spark_rows = batch.to_pylist()  # the rows the writer used to publish
    expected_result, expected = _published(monkeypatch, options, publish_rows, spark_rows)
    result, got = _published(monkeypatch, options, publish_batches, [batch, batch.slice(1)])
    assert got == expected + expected[1:2] + [
        (*expected[2][:3], {**expected[2][3], "message_id": "job:1:4"})
    ]
    assert [m[3]["message_id"] for m in got] == ["job:1:0", "mine", "job:1:2", "mine", "job:1:4"]
    assert got[1][3]["headers"] == {"h": "1", "n": None}
    assert (result.published, result.bytes) == (5, 3 + 2)
    assert expected_result.first_message_id == result.first_message_id == "job:1:0"


def test_the_writer_takes_value_or_string_bodies_from_arrow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [{"value": "text", "routing_key": "k"}, {"value": "é", "routing_key": None}]
    batch = pa.RecordBatch.from_pylist(rows)
    _, expected = _published(monkeypatch, {}, publish_rows, batch.to_pylist())
    _, got = _published(monkeypatch, {}, publish_batches, [batch])
    assert got == expected
    assert [m[:3] for m in got] == [(b"text", "", "k"), ("é".encode(), "", "")]


def test_the_writer_refuses_the_same_rows_from_arrow(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = pa.RecordBatch.from_pylist([{"body": b"x"}, {"body": None}])
    for publish, data in ((publish_rows, batch.to_pylist()), (publish_batches, [batch])):
        with pytest.raises(Exception, match="a row has a null body"):
            _published(monkeypatch, {}, publish, data)
    options = {"batchRecords": "3", "routingKey": "k"}
    batch = pa.RecordBatch.from_pylist(
        [{"body": b"a", "message_id": None}, {"body": b"b", "message_id": "m"}]
    )
    for publish, data in ((publish_rows, batch.to_pylist()), (publish_batches, [batch])):
        with pytest.raises(PublishFailed, match="row 1 has a 'message_id' value"):
            _published(monkeypatch, options, publish, data)


def test_the_writer_sends_the_same_envelopes_from_arrow(monkeypatch: pytest.MonkeyPatch) -> None:
    options = {"batchRecords": "3", "routingKey": "k"}
    rows = [{"body": b"r%d" % i, "routing_key": "a" if i < 4 else "b"} for i in range(8)]
    batch = pa.RecordBatch.from_pylist(rows)
    expected_result, expected = _published(monkeypatch, options, publish_rows, batch.to_pylist())
    result, got = _published(
        monkeypatch, options, publish_batches, [batch.slice(0, 5), batch.slice(5)]
    )
    assert got == expected
    assert [m[3]["message_id"] for m in got] == ["job:1:0", "job:1:3", "job:1:4", "job:1:7"]
    assert (result.published, result.last_message_id) == (8, expected_result.last_message_id)
