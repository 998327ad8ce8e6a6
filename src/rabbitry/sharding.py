"""Scale out one logical queue over N queues with the consistent-hash exchange.

One queue is served by one Erlang process (for a quorum queue, by one Raft leader), so
its throughput has a ceiling. :class:`Shards` describes the usual way past it: an
``x-consistent-hash`` exchange (plugin ``rabbitmq_consistent_hash_exchange``) with N
queues bound to it. The exchange hashes each message's routing key -- or, with
``hash_header``, the value of that header -- onto a ring on which every queue holds
points in proportion to its binding weight. So:

* every message with the same key goes to the same queue, and per-key order is the
  order in which they were published (a queue is FIFO) as long as each queue has one
  consumer handling one message at a time -- what :class:`AsyncShardedConsumer` does;
* keys spread over the queues in proportion to the weights (equal by default); the
  spread of a handful of hot keys is as uneven as the keys are;
* adding a queue moves only about 1/N of the keys.

:class:`AsyncShardedPublisher` declares the exchange and queues (idempotently, through
the topology model, so recovery re-declares them) and publishes with a key;
:class:`AsyncShardedConsumer` consumes every shard queue. ``ShardedPublisher`` and
``ShardedConsumer`` are the sync twins. The plugin must be enabled on the broker:
declaring the exchange otherwise fails with ``COMMAND_INVALID`` (503, "invalid exchange
type").
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .exceptions import ConfigurationError
from .protocol import spec
from .topology import Binding, Exchange, Queue, Topology

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures
    from collections.abc import Awaitable, Callable, Mapping

    from ._connection import AsyncConnection
    from .consumer import AsyncConsumer
    from .protocol.spec import BasicProperties
    from .publisher import AsyncPublisher, Body
    from .sync.connection import Connection
    from .sync.consumer import Consumer
    from .sync.publisher import Publisher

__all__ = [
    "CONSISTENT_HASH",
    "AsyncShardedConsumer",
    "AsyncShardedPublisher",
    "ShardedConsumer",
    "ShardedPublisher",
    "Shards",
]

#: The exchange type of the rabbitmq_consistent_hash_exchange plugin.
CONSISTENT_HASH: Final = "x-consistent-hash"
_MAX_SHARDS: Final = 1024
_MAX_WEIGHT: Final = 10_000


@dataclass(frozen=True)
class Shards:
    """N queues behind one ``x-consistent-hash`` exchange.

    Args:
        exchange: the exchange publishers send to.
        count: how many queues, 1..1024.
        queue_prefix: queue names are ``f"{queue_prefix}.{i}"`` for i in 0..count-1
            (default: the exchange name).
        weight: each queue's binding weight (its share of the hash ring), 1..10000.
        hash_header: hash this header's value instead of the routing key.
        queue_type: ``"classic"``, ``"quorum"`` or ``None`` (the broker's default).
        durable: durable exchange and queues.

    Raises:
        ConfigurationError: a field breaks a rule; the message names it.
    """

    exchange: str
    count: int
    queue_prefix: str | None = None
    weight: int = 1
    hash_header: str | None = None
    queue_type: str | None = None
    durable: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.exchange, str) or not self.exchange:
            raise ConfigurationError("exchange: must be a non-empty name")
        for field, value, high in (
            ("count", self.count, _MAX_SHARDS),
            ("weight", self.weight, _MAX_WEIGHT),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ConfigurationError(f"{field}: must be an integer in 1..{high}, got {value!r}")
        if self.hash_header is not None and (
            not isinstance(self.hash_header, str) or not self.hash_header
        ):
            raise ConfigurationError("hash_header: must be a non-empty header name or None")
        if self.queue_type not in (None, "classic", "quorum"):
            raise ConfigurationError(
                f"queue_type: must be 'classic', 'quorum' or None, got {self.queue_type!r} "
                "(a stream has no per-message routing to shard)"
            )
        if self.queue_prefix is not None and not self.queue_prefix:
            raise ConfigurationError("queue_prefix: must be a non-empty prefix or None")
        if re.match(r"amq\.", self.queue_names[0]):
            raise ConfigurationError("queue_prefix: names starting with 'amq.' are reserved")

    @property
    def queue_names(self) -> list[str]:
        """The shard queues, in order."""
        prefix = self.queue_prefix or self.exchange
        return [f"{prefix}.{i}" for i in range(self.count)]

    def topology(self) -> Topology:
        """The exchange, the queues and the weighted bindings, as a :class:`Topology`."""
        arguments = {"hash-header": self.hash_header} if self.hash_header else None
        exchange = Exchange(
            self.exchange, CONSISTENT_HASH, durable=self.durable, arguments=arguments
        )
        queues = [
            Queue(n, durable=self.durable, queue_type=self.queue_type) for n in self.queue_names
        ]
        # The consistent-hash exchange reads a binding's routing key as its weight.
        bindings = [Binding(self.exchange, q.name, str(self.weight)) for q in queues]
        return Topology(exchanges=[exchange], queues=queues, bindings=bindings)

    def headers_for(self, key: str, headers: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The headers to publish with: ``key`` under ``hash_header`` when set."""
        if self.hash_header is None:
            return dict(headers) if headers else None
        return {**(headers or {}), self.hash_header: key}


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"key: must be a non-empty string, got {key!r}")
    return key


