"""The entities the retry machinery of one work queue adds to a topology.

:class:`~rabbitry.topology.RetryPolicy` (in :mod:`._retry_policy`) names the entities
and decides where a failed message goes; this module turns a policy and a work queue
into the exchange, queues and bindings that ``Topology.with_retry`` adds, and checks
that the work queue can take them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..exceptions import TopologyValidationError
from ._model import Binding, Exchange, Queue
from ._retry_policy import HELPER_DELIVERY_LIMIT, WORK_QUEUE_DELIVERY_LIMIT

if TYPE_CHECKING:
    from ._base import T, TopologyData
    from ._retry_policy import RetryPolicy

__all__ = ["build_retry"]


def _work_delivery_limit(
    work: Queue, entity: str, policy: RetryPolicy, delivery_limit: int | None
) -> int | None:
    """The delivery limit the work queue gets (``None``: not a quorum queue)."""
    if work.queue_type != "quorum":
        if delivery_limit is not None:
            raise TopologyValidationError(
                entity,
                "delivery_limit",
                f"only quorum queues have a delivery limit (queue_type is {work.queue_type!r})",
            )
        return None
    limit = work.delivery_limit
    if limit is None:
        limit = WORK_QUEUE_DELIVERY_LIMIT if delivery_limit is None else delivery_limit
    elif delivery_limit is not None and delivery_limit != limit:
        raise TopologyValidationError(
            entity,
            "delivery_limit",
            f"the queue already has delivery_limit={limit}; with_retry was given {delivery_limit}",
        )
    if policy.broker_driven and limit >= 0:
        raise TopologyValidationError(
            entity,
            "with_retry",
            f"a quorum queue dead-letters a message returned more than {limit} times (its "
            "delivery limit: Requeue, crashes, connection losses) with reason "
            "'delivery_limit'; with one delay (broker-driven retry) that message would "
            "enter the queue -> retry queue -> queue cycle, which RabbitMQ drops silently. "
            "Use RetryPolicy(..., republish=True): the queue then dead-letters to the "
            "parking lot",
        )
    return limit


def build_retry(
    cls: type[T],
    topology: TopologyData,
    queue: str,
    policy: RetryPolicy,
    *,
    delivery_limit: int | None = None,
) -> T:
    """The topology plus the retry machinery for its queue ``queue``.

    Args:
        cls: the class of the topology to build.
        topology: the topology holding the work queue.
        queue: the work queue's name.
        policy: the retry policy (give the consumer the same one).
        delivery_limit: for a quorum work queue without one, its delivery limit
            (default :data:`WORK_QUEUE_DELIVERY_LIMIT`); ``-1`` is unlimited (RabbitMQ
            4.0+ only: 3.x dead-letters at the first return).

    Returns:
        A new ``cls`` (``topology`` is unchanged).

    Raises:
        TopologyValidationError: the queue is not in the topology, is a stream or
            server-named, already dead-letters elsewhere, a derived name is too long, or
            it is a quorum queue with a broker-driven policy (see "Quorum queues and
            their delivery limit" in :mod:`rabbitry.topology._retry`).
    """
    work = topology.queue(queue)
    entity = f"queue {queue!r}"
    if work is None:
        raise TopologyValidationError(
            entity, "with_retry", "the queue is not in this topology; add Queue(...) first"
        )
    if work.queue_type == "stream":
        raise TopologyValidationError(
            entity, "with_retry", "stream queues cannot dead-letter, so they cannot retry"
        )
    if policy.queue not in (None, queue):
        raise TopologyValidationError(
            entity, "with_retry", f"the policy is for queue {policy.queue!r}"
        )
    work_limit = _work_delivery_limit(work, entity, policy, delivery_limit)
    names = policy.names(queue)
    kind = work.queue_type
    helpers: dict[str, Any] = {"durable": work.durable, "queue_type": kind}
    if kind not in ("quorum", "stream"):
        helpers["exclusive"] = work.exclusive
    if kind == "quorum":
        helpers["delivery_limit"] = HELPER_DELIVERY_LIMIT
    retry_queues = [
        Queue(
            name,
            message_ttl=ms,
            dead_letter_exchange=names.dlx,
            dead_letter_routing_key=queue,
            **helpers,
        )
        for ms, name in zip(policy.tiers, names.retry_queues, strict=True)
    ]
    parking = [Queue(names.parking_lot, **helpers)] if names.parking_lot else []
    if policy.broker_driven:
        dead_letter_key: str | None = names.retry_queues[0]
    else:
        dead_letter_key = names.parking_lot
    if work_limit is not None and work.delivery_limit is None:
        work = replace(work, delivery_limit=work_limit)
    queues = [work if q.name == queue else q for q in topology.queues]
    if dead_letter_key is not None:
        for existing, wanted in (
            (work.dead_letter_exchange, names.dlx),
            (work.dead_letter_routing_key, dead_letter_key),
        ):
            if existing not in (None, wanted):
                raise TopologyValidationError(
                    entity,
                    "dead_letter_exchange",
                    f"already dead-letters to {work.dead_letter_exchange!r} / "
                    f"{work.dead_letter_routing_key!r}; with_retry needs {names.dlx!r} / "
                    f"{dead_letter_key!r}",
                )
        updated = replace(
            work, dead_letter_exchange=names.dlx, dead_letter_routing_key=dead_letter_key
        )
        queues = [updated if q is work else q for q in queues]
    bindings = [Binding(names.dlx, queue, queue)]
    bindings += [Binding(names.dlx, q.name, q.name) for q in retry_queues + parking]
    return cls(
        (*topology.exchanges, Exchange(names.dlx, "direct", durable=work.durable)),
        queues + retry_queues + parking,
        (*topology.bindings, *bindings),
        topology.policies,
    )
