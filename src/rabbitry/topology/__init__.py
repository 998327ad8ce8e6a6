"""Declarative topology: exchanges, queues, bindings and policies, validated, applied,
verified.

Usage::

    from rabbitry.topology import Binding, Exchange, Queue, RetryPolicy, Topology

    policy = RetryPolicy(delays=[1, 10, 60], max_attempts=4)
    topology = Topology(
        exchanges=[Exchange("orders", "topic")],
        queues=[Queue("billing", queue_type="quorum")],
        bindings=[Binding("orders", "billing", "order.*")],
    ).with_retry("billing", policy)

    topology.apply(connection)               # rabbitry.Connection
    await topology.aapply(async_connection)  # rabbitry.AsyncConnection

* The model (:class:`Exchange`, :class:`Queue`, :class:`Binding`, :class:`Topology`)
  validates RabbitMQ's rules when built and maps typed fields to ``x-`` arguments.
* ``apply``/``aapply`` declare idempotently on a channel of their own and record
  what was declared on ``connection.topology_record`` (for recovery);
  ``verify``/``averify`` check with passive declares; ``diff`` compares with another
  topology or a definitions export; ``delete``/``adelete`` remove and forget.
* :class:`RetryPolicy`, ``Topology.with_retry`` and :func:`handle_failure` build and
  drive delayed retries with a parking lot (design in ``_retry``'s docstring and
  ``docs/topology.md``).
* :class:`Policy` (``Topology(policies=[...])``) is set through the management HTTP
  API: ``apply(connection, management=ManagementClient(...))``. Its definition keys are
  checked by the same rules as queue arguments; ``diff`` reports where a policy and a
  queue argument set the same key to different values, and which one applies
  (:data:`LOWER_WINS`, :data:`ARGUMENT_WINS`).
* Topologies load from our own JSON/YAML form and from RabbitMQ definitions exports,
  and save to both.
* :func:`super_stream` and :class:`SuperStream` declare a super stream (partitioned
  stream) and route keys to its partitions as the stream clients do
  (:func:`partition_for`).
"""

from ._apply import ApplyResult, VerifyReport
from ._conflicts import parse_inequivalent
from ._diff import ARGUMENT_WINS, LOWER_WINS, PolicyOverlap
from ._model import (
    BUILTIN_EXCHANGE_TYPES,
    MODULUS_HASH,
    OVERFLOW_MODES,
    PLUGIN_EXCHANGE_TYPES,
    QUEUE_TYPES,
    UNLIMITED_DELIVERIES,
    Binding,
    Exchange,
    Queue,
    format_expiration,
)
from ._policy import POLICY_APPLY_TO, POLICY_KEYS, Policy
from ._retry import (
    ATTEMPTS_HEADER,
    DELIVERY_LIMIT_REASON,
    EXCEPTION_MESSAGE_HEADER,
    EXCEPTION_TYPE_HEADER,
    FIRST_FAILURE_HEADER,
    HELPER_DELIVERY_LIMIT,
    LAST_FAILURE_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    PARKED_REASON_HEADER,
    WORK_QUEUE_DELIVERY_LIMIT,
    RetryDecision,
    RetryNames,
    RetryPolicy,
    dlx_name,
    handle_failure,
    parking_lot_name,
    retry_queue_name,
)
from ._super_stream import (
    PARTITION_ORDER_ARGUMENT,
    SUPER_STREAM_ARGUMENT,
    SUPER_STREAM_SEED,
    SuperStream,
    murmur3_32,
    partition_for,
    super_stream,
)
from ._topology import Topology

__all__ = [
    "ARGUMENT_WINS",
    "ATTEMPTS_HEADER",
    "BUILTIN_EXCHANGE_TYPES",
    "DELIVERY_LIMIT_REASON",
    "EXCEPTION_MESSAGE_HEADER",
    "EXCEPTION_TYPE_HEADER",
    "FIRST_FAILURE_HEADER",
    "HELPER_DELIVERY_LIMIT",
    "LAST_FAILURE_HEADER",
    "LOWER_WINS",
    "MODULUS_HASH",
    "ORIGINAL_EXCHANGE_HEADER",
    "ORIGINAL_ROUTING_KEY_HEADER",
    "OVERFLOW_MODES",
    "PARKED_REASON_HEADER",
    "PARTITION_ORDER_ARGUMENT",
    "PLUGIN_EXCHANGE_TYPES",
    "POLICY_APPLY_TO",
    "POLICY_KEYS",
    "QUEUE_TYPES",
    "SUPER_STREAM_ARGUMENT",
    "SUPER_STREAM_SEED",
    "UNLIMITED_DELIVERIES",
    "WORK_QUEUE_DELIVERY_LIMIT",
    "ApplyResult",
    "Binding",
    "Exchange",
    "Policy",
    "PolicyOverlap",
    "Queue",
    "RetryDecision",
    "RetryNames",
    "RetryPolicy",
    "SuperStream",
    "Topology",
    "VerifyReport",
    "dlx_name",
    "format_expiration",
    "handle_failure",
    "murmur3_32",
    "parking_lot_name",
    "parse_inequivalent",
    "partition_for",
    "retry_queue_name",
    "super_stream",
]
