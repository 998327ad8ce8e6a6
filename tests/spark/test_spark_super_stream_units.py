"""Super streams in the data source without Spark or a broker: options, the write schema,
routing rows to partitions, and the stream reader's offsets and limits."""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from rabbitry.exceptions import ConfigurationError
from rabbitry.spark import datasource
from rabbitry.spark._options import ConnectOptions, parse_read_options, parse_write_options
from rabbitry.spark._super import (
    check_routing_type,
    check_write_schema,
    routed_batch_fields,
    routed_row_fields,
    share_limit,
)
from rabbitry.spark._write import publish_batches
from rabbitry.topology import SuperStream, partition_for

if TYPE_CHECKING:
    from rabbitry.protocol.spec import BasicProperties

_SUPER = {"superStream": "orders", "superStreamPartitions": "3"}

# ---------------------------------------------------------------- options


def test_read_options_of_a_super_stream() -> None:
    options = parse_read_options({"superstream": "orders", "superstreampartitions": "3"})
    assert options.super_stream == SuperStream("orders", 3)
    assert options.queue == "orders" and options.queue_type == "stream"
    assert options.streams == ("orders-0", "orders-1", "orders-2")
    one = options.for_stream("orders-1")
    assert one.queue == "orders-1" and one.super_stream is None and one.streams == ("orders-1",)
    keyed = parse_read_options({"superStream": "s", "superStreamBindingKeys": "eu, us"})
    assert keyed.streams == ("s-eu", "s-us")
    plain = parse_read_options({"queue": "q"})
    assert plain.streams == ("q",) and plain.for_stream("q") is plain


def test_starting_offsets_per_partition() -> None:
    options = parse_read_options(
        {**_SUPER, "startingOffsets": '{"orders-0": 5, "orders-2": "latest"}'}
    )
    assert options.starting_offsets == "earliest"
    assert [options.for_stream(s).starting_offsets for s in options.streams] == [
        "5",
        "earliest",
        "latest",
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"superStream": "orders"}, "option superStreamPartitions: required with superStream"),
        ({"queue": "q", "superStreamPartitions": "3"}, "option superStreamPartitions: needs"),
        ({"queue": "q", "superStreamBindingKeys": "a"}, "option superStreamBindingKeys: needs"),
        ({**_SUPER, "queue": "q"}, "option queue: not with superStream"),
        ({**_SUPER, "queueType": "quorum"}, "option queueType: a super stream's partitions"),
        ({**_SUPER, "superStreamPartitions": "0"}, "option superStreamPartitions: must be in"),
        ({"superStream": "s", "superStreamBindingKeys": "a,a"}, "superStreamBindingKeys: "),
        ({"superStream": "s", "superStreamBindingKeys": "a,,b"}, "superStreamBindingKeys: "),
        ({"superStream": "amq.s", "superStreamPartitions": "2"}, "option superStream: name"),
        ({**_SUPER, "superStreamBindingKeys": "a,b"}, "option superStreamPartitions: "),
        ({**_SUPER, "startingOffsets": '{"orders-9": 1}'}, "'orders-9' is not a partition"),
        ({**_SUPER, "startingOffsets": '{"orders-0": -1}'}, "offset must be ≥ 0"),
        ({**_SUPER, "startingOffsets": '{"orders-0": null}'}, "an offset or a name"),
        ({**_SUPER, "startingOffsets": "{nope"}, "option startingOffsets: not a JSON object"),
        ({"queue": "q", "startingOffsets": '{"q": 1}'}, "need option superStream"),
    ],
)
def test_read_option_errors_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace(".", r"\.")):
        parse_read_options(options)


