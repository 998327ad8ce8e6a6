"""Client-side rules for stream/quorum consumers, Message.stream_offset, and the Shards model."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from tests.unit.test_api_twins import _member_differences

from rabbitry import ConfigurationError, Properties
from rabbitry.message import Message
from rabbitry.record import RecordedQueue, TopologyRecord
from rabbitry.sharding import (
    CONSISTENT_HASH,
    AsyncShardedConsumer,
    AsyncShardedPublisher,
    ShardedConsumer,
    ShardedPublisher,
    Shards,
)
from rabbitry.streams import check_consume, stream_offset_argument

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize("offset", ["first", "last", "next", 0, 42, 2**63 - 1, NOW])
def test_valid_stream_offsets_pass_unchanged(offset: object) -> None:
    assert stream_offset_argument(offset) == offset


@pytest.mark.parametrize("offset", ["First", "", "1h", -1, 2**63, True, 1.5, None, b"first"])
def test_invalid_stream_offsets_name_the_field(offset: object) -> None:
    with pytest.raises(ConfigurationError, match="x-stream-offset"):
        stream_offset_argument(offset)


def record_with(name: str, kind: str) -> TopologyRecord:
    record = TopologyRecord()
    record.add_queue(RecordedQueue(name, arguments={"x-queue-type": kind}))
    return record


def test_stream_consumer_needs_prefetch_and_manual_ack() -> None:
    args = {"x-stream-offset": "first"}
    check_consume("s", args, no_ack=False, qos=(10, 0, False))  # fine
    with pytest.raises(ConfigurationError, match=r"^prefetch: .*needs a prefetch"):
        check_consume("s", args, no_ack=False, qos=None)
    with pytest.raises(ConfigurationError, match=r"^prefetch: "):
        check_consume("s", args, no_ack=False, qos=(0, 0, False))
    with pytest.raises(ConfigurationError, match=r"^no_ack: .*manual"):
        check_consume("s", args, no_ack=True, qos=(10, 0, False))


def test_a_recorded_stream_is_known_without_an_offset_argument() -> None:
    record = record_with("s", "stream")
    with pytest.raises(ConfigurationError, match="prefetch"):
        check_consume("s", None, no_ack=False, qos=None, record=record)
    check_consume("other", None, no_ack=False, qos=None, record=record)  # unknown queue


@pytest.mark.parametrize("kind", ["quorum", "stream"])
def test_global_qos_is_refused_for_replicated_queues(kind: str) -> None:
    record = record_with("q", kind)
    with pytest.raises(ConfigurationError, match=r"^global_: .*global QoS"):
        check_consume("q", None, no_ack=False, qos=(10, 0, True), record=record)
    check_consume("q", None, no_ack=False, qos=(10, 0, False), record=record)
    # Classic queues (or unknown ones) may use global QoS.
    check_consume("c", None, no_ack=False, qos=(10, 0, True), record=record)


def test_offset_on_a_recorded_non_stream_queue_is_refused() -> None:
    record = record_with("q", "quorum")
    with pytest.raises(ConfigurationError, match="only stream queues"):
        check_consume("q", {"x-stream-offset": 0}, no_ack=False, qos=(1, 0, False), record=record)


def test_message_stream_offset_reads_the_header() -> None:
    assert Message(b"", Properties(headers={"x-stream-offset": 7})).stream_offset == 7
    assert Message(b"", Properties()).stream_offset is None
    assert Message(b"", Properties(headers={"x-stream-offset": "7"})).stream_offset is None


# --------------------------------------------------------------------------- sharding


def test_shards_topology() -> None:
    shards = Shards("orders", 3, weight=4)
    topology = shards.topology()
    assert shards.queue_names == ["orders.0", "orders.1", "orders.2"]
    (exchange,) = topology.exchanges
    assert exchange.type == CONSISTENT_HASH
    assert [q.name for q in topology.queues] == shards.queue_names
    assert [(b.source, b.destination, b.routing_key) for b in topology.bindings] == [
        ("orders", f"orders.{i}", "4") for i in range(3)
    ]


def test_shards_hash_header() -> None:
    shards = Shards("ex", 2, queue_prefix="work", hash_header="tenant", queue_type="quorum")
    assert shards.queue_names == ["work.0", "work.1"]
    (exchange,) = shards.topology().exchanges
    assert dict(exchange.arguments or {}) == {"hash-header": "tenant"}
    assert {q.queue_type for q in shards.topology().queues} == {"quorum"}
    assert shards.headers_for("t1", {"a": 1}) == {"a": 1, "tenant": "t1"}
    assert Shards("ex", 2).headers_for("t1", None) is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"exchange": "", "count": 2}, "exchange"),
        ({"exchange": "e", "count": 0}, "count"),
        ({"exchange": "e", "count": 1025}, "count"),
        ({"exchange": "e", "count": True}, "count"),
        ({"exchange": "e", "count": 2, "weight": 0}, "weight"),
        ({"exchange": "e", "count": 2, "hash_header": ""}, "hash_header"),
        ({"exchange": "e", "count": 2, "queue_type": "stream"}, "queue_type"),
        ({"exchange": "e", "count": 2, "queue_prefix": ""}, "queue_prefix"),
        ({"exchange": "e", "count": 2, "queue_prefix": "amq.x"}, "queue_prefix"),
    ],
)
def test_shards_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field}: "):
        Shards(**kwargs)


@pytest.mark.parametrize("cls", [AsyncShardedConsumer, ShardedConsumer])
def test_sharded_consumer_refuses_concurrency(cls: Any) -> None:
    async def handler(message: Message) -> None:
        pass

    with pytest.raises(ConfigurationError, match=r"^concurrency: "):
        cls(None, Shards("e", 2), handler, concurrency=4)


@pytest.mark.parametrize(
    ("async_cls", "sync_cls"),
    [(AsyncShardedPublisher, ShardedPublisher), (AsyncShardedConsumer, ShardedConsumer)],
)
def test_sharding_classes_are_twins(async_cls: type, sync_cls: type) -> None:
    problems = _member_differences(async_cls, sync_cls)
    assert not problems, "\n".join(problems)
