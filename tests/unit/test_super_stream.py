"""Super streams without a broker: the MurmurHash3 routing, the layout, the topology and
its validation."""

from __future__ import annotations

import pickle
from datetime import timedelta
from typing import Any

import pytest

from rabbitry.exceptions import TopologyValidationError
from rabbitry.topology import (
    PARTITION_ORDER_ARGUMENT,
    SUPER_STREAM_ARGUMENT,
    SUPER_STREAM_SEED,
    Binding,
    Exchange,
    Queue,
    SuperStream,
    Topology,
    murmur3_32,
    partition_for,
    super_stream,
)

# ---------------------------------------------------------------- MurmurHash3 x86_32

# Published verification values of MurmurHash3_x86_32 (every tail length 0..3 is covered).
_VECTORS = [
    (b"", 0, 0),
    (b"", 1, 0x514E28B7),
    (b"", 0xFFFFFFFF, 0x81F16F39),
    (b"\0\0\0\0", 0, 0x2362F9DE),
    (b"aaaa", 0x9747B28C, 0x5A97808A),
    (b"aaa", 0x9747B28C, 0x283E0130),
    (b"aa", 0x9747B28C, 0x5D211726),
    (b"a", 0x9747B28C, 0x7FA09EA6),
    (b"Hello, world!", 0x9747B28C, 0x24884CBA),
    (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
    (b"test", 0, 0xBA6BD213),
]


@pytest.mark.parametrize(("data", "seed", "expected"), _VECTORS)
def test_murmur3_known_vectors(data: bytes, seed: int, expected: int) -> None:
    assert murmur3_32(data, seed) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    # The hashes the RabbitMQ stream clients' hash routing computes (seed 104729).
    [("hello", 1321743225), ("brave", 3825276426), ("new", 2970740106), ("world", 2453398188)],
)
def test_murmur3_with_the_stream_clients_seed(key: str, expected: int) -> None:
    assert SUPER_STREAM_SEED == 104729
    assert murmur3_32(key, SUPER_STREAM_SEED) == expected
    assert partition_for(key, 3) == expected % 3
    assert partition_for(key, 1) == 0


def test_str_keys_hash_as_utf8_and_ints_as_digits() -> None:
    assert murmur3_32("é", 7) == murmur3_32("é".encode(), 7)
    assert partition_for(12345, 5) == partition_for("12345", 5) == partition_for(b"12345", 5)
    assert partition_for(bytearray(b"ab"), 7) == partition_for("ab", 7)


def test_partition_for_spreads_keys_over_every_partition() -> None:
    seen = {partition_for(f"customer-{n}", 4) for n in range(200)}
    assert seen == {0, 1, 2, 3}


@pytest.mark.parametrize("partitions", [0, -1, True, 2.0])
def test_partition_for_refuses_a_bad_count(partitions: Any) -> None:
    with pytest.raises(ValueError, match="partitions must be an integer >= 1"):
        partition_for("k", partitions)


@pytest.mark.parametrize("key", [None, 1.5, True, ("a",)])
def test_partition_for_refuses_other_key_types(key: Any) -> None:
    with pytest.raises(TypeError, match="a partition key must be a str, bytes or int"):
        partition_for(key, 3)


# ---------------------------------------------------------------- layout


def test_default_layout_is_rabbitmqs() -> None:
    layout = SuperStream("orders", 3)
    assert layout.partitions == 3
    assert layout.queues == ("orders-0", "orders-1", "orders-2")
    assert layout.binding_keys == ("0", "1", "2")
    key = "customer-42"
    index = partition_for(key, 3)
    assert layout.partition_for(key) == index
    assert layout.binding_key_for(key) == str(index)
    assert layout.queue_for(key) == f"orders-{index}"
    assert pickle.loads(pickle.dumps(layout)) == layout


def test_binding_keys_and_queues() -> None:
    layout = SuperStream("orders", binding_keys=["eu", "us"])
    assert layout.queues == ("orders-eu", "orders-us")
    assert SuperStream("orders", 2, binding_keys=["eu", "us"]) == layout
    named = SuperStream("orders", binding_keys=["a", "b"], queues=["qa", "qb"])
    assert named.queues == ("qa", "qb")
    assert named.queue_for("hello") == ("qa", "qb")[partition_for("hello", 2)]