def _properties(
    shards: Shards, key: str, properties: BasicProperties | None
) -> BasicProperties | None:
    """``properties`` with the key in the hash header, when the shards hash a header."""
    if shards.hash_header is None:
        return properties
    props = copy.copy(properties) if properties is not None else spec.BasicProperties()
    props.headers = shards.headers_for(key, props.headers)
    return props


class AsyncShardedPublisher:
    """Publishes to a :class:`Shards` exchange; the key picks the queue.

    Create with ``await AsyncShardedPublisher.create(connection, shards)``; it declares
    the topology (unless ``declare=False``) and opens an :class:`AsyncPublisher` with
    the given options (``max_in_flight``, ``republish_unconfirmed``...).
    """

    def __init__(self, shards: Shards, publisher: AsyncPublisher) -> None:
        self.shards = shards
        self.publisher = publisher

    @classmethod
    async def create(
        cls,
        connection: AsyncConnection,
        shards: Shards,
        *,
        declare: bool = True,
        **publisher_options: Any,
    ) -> AsyncShardedPublisher:
        if declare:
            await shards.topology().aapply(connection)
        return cls(shards, await connection.publisher(**publisher_options))

    async def __aenter__(self) -> AsyncShardedPublisher:
        return self

    async def __aexit__(self, exc_type: Any, *exc_info: Any) -> None:
        await self.publisher.__aexit__(exc_type, *exc_info)

    async def publish(
        self,
        body: Body,
        key: str,
        *,
        properties: BasicProperties | None = None,
        persistent: bool | None = None,
        timeout: float | None = None,
    ) -> None:
        """Publish ``body`` to the shard that ``key`` hashes to and wait for its confirm,
        as :meth:`AsyncPublisher.publish` does (it raises the same errors)."""
        await (
            await self.send(
                body, key, properties=properties, persistent=persistent, timeout=timeout
            )
        )

    async def send(
        self,
        body: Body,
        key: str,
        *,
        properties: BasicProperties | None = None,
        persistent: bool | None = None,
        timeout: float | None = None,
    ) -> asyncio.Future[None]:
        """Publish ``body`` to the shard that ``key`` hashes to; returns the confirm
        future of :meth:`AsyncPublisher.send`."""
        key = _check_key(key)
        return await self.publisher.send(
            body,
            exchange=self.shards.exchange,
            routing_key=key,
            properties=_properties(self.shards, key, properties),
            persistent=persistent,
            timeout=timeout,
        )

    async def wait_for_confirms(self, *, timeout: float | None = None) -> None:
        await self.publisher.wait_for_confirms(timeout=timeout)

    async def close(self, *, timeout: float | None = None) -> None:
        await self.publisher.close(timeout=timeout)