def test_write_options_of_a_super_stream() -> None:
    options = parse_write_options({**_SUPER, "partitionKeyColumn": "customer"})
    assert options.exchange == "orders"
    assert options.super_stream == SuperStream("orders", 3)
    assert options.partition_key_column == "customer"
    assert parse_write_options({}).super_stream is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({**_SUPER, "exchange": "x"}, "option exchange: not with superStream"),
        ({**_SUPER, "routingKey": "k"}, "option routingKey: not with superStream"),
        ({"partitionKeyColumn": "c"}, "option partitionKeyColumn: needs option superStream"),
        ({**_SUPER, "partitionKeyColumn": " "}, "option partitionKeyColumn: empty"),
    ],
)
def test_write_option_errors_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_write_options(options)


# ---------------------------------------------------------------- write schema


@pytest.mark.parametrize(
    ("extra", "columns"),
    [
        ({"partitionKeyColumn": "customer"}, ["body", "customer", "headers"]),
        ({"partitionKeyColumn": "Customer"}, ["body", "customer"]),  # any case
        ({"partitionKeyColumn": "routing_key"}, ["value", "routing_key"]),
        ({}, ["body", "partition", "message_id"]),
    ],
)
def test_write_schema_accepted(extra: dict[str, str], columns: list[str]) -> None:
    check_write_schema(parse_write_options({**_SUPER, **extra}), columns)


@pytest.mark.parametrize(
    ("extra", "columns", "message"),
    [
        ({}, ["body"], "give option partitionKeyColumn .* or a 'partition' column"),
        ({"partitionKeyColumn": "c"}, ["body"], "the rows have no column 'c'"),
        ({"partitionKeyColumn": "c"}, ["body", "c", "partition"], "also have a 'partition'"),
        ({}, ["body", "partition", "exchange"], "the column 'exchange' cannot be written"),
        ({}, ["body", "partition", "routing_key"], "the column 'routing_key' cannot be"),
        ({}, ["body", "partition", "other"], "unknown column"),
    ],
)
def test_write_schema_refused(extra: dict[str, str], columns: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        check_write_schema(parse_write_options({**_SUPER, **extra}), columns)


def test_without_a_super_stream_a_partition_column_is_unknown() -> None:
    with pytest.raises(ConfigurationError, match="unknown column"):
        check_write_schema(parse_write_options({}), ["body", "partition"])


# ---------------------------------------------------------------- routing rows


def _keys(n: int) -> list[str]:
    return [f"customer-{i}" for i in range(n)]


def test_rows_go_to_the_partition_of_their_key() -> None:
    options = parse_write_options({**_SUPER, "partitionKeyColumn": "Customer"})
    keys = _keys(20)
    batch = pa.record_batch({"body": [k.encode() for k in keys], "Customer": keys})
    fields = list(routed_batch_fields(options, [batch]))
    assert [f[1] for f in fields] == [str(partition_for(k, 3)) for k in keys]
    assert {f[2] for f in fields} == {"orders"}
    assert [f[0] for f in fields] == [k.encode() for k in keys]
    as_dicts = [{"body": k.encode(), "Customer": k} for k in keys]
    assert list(routed_row_fields(options, as_dicts)) == fields


def test_integer_keys_and_the_routing_key_column() -> None:
    options = parse_write_options({**_SUPER, "partitionKeyColumn": "routing_key"})
    batch = pa.record_batch({"body": [b"a", b"b"], "routing_key": ["k1", "k2"]})
    assert [f[1] for f in routed_batch_fields(options, [batch])] == [
        str(partition_for("k1", 3)),
        str(partition_for("k2", 3)),
    ]
    by_id = parse_write_options({**_SUPER, "partitionKeyColumn": "id"})
    batch = pa.record_batch({"body": [b"a"], "id": pa.array([12345], pa.int64())})
    assert next(routed_batch_fields(by_id, [batch]))[1] == str(partition_for("12345", 3))


def test_explicit_partition_column() -> None:
    options = parse_write_options(
        {"superStream": "s", "superStreamBindingKeys": "eu,us", "batchRecords": "1"}
    )
    batch = pa.record_batch({"body": [b"a", b"b", b"c"], "partition": [1, 0, 1]})
    assert [f[1] for f in routed_batch_fields(options, [batch])] == ["us", "eu", "us"]


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("partition", 3, r"column 'partition': must be a partition index in 0\.\.2"),
        ("partition", -1, "must be a partition index"),
        ("partition", None, "must be a partition index"),
        ("key", None, "column 'key': a row has no partition key"),
        ("key", 1.5, "column 'key' .*a partition key must be a str, bytes or int"),
    ],
)
def test_bad_routing_values(column: str, value: Any, message: str) -> None:
    extra = {"partitionKeyColumn": "key"} if column == "key" else {}
    options = parse_write_options({**_SUPER, **extra})
    batch = pa.record_batch({"body": [b"x"], column: [value]})
    with pytest.raises(ConfigurationError, match=message):
        list(routed_batch_fields(options, [batch]))


