"""Super streams: RabbitMQ's partitioned streams, declared and routed over AMQP 0-9-1.

A super stream is a ``direct`` exchange with the argument ``x-super-stream: true`` and
N stream queues bound to it, one per partition. Partition ``i`` is bound with its
*binding key* and the binding argument ``x-stream-partition-order: i``, which is how
the stream clients learn the order of the partitions. RabbitMQ's own tooling
(``rabbitmq-streams add_super_stream``) names partition ``i`` ``<super stream>-<i>`` and
binds it with key ``"<i>"``; with explicit binding keys a partition is named
``<super stream>-<key>``.

Nothing here needs the ``rabbitmq_stream`` plugin: the exchange, the stream queues and
the bindings are plain AMQP 0-9-1 entities (stream queues are part of the broker since
3.9). The plugin is what stream-protocol clients connect to.

Routing. A stream-protocol producer using hash routing sends a message to partition
``murmur3_32(routing key as UTF-8, seed 104729) mod N`` (the hash taken as unsigned), in
partition order. :func:`partition_for` computes that index, so messages published over
AMQP 0-9-1 with the partition's binding key (:meth:`SuperStream.binding_key_for`) land
where those clients would put them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..exceptions import TopologyValidationError
from ._checks import MAX_AGE, check_arguments, check_encodable, check_integer, check_shortstr
from ._model import Binding, Exchange, Queue
from ._topology import Topology

if TYPE_CHECKING:
    from ._base import TopologyData

__all__ = [
    "PARTITION_ORDER_ARGUMENT",
    "SUPER_STREAM_ARGUMENT",
    "SUPER_STREAM_SEED",
    "SuperStream",
    "murmur3_32",
    "partition_for",
    "super_stream",
]

#: The exchange argument that marks a super stream's exchange.
SUPER_STREAM_ARGUMENT = "x-super-stream"
#: The binding argument that gives a partition's index in the super stream.
PARTITION_ORDER_ARGUMENT = "x-stream-partition-order"
#: The MurmurHash3 seed of the stream clients' hash routing.
SUPER_STREAM_SEED = 104729

_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _scramble(k: int) -> int:
    return (_rotl((k * 0xCC9E2D51) & _MASK, 15) * 0x1B873593) & _MASK


def murmur3_32(data: bytes | str, seed: int = 0) -> int:
    """MurmurHash3, x86 32-bit variant.

    Args:
        data: the bytes to hash (a ``str`` is hashed as UTF-8).
        seed: the seed, taken modulo 2**32.

    Returns:
        The hash as an unsigned 32-bit integer.
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    length = len(raw)
    whole = length - length % 4
    h = seed & _MASK
    for index in range(0, whole, 4):
        h ^= _scramble(int.from_bytes(raw[index : index + 4], "little"))
        h = (_rotl(h, 13) * 5 + 0xE6546B64) & _MASK
    if whole < length:
        h ^= _scramble(int.from_bytes(raw[whole:], "little"))
    h ^= length
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def _key_bytes(key: object) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return str(key).encode()
    raise TypeError(
        f"a partition key must be a str, bytes or int, got {type(key).__name__}: {key!r}"
    )


def partition_for(key: str | bytes | int, partitions: int) -> int:
    """The partition a stream client's hash routing sends ``key`` to.

    Args:
        key: the routing key: a ``str`` (hashed as UTF-8), ``bytes``, or an ``int``
            (hashed as its decimal digits).
        partitions: how many partitions the super stream has.

    Returns:
        The partition's index, ``murmur3_32(key, 104729) % partitions``.

    Raises:
        TypeError: ``key`` is of another type.
        ValueError: ``partitions`` is less than 1.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
    return murmur3_32(_key_bytes(key), SUPER_STREAM_SEED) % partitions


def _stream_arguments(
    entity: str,
    max_age: str | timedelta | None,
    max_segment_size_bytes: int | None,
    initial_cluster_size: int | None,
    arguments: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The x-arguments every partition gets, besides the typed queue fields."""
    result = check_arguments(entity, arguments)
    if max_age is not None:
        if isinstance(max_age, timedelta):
            seconds = max_age.total_seconds()
            if seconds < 1 or seconds != int(seconds):
                raise TopologyValidationError(
                    entity, "max_age (x-max-age)", f"must be whole seconds >= 1, got {max_age}"
                )
            max_age = f"{int(seconds)}s"
        if not (isinstance(max_age, str) and MAX_AGE.fullmatch(max_age)):
            raise TopologyValidationError(
                entity,
                "max_age (x-max-age)",
                f"must be a number and a unit Y, M, D, h, m or s (e.g. '7D'), or a "
                f"timedelta, got {max_age!r}",
            )
        result["x-max-age"] = max_age
    if max_segment_size_bytes is not None:
        result["x-stream-max-segment-size-bytes"] = check_integer(
            entity,
            "max_segment_size_bytes (x-stream-max-segment-size-bytes)",
            max_segment_size_bytes,
            1,
            None,
            "",
        )
    if initial_cluster_size is not None:
        result["x-initial-cluster-size"] = check_integer(
            entity,
            "initial_cluster_size (x-initial-cluster-size)",
            initial_cluster_size,
            1,
            None,
            "",
        )
    check_encodable(entity, result)
    return result


