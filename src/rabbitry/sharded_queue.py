"""Consume a queue sharded by the ``rabbitmq_sharding`` plugin, by the exchange's name.

The plugin shards an exchange that a policy with ``shards-per-node`` matches (build
one with :meth:`rabbitry.topology.Topology.with_sharding`): it declares that many
queues on every node, ``sharding: <exchange> - <node> - <n>``, binds them to the
exchange, and adds shards on a node that joins the cluster. With the plugin's
``x-modulus-hash`` exchange type (:data:`MODULUS_HASH`) each message goes to exactly
one shard, picked by the hash of its routing key.

A consumer subscribes to the *exchange's name* as if it were a queue; the plugin
attaches each ``basic.consume`` to the local shard with the fewest consumers. So one
logical queue is served by several queues (several Erlang processes), at the price of
any order between messages of different shards. :class:`ShardedQueueConsumer` (and
:class:`AsyncShardedQueueConsumer`) start ``consumers`` ordinary consumers on that name,
one after the other, each once the broker confirmed the previous one, so that the
plugin sees it and picks another shard: with ``consumers`` equal to the number of shards
on the node connected to, every shard gets one consumer. A shard without a consumer
keeps its messages until one comes.

When to pick which: see ``docs/topology.md`` (the plugin: shards follow the cluster and
consumers need not know the queue names; :mod:`rabbitry.sharding` with the
consistent-hash exchange: explicit queues, per-key order, any broker topology).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .exceptions import ConfigurationError
from .topology._model import MODULUS_HASH
from .topology._sharding import shard_queue_name

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ._connection import AsyncConnection
    from .consumer import AsyncConsumer
    from .sync.connection import Connection
    from .sync.consumer import Consumer

__all__ = [
    "MODULUS_HASH",
    "AsyncShardedQueueConsumer",
    "ShardedQueueConsumer",
    "shard_queue_name",
]

_MAX_CONSUMERS = 1024


def _check(exchange: object, consumers: object, options: dict[str, Any]) -> str:
    if not isinstance(exchange, str) or not exchange:
        raise ConfigurationError(f"exchange: must be the sharded exchange's name, got {exchange!r}")
    if (
        isinstance(consumers, bool)
        or not isinstance(consumers, int)
        or not 1 <= consumers <= _MAX_CONSUMERS
    ):
        raise ConfigurationError(
            f"consumers: must be an integer in 1..{_MAX_CONSUMERS}, got {consumers!r}"
        )
    if options.get("retry") is not None:
        raise ConfigurationError(
            "retry: a RetryPolicy routes failed messages back to a queue named like the "
            "consumer's queue, and a sharded exchange's name is not a queue; give the "
            "shard queues a dead-letter policy (pattern '^sharding: <exchange> - ') instead"
        )
    return exchange


class AsyncShardedQueueConsumer:
    """``consumers`` consumers of the sharded queue ``exchange`` (see the module doc).

    Args:
        connection: an open :class:`AsyncConnection`.
        exchange: the sharded exchange, whose name the consumers subscribe to.
        handler: as for :meth:`AsyncConnection.consumer`.
        consumers: how many subscriptions (one per shard is the usual choice).
        consumer_options: further options of :meth:`AsyncConnection.consumer`
            (``prefetch``, ``concurrency``, ``ack``...), per subscription. ``retry`` is
            refused (see :func:`_check`).

    Raises:
        ConfigurationError: an option breaks a rule.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        exchange: str,
        handler: Callable[[Any], Awaitable[Any]],
        *,
        consumers: int,
        **consumer_options: Any,
    ) -> None:
        self.exchange = _check(exchange, consumers, consumer_options)
        self.consumers: list[AsyncConsumer] = [
            connection.consumer(exchange, handler, **consumer_options) for _ in range(consumers)
        ]

    async def __aenter__(self) -> AsyncShardedQueueConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self, timeout: float | None = None) -> None:
        """Subscribe every consumer, one after the other (the plugin picks the shard).

        Args:
            timeout: seconds for each broker request of each consumer (``None``: no
                limit).
        """
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
        """Stop every running consumer.

        Args:
            drain: let running handlers finish (and ack); otherwise they are cancelled
                and their messages requeued.
            timeout: seconds to wait for running handlers, per consumer.
        """
        for consumer in self.consumers:
            if consumer.is_running:
                await consumer.stop(drain, timeout)


class ShardedQueueConsumer:
    """The sync twin of :class:`AsyncShardedQueueConsumer` (handlers run off the IO thread)."""

    def __init__(
        self,
        connection: Connection,
        exchange: str,
        handler: Callable[[Any], Any],
        *,
        consumers: int,
        **consumer_options: Any,
    ) -> None:
        self.exchange = _check(exchange, consumers, consumer_options)
        self.consumers: list[Consumer] = [
            connection.consumer(exchange, handler, **consumer_options) for _ in range(consumers)
        ]

    def __enter__(self) -> ShardedQueueConsumer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float | None = None) -> None:
        """Subscribe every consumer, one after the other (the plugin picks the shard).

        Args:
            timeout: seconds for each broker request of each consumer (``None``: no
                limit).
        """
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
        """Stop every running consumer.

        Args:
            drain: let running handlers finish (and ack); otherwise they are cancelled
                and their messages requeued.
            timeout: seconds to wait for running handlers, per consumer.
        """
        for consumer in self.consumers:
            if consumer.is_running:
                consumer.stop(drain, timeout)
