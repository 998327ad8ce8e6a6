"""The pipeline on a super stream (``--partitions N``): its topology and its routing.

The super stream takes the place of the orders exchange and its name
(``<prefix>.<run id>.orders``): a ``direct`` exchange with ``x-super-stream: true``,
partitions ``….orders-0`` .. ``….orders-<N-1>`` (stream queues bound with keys ``"0"``
.. ``"<N-1>"``, as ``rabbitmq-streams add_super_stream`` lays them out), and the same
alternate exchange as the default topology.

* **Publishing.** An order of the current schema (routing key ``order.created.*``) is
  published with the binding key of its customer's partition
  (:meth:`~rabbitry.topology.SuperStream.binding_key_for`, the stream clients' hash), so
  one customer's orders stay in one partition, in order. An event with another routing
  key (``legacy.order.*``, a producer that knows nothing of the partitions) is published
  as it is: no partition binds it and the alternate exchange keeps it.
* **Retries.** The retry tiers, the parking lot and the work queue are the default
  run's (``Topology.with_retry``), but no exchange routes orders to the work queue: it
  only receives the retries, which the retry tiers dead-letter back to it when their
  delay is over. They do not go back to a partition: RabbitMQ 3.10 silently drops a
  message dead-lettered to a stream (measured: a message expiring from a queue whose
  dead-letter target is a stream arrives nowhere). So the Spark job reads the union of
  two sources: every partition of the super stream, and the work queue
  (:func:`orders_pipeline._pipeline.source_options`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from rabbitry import Binding, Exchange, Queue, Topology
from rabbitry.topology import SuperStream

if TYPE_CHECKING:
    from rabbitry import RetryPolicy

    from ._events import Event
    from ._pipeline import Names

__all__ = ["ROUTED_PREFIX", "routing_key", "super_stream_topology"]

#: Routing keys of the current order schema; the default topology binds ``order.created.*``.
ROUTED_PREFIX = "order.created."


def routing_key(layout: SuperStream, event: Event) -> str:
    """The routing key ``event`` is published with to the super stream's exchange.

    Args:
        layout: the super stream.
        event: the event.

    Returns:
        The binding key of its customer's partition for an order of the current schema;
        the event's own routing key otherwise (which no partition binds).
    """
    if event.routing_key.startswith(ROUTED_PREFIX):
        return layout.binding_key_for(event.customer)
    return event.routing_key


def super_stream_topology(names: Names, policy: RetryPolicy, partitions: int) -> Topology:
    """The super stream with an alternate exchange; the work queue for the retries.

    Args:
        names: the run's entity names (the super stream is ``names.exchange``).
        policy: the retry policy (its tiers and parking lot, as in the default topology).
        partitions: how many partitions.

    Returns:
        The topology.
    """
    layout = SuperStream(names.exchange, partitions)
    stream = layout.topology()
    exchanges = [
        replace(e, alternate_exchange=names.unrouted_exchange) if e.name == layout.name else e
        for e in stream.exchanges
    ]
    return Topology(
        exchanges=[*exchanges, Exchange(names.unrouted_exchange, "fanout")],
        queues=[*stream.queues, Queue(names.work), Queue(names.unrouted)],
        bindings=[*stream.bindings, Binding(names.unrouted_exchange, names.unrouted)],
    ).with_retry(names.work, policy)