class _Recorder:
    """A connection, channel and publisher in one: records and confirms each publish."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str, bytes]] = []
        self.declared: list[str] = []
        self.is_open = True

    def channel(self) -> _Recorder:
        return self

    def publisher(self, **_: Any) -> _Recorder:
        return self

    def exchange_declare(self, name: str, passive: bool = False) -> None:
        self.declared.append(name)

    def close(self, timeout: float | None = None) -> None:
        pass

    def publish(
        self, body: bytes, *, exchange: str, routing_key: str, properties: BasicProperties
    ) -> concurrent.futures.Future[None]:
        self.published.append((exchange, routing_key, body))
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_result(None)
        return future


@pytest.mark.parametrize("batch_records", ["1", "4"])
def test_publish_routes_each_row(monkeypatch: pytest.MonkeyPatch, batch_records: str) -> None:
    recorder = _Recorder()
    monkeypatch.setattr(ConnectOptions, "connect", lambda self, suffix="": recorder)
    options = parse_write_options(
        {**_SUPER, "partitionKeyColumn": "key", "batchRecords": batch_records}
    )
    keys = _keys(12)
    batch = pa.record_batch({"body": [k.encode() for k in keys], "key": keys})
    result = publish_batches(options, [batch], "job:0", 0, 0)
    assert result.confirmed == 12
    assert recorder.declared == ["orders"]  # checkExchange: the super stream's exchange
    assert {exchange for exchange, _key, _body in recorder.published} == {"orders"}
    if batch_records == "1":
        routed = [(key, body.decode()) for _x, key, body in recorder.published]
        assert routed == [(str(partition_for(k, 3)), k) for k in keys]
    else:  # envelopes hold consecutive rows of one partition only
        assert len(recorder.published) > 1


# ---------------------------------------------------------------- reading


@pytest.mark.parametrize(
    ("available", "limit", "expected"),
    [
        ({"a": 10, "b": 10, "c": 10}, 9, {"a": 3, "b": 3, "c": 3}),
        ({"a": 1, "b": 10, "c": 10}, 9, {"a": 1, "b": 4, "c": 4}),
        ({"a": 0, "b": 10}, 4, {"a": 0, "b": 4}),
        ({"a": 2, "b": 3}, 100, {"a": 2, "b": 3}),
        ({"a": 10, "b": 10, "c": 10}, 2, {"a": 1, "b": 1, "c": 0}),
        ({"a": 5, "b": 5}, 0, {"a": 0, "b": 0}),
        ({"a": 7}, 3, {"a": 3}),
    ],
)
def test_share_limit(available: dict[str, int], limit: int, expected: dict[str, int]) -> None:
    assert share_limit(available, limit) == expected


def test_share_limit_fills_the_batch_without_overdrawing() -> None:
    available = {f"s{i}": (i * 37) % 11 for i in range(7)}
    for limit in range(sum(available.values()) + 3):
        taken = share_limit(available, limit)
        assert sum(taken.values()) == min(limit, sum(available.values()))
        assert all(0 <= taken[s] <= available[s] for s in available)


class _Limit:
    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows


def test_stream_reader_offsets_per_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    tails = {"orders-0": 10, "orders-1": 4, "orders-2": 0}
    checked: list[tuple[str, ...]] = []
    # No broker here: the partitions' queues are taken as they are given.
    monkeypatch.setattr(
        datasource, "check_partition_count", lambda connect, layout: checked.append(layout.queues)
    )
    monkeypatch.setattr(datasource, "stream_tail", lambda options: tails[options.queue])
    monkeypatch.setattr(datasource, "resolve_start", lambda options, spec: int(spec))
    options = parse_read_options(
        {**_SUPER, "startingOffsets": '{"orders-0": 2, "orders-1": 1, "orders-2": 0}'}
    )
    reader = datasource.StreamQueueReader(options)
    assert checked == [("orders-0", "orders-1", "orders-2")]  # once, when the reader starts
    start = reader.initialOffset()
    assert start == {"partitions": {"orders-0": 2, "orders-1": 1, "orders-2": 0}}
    end = reader.latestOffset(start, _Limit(6))
    assert end == {"partitions": {"orders-0": 5, "orders-1": 4, "orders-2": 0}}
    ranges = reader.partitions(start, end)
    assert [(r.stream, r.start, r.end) for r in ranges] == [
        ("orders-0", 2, 5),
        ("orders-1", 1, 4),
    ]
    assert reader.latestOffset(end, _Limit(100)) == {
        "partitions": {"orders-0": 10, "orders-1": 4, "orders-2": 0}
    }
    reader.prepareForTriggerAvailableNow()
    tails["orders-2"] = 50  # arrived after the AvailableNow run began: not read by it
    assert reader.latestOffset(end, _Limit(100))["partitions"]["orders-2"] == 0
    with pytest.raises(ConfigurationError, match="a checkpoint cannot be reused"):
        reader.partitions({"partitions": {"orders-0": 1}}, end)
    with pytest.raises(ConfigurationError, match="a checkpoint cannot be reused"):
        reader.partitions({"offset": 3}, end)


def test_single_stream_offsets_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasource, "stream_tail", lambda options: 100)
    monkeypatch.setattr(datasource, "resolve_start", lambda options, spec: 7)
    reader = datasource.StreamQueueReader(parse_read_options({"queue": "s", "queueType": "stream"}))
    assert reader.initialOffset() == {"offset": 7}
    assert reader.latestOffset({"offset": 7}, _Limit(50)) == {"offset": 57}
    assert [
        (r.stream, r.start, r.end) for r in reader.partitions({"offset": 7}, {"offset": 57})
    ] == [("s", 7, 57)]


@pytest.mark.parametrize(
    ("options", "types", "refused"),
    [
        ({}, {"partition": "string", "body": "string"}, "column 'partition': must be an integer"),
        ({}, {"partition": "double"}, "got double"),
        ({"partitionKeyColumn": "k"}, {"k": "double"}, r"column 'k' \(partitionKeyColumn\)"),
        ({"partitionKeyColumn": "k"}, {"k": "timestamp"}, "got timestamp"),
        ({"partitionKeyColumn": "K"}, {"k": "array<string>"}, "got array<string>"),
    ],
)
def test_a_routing_column_of_a_type_no_row_could_route_is_refused_when_planned(
    options: dict[str, str], types: dict[str, str], refused: str
) -> None:
    write = parse_write_options({**_SUPER, **options})
    with pytest.raises(ConfigurationError, match=refused):
        check_routing_type(write, types)


@pytest.mark.parametrize(
    ("options", "types"),
    [
        ({}, {"partition": "int"}),
        ({}, {"partition": "bigint"}),
        ({"partitionKeyColumn": "k"}, {"k": "string"}),
        ({"partitionKeyColumn": "k"}, {"k": "binary"}),
        ({"partitionKeyColumn": "k"}, {"k": "bigint"}),
    ],
)
def test_a_routing_column_of_a_type_the_hash_takes_is_accepted(
    options: dict[str, str], types: dict[str, str]
) -> None:
    check_routing_type(parse_write_options({**_SUPER, **options}), types)