@pytest.mark.parametrize(
    ("args", "kwargs", "field", "rule"),
    [
        (("orders",), {}, "partitions", "give the number of partitions or the binding keys"),
        (("orders", 0), {}, "partitions", "must be an integer >= 1, got 0"),
        (("orders", True), {}, "partitions", "must be an integer >= 1"),
        (("orders", 2.0), {}, "partitions", "must be an integer >= 1"),
        (("orders", 3), {"binding_keys": ["a", "b"]}, "partitions", "disagree"),
        (("orders",), {"binding_keys": ["a"], "queues": ["x", "y"]}, "partitions", "disagree"),
        (("orders",), {"binding_keys": ["a", "b", "a"]}, "binding_keys", "repeated: ['a']"),
        (("orders",), {"binding_keys": ["a", ""]}, "binding_keys[1]", "must not be empty"),
        (("orders",), {"binding_keys": "ab"}, "binding_keys", "must be a sequence of str"),
        (("orders",), {"binding_keys": []}, "binding_keys", "must not be empty"),
        (("orders",), {"binding_keys": ["a", 1]}, "binding_keys[1]", "must be a str"),
        (("orders",), {"queues": ["q", "q"]}, "queues", "repeated: ['q']"),
        (("", 3), {}, "name", "must not be empty"),
        ((7, 3), {}, "name", "must be a str"),
        (("amq.orders", 3), {}, "name", "reserved"),
        (("o" * 254, 1), {}, "partition queue", "at most 255 UTF-8 bytes"),
    ],
)
def test_layout_rules(args: tuple[Any, ...], kwargs: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(TopologyValidationError) as info:
        SuperStream(*args, **kwargs)
    assert info.value.field.startswith(field)
    assert rule in info.value.rule
    assert str(info.value).startswith("super stream")


# ---------------------------------------------------------------- topology


def test_super_stream_topology() -> None:
    topology = super_stream("orders", 3, max_age="7D", max_length_bytes=10**9)
    assert topology.exchanges == (
        Exchange("orders", "direct", arguments={SUPER_STREAM_ARGUMENT: True}),
    )
    assert [q.name for q in topology.queues] == ["orders-0", "orders-1", "orders-2"]
    for queue in topology.queues:
        assert queue.queue_type == "stream" and queue.durable
        assert queue.declare_arguments() == {
            "x-queue-type": "stream",
            "x-max-length-bytes": 10**9,
            "x-max-age": "7D",
        }
    assert [(b.destination, b.routing_key, b.arguments) for b in topology.bindings] == [
        (f"orders-{i}", str(i), {PARTITION_ORDER_ARGUMENT: i}) for i in range(3)
    ]


def test_stream_settings() -> None:
    topology = super_stream(
        "s",
        binding_keys=["a"],
        max_age=timedelta(hours=12),
        max_segment_size_bytes=5_000_000,
        initial_cluster_size=3,
        arguments={"x-queue-leader-locator": "balanced"},
    )
    assert topology.queues[0].name == "s-a"
    assert topology.queues[0].declare_arguments() == {
        "x-queue-type": "stream",
        "x-queue-leader-locator": "balanced",
        "x-max-age": "43200s",
        "x-stream-max-segment-size-bytes": 5_000_000,
        "x-initial-cluster-size": 3,
    }


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        ({"max_age": "7 days"}, "max_age (x-max-age)", "a number and a unit"),
        ({"max_age": 7}, "max_age (x-max-age)", "a number and a unit"),
        ({"max_age": timedelta(seconds=1.5)}, "max_age (x-max-age)", "whole seconds"),
        ({"max_length_bytes": -1}, "max_length_bytes (x-max-length-bytes)", ">= 0"),
        ({"max_segment_size_bytes": 0}, "max_segment_size_bytes", ">= 1"),
        ({"initial_cluster_size": 0}, "initial_cluster_size", ">= 1"),
        ({"arguments": {"x-bad": object()}}, "arguments", ""),
    ],
)
def test_stream_setting_rules(kwargs: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(TopologyValidationError) as info:
        super_stream("orders", 2, **kwargs)
    assert info.value.entity == "super stream 'orders'"
    assert info.value.field.startswith(field)
    assert rule in info.value.rule


def test_queue_rules_apply_to_the_partitions() -> None:
    with pytest.raises(TopologyValidationError, match="x-message-ttl"):
        super_stream("orders", 2, arguments={"x-message-ttl": 5})


def test_combines_diffs_and_round_trips_through_definitions() -> None:
    topology = super_stream("orders", 3) + Topology(queues=[Queue("other")])
    assert topology.diff(super_stream("orders", 3) + Topology(queues=[Queue("other")])) == []
    assert topology + super_stream("orders", 3) == topology
    lines = super_stream("orders", 3).diff(super_stream("orders", 4))
    assert any("orders-3" in line for line in lines), lines
    with pytest.raises(TopologyValidationError, match="defined twice"):
        _ = super_stream("orders", 2) + super_stream("orders", 2, max_age="1D")
    exported = Topology.from_definitions(topology.to_definitions())
    assert topology.diff(exported) == []
    assert SuperStream.from_topology(exported, "orders") == SuperStream("orders", 3)


def test_from_topology_reads_keys_and_queues_in_partition_order() -> None:
    bindings = [
        Binding("s", "q-b", "b", arguments={PARTITION_ORDER_ARGUMENT: 1}),
        Binding("s", "q-a", "a", arguments={PARTITION_ORDER_ARGUMENT: 0}),
        Binding("s", "other", "c"),
    ]
    topology = Topology(
        [Exchange("s", arguments={SUPER_STREAM_ARGUMENT: True})],
        [Queue("q-a", queue_type="stream"), Queue("q-b", queue_type="stream"), Queue("other")],
        bindings,
    )
    layout = SuperStream.from_topology(topology, "s")
    assert layout.binding_keys == ("a", "b")
    assert layout.queues == ("q-a", "q-b")


def test_from_topology_errors() -> None:
    with pytest.raises(TopologyValidationError, match="no exchange 'x'"):
        SuperStream.from_topology(Topology([Exchange("x")]), "x")
    gap = Topology(
        [Exchange("s", arguments={SUPER_STREAM_ARGUMENT: True})],
        [Queue("q", queue_type="stream")],
        [Binding("s", "q", "k", arguments={PARTITION_ORDER_ARGUMENT: 1})],
    )
    with pytest.raises(TopologyValidationError, match=r"0, 1, \.\.\. N-1 once each, got \[1\]"):
        SuperStream.from_topology(gap, "s")