class ShardedPublisher:
    """The sync twin of :class:`AsyncShardedPublisher` (over a :class:`rabbitry.Publisher`)."""

    def __init__(self, shards: Shards, publisher: Publisher) -> None:
        self.shards = shards
        self.publisher = publisher

    @classmethod
    def create(
        cls,
        connection: Connection,
        shards: Shards,
        *,
        declare: bool = True,
        **publisher_options: Any,
    ) -> ShardedPublisher:
        if declare:
            shards.topology().apply(connection)
        return cls(shards, connection.publisher(**publisher_options))

    def __enter__(self) -> ShardedPublisher:
        return self

    def __exit__(self, exc_type: Any, *exc_info: Any) -> None:
        self.publisher.__exit__(exc_type, *exc_info)

    def send(
        self,
        body: Body,
        key: str,
        *,
        properties: BasicProperties | None = None,
        persistent: bool | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[None]:
        """The same as :meth:`publish` (the name the asyncio twin gives to the call that
        returns the future)."""
        return self.publish(
            body, key, properties=properties, persistent=persistent, timeout=timeout
        )

    def publish(
        self,
        body: Body,
        key: str,
        *,
        properties: BasicProperties | None = None,
        persistent: bool | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[None]:
        """Publish ``body`` to the shard that ``key`` hashes to; returns the confirm
        future of :meth:`rabbitry.Publisher.publish`."""
        key = _check_key(key)
        return self.publisher.publish(
            body,
            exchange=self.shards.exchange,
            routing_key=key,
            properties=_properties(self.shards, key, properties),
            persistent=persistent,
            timeout=timeout,
        )

    def wait_for_confirms(self, *, timeout: float | None = None) -> None:
        self.publisher.wait_for_confirms(timeout=timeout)

    def close(self, *, timeout: float | None = None) -> None:
        self.publisher.close(timeout=timeout)


class AsyncShardedConsumer:
    """Consumes every queue of a :class:`Shards` with one handler.

    Each shard queue gets its own consumer running one handler at a time, so messages
    of one key are handled in the order they were published; different shards run
    concurrently. ``prefetch`` and the other options apply per shard.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        shards: Shards,
        handler: Callable[[Any], Awaitable[Any]],
        *,
        prefetch: int = 100,
        declare: bool = True,
        **consumer_options: Any,
    ) -> None:
        if consumer_options.get("concurrency", 1) != 1:
            raise ConfigurationError(
                "concurrency: must be 1 per shard, or messages of one key could be "
                "handled out of order (add shards to scale out instead)"
            )
        self.shards = shards
        self._conn = connection
        self._declare = declare
        self.consumers: list[AsyncConsumer] = [
            connection.consumer(name, handler, prefetch=prefetch, **consumer_options)
            for name in shards.queue_names
        ]

    async def __aenter__(self) -> AsyncShardedConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self, timeout: float | None = None) -> None:
        """Declare the topology (unless ``declare=False``) and start every shard."""
        if self._declare:
            await self.shards.topology().aapply(self._conn, timeout=timeout)
        started: list[AsyncConsumer] = []
        try:
            for consumer in self.consumers:
                await consumer.start(timeout)
                started.append(consumer)
        except BaseException:
            for consumer in started:
                await consumer.stop()
            raise

    async def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        for consumer in self.consumers:
            if consumer.is_running:
                await consumer.stop(drain, timeout)


class ShardedConsumer:
    """The sync twin of :class:`AsyncShardedConsumer` (handlers run off the IO thread)."""

    def __init__(
        self,
        connection: Connection,
        shards: Shards,
        handler: Callable[[Any], Any],
        *,
        prefetch: int = 100,
        declare: bool = True,
        **consumer_options: Any,
    ) -> None:
        if consumer_options.get("concurrency", 1) != 1:
            raise ConfigurationError(
                "concurrency: must be 1 per shard, or messages of one key could be "
                "handled out of order (add shards to scale out instead)"
            )
        self.shards = shards
        self._conn = connection
        self._declare = declare
        self.consumers: list[Consumer] = [
            connection.consumer(name, handler, prefetch=prefetch, **consumer_options)
            for name in shards.queue_names
        ]

    def __enter__(self) -> ShardedConsumer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float | None = None) -> None:
        """Declare the topology (unless ``declare=False``) and start every shard."""
        if self._declare:
            self.shards.topology().apply(self._conn, timeout=timeout)
        started: list[Consumer] = []
        try:
            for consumer in self.consumers:
                consumer.start(timeout)
                started.append(consumer)
        except BaseException:
            for consumer in started:
                consumer.stop()
            raise

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        for consumer in self.consumers:
            if consumer.is_running:
                consumer.stop(drain, timeout)