@dataclasses.dataclass(frozen=True, init=False)
class SuperStream:
    """The layout of a super stream: its name, and each partition's queue and binding key.

    ``SuperStream("orders", 3)`` is RabbitMQ's default layout: queues ``orders-0``,
    ``orders-1``, ``orders-2`` bound with keys ``"0"``, ``"1"``, ``"2"``.
    ``SuperStream("orders", binding_keys=["eu", "us"])`` names them ``orders-eu`` and
    ``orders-us``. ``queues=`` gives other names (a super stream created by a stream
    client may have any). :meth:`from_topology` reads the layout from a topology, e.g.
    one loaded from the broker's definitions.

    Args:
        name: the super stream (its exchange's name).
        partitions: how many partitions (>= 1); may be left out when ``binding_keys``
            or ``queues`` say it.
        binding_keys: each partition's binding key, in partition order (unique, not
            empty); default ``"0"``, ``"1"``, ...
        queues: each partition's stream queue, in partition order; default
            ``<name>-<binding key>``.

    Raises:
        TopologyValidationError: a value breaks a rule; the message names the field.

    Attributes:
        name: the super stream's name.
        binding_keys: the binding keys, in partition order.
        queues: the partitions' stream queues, in partition order.
    """

    name: str
    binding_keys: tuple[str, ...]
    queues: tuple[str, ...]

    def __init__(
        self,
        name: str,
        partitions: int | None = None,
        *,
        binding_keys: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
    ) -> None:
        entity = f"super stream {name!r}" if isinstance(name, str) else "super stream"
        check_shortstr(entity, "name", name, empty=False)
        if name.startswith("amq."):
            raise TopologyValidationError(
                entity, "name", "names starting with 'amq.' are reserved by the broker"
            )
        keys = _names(entity, "binding_keys", binding_keys)
        names = _names(entity, "queues", queues)
        counts = {len(x) for x in (keys, names) if x is not None}
        if partitions is not None:
            counts.add(check_integer(entity, "partitions", partitions, 1, None, ""))
        if not counts:
            raise TopologyValidationError(
                entity, "partitions", "give the number of partitions or the binding keys"
            )
        if len(counts) > 1:
            raise TopologyValidationError(
                entity,
                "partitions",
                "partitions, binding_keys and queues disagree on the number of "
                f"partitions ({partitions!r}, {_count(keys)}, {_count(names)})",
            )
        count = counts.pop()
        if keys is None:
            keys = tuple(str(index) for index in range(count))
        if names is None:
            names = tuple(f"{name}-{key}" for key in keys)
            for queue in names:
                check_shortstr(entity, f"partition queue {queue!r}", queue)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "binding_keys", keys)
        object.__setattr__(self, "queues", names)

    @property
    def partitions(self) -> int:
        """How many partitions it has."""
        return len(self.queues)

    def partition_for(self, key: str | bytes | int) -> int:
        """The index of the partition hash routing sends ``key`` to (:func:`partition_for`).

        Args:
            key: the routing key (``str``, ``bytes`` or ``int``).

        Returns:
            The partition's index.
        """
        return partition_for(key, len(self.queues))

    def binding_key_for(self, key: str | bytes | int) -> str:
        """The binding key to publish ``key``'s message with, to reach its partition.

        Args:
            key: the routing key (``str``, ``bytes`` or ``int``).

        Returns:
            The binding key of partition :meth:`partition_for` (``key``).
        """
        return self.binding_keys[partition_for(key, len(self.queues))]

    def queue_for(self, key: str | bytes | int) -> str:
        """The stream queue hash routing sends ``key`` to.

        Args:
            key: the routing key (``str``, ``bytes`` or ``int``).

        Returns:
            The partition's queue name.
        """
        return self.queues[partition_for(key, len(self.queues))]

    def topology(
        self,
        *,
        max_age: str | timedelta | None = None,
        max_length_bytes: int | None = None,
        max_segment_size_bytes: int | None = None,
        initial_cluster_size: int | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> Topology:
        """The exchange, the partitions' stream queues and their bindings.

        The stream settings apply to every partition.

        Args:
            max_age: retention by age, ``x-max-age`` (``"7D"``, ``"12h"``: a number
                and a unit Y, M, D, h, m or s), or a ``timedelta`` of whole seconds.
            max_length_bytes: retention by size, ``x-max-length-bytes``, per partition.
            max_segment_size_bytes: ``x-stream-max-segment-size-bytes``.
            initial_cluster_size: ``x-initial-cluster-size`` (replicas at declaration).
            arguments: further queue arguments, sent as given.

        Returns:
            The topology (combine it with others with ``+``).

        Raises:
            TopologyValidationError: a value breaks a rule; the message names the field.
        """
        entity = f"super stream {self.name!r}"
        extra = _stream_arguments(
            entity, max_age, max_segment_size_bytes, initial_cluster_size, arguments
        )
        if max_length_bytes is not None:
            check_integer(
                entity, "max_length_bytes (x-max-length-bytes)", max_length_bytes, 0, None, ""
            )
        exchange = Exchange(self.name, "direct", arguments={SUPER_STREAM_ARGUMENT: True})
        queues = [
            Queue(
                queue,
                queue_type="stream",
                max_length_bytes=max_length_bytes,
                arguments=dict(extra) or None,
            )
            for queue in self.queues
        ]
        bindings = [
            Binding(self.name, queue, key, arguments={PARTITION_ORDER_ARGUMENT: index})
            for index, (queue, key) in enumerate(zip(self.queues, self.binding_keys, strict=True))
        ]
        return Topology([exchange], queues, bindings)

    @classmethod
    def from_topology(cls, topology: TopologyData, name: str) -> SuperStream:
        """The layout of super stream ``name`` as ``topology`` declares it.

        Works on a topology loaded from the broker's definitions
        (:meth:`Topology.from_definitions`): the partitions are the queues bound to the
        exchange with ``x-stream-partition-order``, in that order.

        Args:
            topology: the topology.
            name: the super stream.

        Returns:
            Its layout.

        Raises:
            TopologyValidationError: ``topology`` has no such super stream, or its
                partition order is not 0, 1, ... N-1.
        """
        entity = f"super stream {name!r}"
        exchange = topology.exchange(name)
        if exchange is None or not (exchange.arguments or {}).get(SUPER_STREAM_ARGUMENT):
            raise TopologyValidationError(
                entity,
                "name",
                f"the topology has no exchange {name!r} with {SUPER_STREAM_ARGUMENT}=true",
            )
        found: list[tuple[int, str, str]] = []
        for binding in topology.bindings:
            order = (binding.arguments or {}).get(PARTITION_ORDER_ARGUMENT)
            if (
                binding.source == name
                and binding.destination_type == "queue"
                and isinstance(order, int)
                and not isinstance(order, bool)
            ):
                found.append((order, binding.routing_key, binding.destination_name))
        found.sort()
        if [order for order, _key, _queue in found] != list(range(len(found))) or not found:
            orders = [order for order, _key, _queue in found]
            raise TopologyValidationError(
                entity,
                f"bindings[{PARTITION_ORDER_ARGUMENT!r}]",
                f"must number the partitions 0, 1, ... N-1 once each, got {orders}",
            )
        return cls(
            name,
            binding_keys=[key for _order, key, _queue in found],
            queues=[queue for _order, _key, queue in found],
        )


def _names(entity: str, field: str, values: Sequence[str] | None) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TopologyValidationError(
            entity, field, f"must be a sequence of str, got {type(values).__name__}"
        )
    result = tuple(values)
    if not result:
        raise TopologyValidationError(entity, field, "must not be empty")
    for index, value in enumerate(result):
        check_shortstr(entity, f"{field}[{index}]", value, empty=False)
    repeated = sorted({value for value in result if result.count(value) > 1})
    if repeated:
        raise TopologyValidationError(entity, field, f"must be unique, repeated: {repeated}")
    return result


def _count(values: tuple[str, ...] | None) -> str:
    return "None" if values is None else str(len(values))


def super_stream(
    name: str,
    partitions: int | None = None,
    *,
    binding_keys: Sequence[str] | None = None,
    max_age: str | timedelta | None = None,
    max_length_bytes: int | None = None,
    max_segment_size_bytes: int | None = None,
    initial_cluster_size: int | None = None,
    arguments: Mapping[str, Any] | None = None,
) -> Topology:
    """The topology of a super stream: ``SuperStream(...).topology(...)``.

    ``super_stream("orders", 3, max_age="7D")`` declares the exchange ``orders``
    (``direct``, ``x-super-stream: true``), the stream queues ``orders-0`` ..
    ``orders-2`` and their bindings (keys ``"0"`` .. ``"2"``, ``x-stream-partition-order``
    0 .. 2). Apply, verify, diff and delete it like any :class:`Topology`.

    Args:
        name: the super stream (its exchange's name).
        partitions: how many partitions (>= 1); may be left out with ``binding_keys``.
        binding_keys: each partition's binding key, in partition order (unique, not
            empty); partition queues are then ``<name>-<key>``.
        max_age: retention by age, ``x-max-age`` (``"7D"``), or a ``timedelta``.
        max_length_bytes: retention by size per partition, ``x-max-length-bytes``.
        max_segment_size_bytes: ``x-stream-max-segment-size-bytes``.
        initial_cluster_size: ``x-initial-cluster-size``.
        arguments: further arguments for every partition queue.

    Returns:
        The topology.

    Raises:
        TopologyValidationError: a value breaks a rule; the message names the field and
            the rule (raised before anything is sent).
    """
    layout = SuperStream(name, partitions, binding_keys=binding_keys)
    return layout.topology(
        max_age=max_age,
        max_length_bytes=max_length_bytes,
        max_segment_size_bytes=max_segment_size_bytes,
        initial_cluster_size=initial_cluster_size,
        arguments=arguments,
    )
