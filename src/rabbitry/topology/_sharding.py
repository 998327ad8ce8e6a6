"""What a topology knows about the ``rabbitmq_sharding`` plugin.

A policy with ``shards-per-node`` makes the exchanges it matches *sharded*: the plugin
declares ``shards-per-node`` queues on every node of the cluster, named
``sharding: <exchange> - <node> - <n>`` (n from 0), and binds them to the exchange
with the policy's ``routing-key``. Consumers then consume from the exchange's name as
if it were a queue: the plugin turns a ``basic.consume`` (or ``basic.get``) on that name
into one on the local shard with the fewest consumers, and refuses ``queue.declare``,
``queue.bind``, ``queue.unbind``, ``queue.purge`` and ``queue.delete`` on it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..exceptions import TopologyValidationError
from ._model import Binding, Exchange, Queue
from ._policy import Policy

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "SHARDS_PER_NODE",
    "check_sharded_names",
    "shard_queue_name",
    "sharded_exchanges",
    "sharding_policy",
]

SHARDS_PER_NODE = "shards-per-node"


def shard_queue_name(exchange: str, node: str, number: int) -> str:
    """The name the plugin gives a shard queue.

    Args:
        exchange: the sharded exchange.
        node: the node's name, e.g. ``rabbit@host``.
        number: the shard's number on that node, from 0.

    Returns:
        ``sharding: <exchange> - <node> - <number>``.
    """
    return f"sharding: {exchange} - {node} - {number}"


def effective_exchange_policy(exchange: Exchange, policies: tuple[Policy, ...]) -> Policy | None:
    """The highest-priority policy that selects ``exchange`` (the first on a tie)."""
    best: Policy | None = None
    for policy in policies:
        if policy.applies_to_exchange(exchange.name) and (
            best is None or policy.priority > best.priority
        ):
            best = policy
    return best


def sharded_exchanges(
    exchanges: tuple[Exchange, ...], policies: tuple[Policy, ...]
) -> dict[str, int]:
    """``{exchange name: shards-per-node}`` for the exchanges a sharding policy shards."""
    result: dict[str, int] = {}
    for exchange in exchanges:
        policy = effective_exchange_policy(exchange, policies)
        if policy is not None and SHARDS_PER_NODE in (policy.definition or {}):
            result[exchange.name] = (policy.definition or {})[SHARDS_PER_NODE]
    return result


def check_sharded_names(
    sharded: dict[str, int], queues: tuple[Queue, ...], bindings: tuple[Binding, ...]
) -> None:
    """Refuse a queue, or a binding to a queue, named like a sharded exchange."""
    rule = (
        "is the name of a sharded exchange (rabbitmq_sharding policy), which the plugin "
        "refuses to declare or bind as a queue: consume from that name instead, the "
        "plugin picks a shard"
    )
    for queue in queues:
        if queue.name in sharded:
            raise TopologyValidationError(queue.label, "name", rule)
    for binding in bindings:
        destination = binding.destination
        name = destination.name if isinstance(destination, Queue) else destination
        if binding.destination_type == "queue" and name in sharded:
            raise TopologyValidationError(binding.label, "destination", rule)


def sharding_policy(
    exchanges: Iterable[Exchange],
    exchange: str,
    shards_per_node: int,
    routing_key: str | None,
    priority: int,
) -> Policy:
    """The sharding policy for ``exchange``, which must be one of ``exchanges``."""
    if not any(x.name == exchange for x in exchanges):
        raise TopologyValidationError(
            "topology",
            "exchange",
            f"with_sharding: exchange {exchange!r} is not in this topology (add "
            "Exchange(name, MODULUS_HASH) first)",
        )
    definition: dict[str, object] = {SHARDS_PER_NODE: shards_per_node}
    if routing_key is not None:
        definition["routing-key"] = routing_key
    return Policy(
        f"{exchange}.sharding",
        f"^{re.escape(exchange)}$",
        apply_to="exchanges",
        definition=definition,
        priority=priority,
    )
