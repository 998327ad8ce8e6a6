"""The metric instruments and what they read, one set per meter provider.

Instruments are created once per meter provider and kept (``metrics_for``): the SDK
refuses a second instrument of the same name, so an ``instrument()`` after an
``uninstrument()`` (or a second one) with the same provider must find the first set.
Counts that would cost an SDK measurement per message (the publisher's counters, the
consumers' stats) are kept in plain integers here and read by observable instruments
when the metrics are collected.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from .._version import __version__
from ._outbox import OutboxMetrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from opentelemetry.metrics import MeterProvider

    from ..consumer import AsyncConsumer, ConsumerStats
    from ..pool import AsyncChannelPool

#: Histogram buckets in seconds: sub-millisecond confirms up to slow handlers.
DURATION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
#: Publish outcomes exported as ``rabbitry.publisher.<outcome>``.
PUBLISH_OUTCOMES = {
    "confirmed": "messages the broker confirmed (basic.ack)",
    "nacked": "messages the broker refused with basic.nack",
    "returned": "mandatory messages returned unroutable",
    "refused": "messages whose channel the broker closed because of them",
    "failed": "messages with no confirm: deadline passed, channel or connection lost",
}
OUTCOME_INDEX = {outcome: index for index, outcome in enumerate(PUBLISH_OUTCOMES, start=2)}
#: ``ConsumerStats`` counters exported as ``rabbitry.consumer.<name>``.
CONSUMER_COUNTERS = {
    "delivered": "deliveries received",
    "acked": "messages acknowledged after the handler succeeded",
    "failed": "handler failures",
    "retried": "failed messages sent to a retry queue",
    "parked": "failed messages moved to the parking lot",
    "dropped": "failed messages dropped (no parking lot or dead-letter exchange)",
    "dropped_records": "records lost to drops (a dropped batch envelope's records; 1 a message)",
    "requeued": "messages put back on their queue (Requeue, or a failed move)",
    "released": "prefetched messages handed back on stop",
    "deduplicated": "redelivered duplicates acked without calling the handler",
    "resubscribed": "subscriptions renewed after a broker cancel or channel error",
}

#: The attribute naming the destination (exchange or queue) of a measurement.
A_DESTINATION = "messaging.destination.name"
#: The attribute naming an outcome (publish outcome, recovery outcome).
A_OUTCOME = "rabbitry.outcome"
#: The attribute naming a connection state.
A_STATE = "rabbitry.connection.state"


@dataclass
class ZeroHistogram:
    """A histogram whose label sets are known before its first measurement.

    OpenTelemetry has no zero-count histogram point, so a Prometheus reader renders these
    (zero buckets, ``_sum`` and ``_count`` 0) for every label set it has no point of:
    ``increase()`` and ``rate()`` then see the first measurement.
    """

    name: str
    unit: str
    description: str
    bounds: tuple[float, ...]
    attribute_sets: list[dict[str, str]] = field(default_factory=list)


class Metrics:
    """rabbitry's instruments on one meter provider, and the counts they report.

    ``enabled`` is False while no instrumentation uses them: the observable
    instruments then report nothing.
    """

    def __init__(self, meter_provider: MeterProvider | None) -> None:
        meter = metrics.get_meter("rabbitry", __version__, meter_provider)
        self.enabled = True
        #: Histograms and their label sets known before a measurement (ZeroHistogram).
        self.zero_histograms: dict[str, ZeroHistogram] = {}
        #: The instrumentation using these instruments (it alone may disable them).
        self.owner: object = None
        self._lock = threading.Lock()
        # Consumers started while instrumented: (weak consumer, queue, its stats); the
        # stats of consumers that are gone are folded into _retired (monotonic totals).
        self._consumers: list[tuple[weakref.ref[AsyncConsumer], str, ConsumerStats]] = []
        self._retired: dict[str, dict[str, int]] = {}
        # Queue depth polled for consumer lag: consumer id -> (queue, ready, consumers).
        self._depth: dict[int, tuple[str, int, int]] = {}
        # Channel pools made while instrumented.
        self._pools: weakref.WeakSet[AsyncChannelPool] = weakref.WeakSet()

        # Publisher counts are kept here (one lock round per event) and exported by
        # observable instruments: an SDK measurement per event would cost more than the
        # publish itself. Per destination: [published, in flight, <outcomes>...].
        self._publish_counts: dict[str, list[int]] = {}
        self._publish_lock = threading.Lock()
        meter.create_observable_counter(
            "rabbitry.publisher.published",
            [self._publish_callback(0)],
            "{message}",
            "messages handed to the channel",
        )
        for index, (outcome, text) in enumerate(PUBLISH_OUTCOMES.items(), start=2):
            meter.create_observable_counter(
                f"rabbitry.publisher.{outcome}", [self._publish_callback(index)], "{message}", text
            )
        meter.create_observable_up_down_counter(
            "rabbitry.publisher.in_flight",
            [self._publish_callback(1)],
            "{message}",
            "messages sent and not yet settled",
        )
        self.confirm_duration = meter.create_histogram(
            "rabbitry.publisher.confirm.duration",
            "s",
            "from publish to the broker's ack, nack or return",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._zero_histogram(
            "rabbitry.publisher.confirm.duration",
            "s",
            "from publish to the broker's ack, nack or return",
        )
        for name, text in CONSUMER_COUNTERS.items():
            meter.create_observable_counter(
                f"rabbitry.consumer.{name}", [self._stats_callback(name)], "{message}", text
            )
        self.redelivered = meter.create_counter(
            "rabbitry.consumer.redelivered",
            "{message}",
            "deliveries flagged redelivered by the broker",
        )
        self.process_duration = meter.create_histogram(
            "rabbitry.consumer.process.duration",
            "s",
            "handler time, its ack or retry/parking move included",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._zero_histogram(
            "rabbitry.consumer.process.duration",
            "s",
            "handler time, its ack or retry/parking move included",
        )
        self.recoveries = meter.create_counter(
            "rabbitry.connection.recoveries",
            "{recovery}",
            "connection recoveries ended, by outcome (recovered, failed)",
        )
        self.recovery_duration = meter.create_histogram(
            "rabbitry.connection.recovery.duration",
            "s",
            "from the connection's loss to its recovery (or to giving up)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._zero_histogram(
            "rabbitry.connection.recovery.duration",
            "s",
            "from the connection's loss to its recovery (or to giving up)",
        )
        self.blocked_duration = meter.create_histogram(
            "rabbitry.connection.blocked.duration",
            "s",
            "periods the broker held a connection blocked (connection.blocked to unblocked)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self._zero_histogram(
            "rabbitry.connection.blocked.duration",
            "s",
            "periods the broker held a connection blocked (connection.blocked to unblocked)",
        )
        meter.create_observable_up_down_counter(
            "rabbitry.pool.waiters",
            [self._pool_callback("waiting")],
            "{task}",
            "tasks and threads waiting for a channel of a channel pool",
        )
        meter.create_observable_up_down_counter(
            "rabbitry.pool.in_use",
            [self._pool_callback("in_use")],
            "{channel}",
            "channels of channel pools lent out",
        )
        self.connection_state = meter.create_up_down_counter(
            "rabbitry.connection.state",
            "{connection}",
            "connections in each state (connecting, open, recovering, closed)",
        )
        self.outboxes = OutboxMetrics(meter, lambda: not self.enabled)
        meter.create_observable_gauge(
            "rabbitry.queue.messages",
            [self._depth_callback(1)],
            "{message}",
            "messages ready in a consumed queue (consumer lag; consumer_lag_interval)",
        )
        meter.create_observable_gauge(
            "rabbitry.queue.consumers",
            [self._depth_callback(2)],
            "{consumer}",
            "consumers of a consumed queue (consumer_lag_interval)",
        )

    def _zero_histogram(self, name: str, unit: str, description: str) -> None:
        self.zero_histograms[name] = ZeroHistogram(name, unit, description, DURATION_BUCKETS)

    def known_labels(self, histogram: str, attributes: dict[str, str]) -> None:
        """``histogram`` will be measured with ``attributes``: it reads 0 until then."""
        with self._lock:
            sets = self.zero_histograms[histogram].attribute_sets
            if attributes not in sets:
                sets.append(dict(attributes))

    def zero_series(self) -> list[ZeroHistogram]:
        """The histograms with known label sets (none while disabled)."""
        if not self.enabled:
            return []
        with self._lock:
            return [
                ZeroHistogram(h.name, h.unit, h.description, h.bounds, list(h.attribute_sets))
                for h in self.zero_histograms.values()
                if h.attribute_sets
            ]

    def start_connection(self) -> None:
        """A connection is followed: its recovery and blocked series start at 0."""
        for outcome in ("recovered", "failed"):
            self.recoveries.add(0, {A_OUTCOME: outcome})
            self.known_labels("rabbitry.connection.recovery.duration", {A_OUTCOME: outcome})
        self.known_labels("rabbitry.connection.blocked.duration", {})

    def follow_consumer(self, consumer: AsyncConsumer) -> None:
        """Report ``consumer.stats`` from now on (summed per queue); the queue's
        redelivery and handler-time series start at 0."""
        with self._lock:
            self._consumers.append((weakref.ref(consumer), consumer.queue, consumer.stats))
        self.redelivered.add(0, {A_DESTINATION: consumer.queue})
        self.known_labels("rabbitry.consumer.process.duration", {A_DESTINATION: consumer.queue})

    def follow_pool(self, pool: AsyncChannelPool) -> None:
        """Report ``pool.waiting`` and ``pool.in_use`` from now on (summed over pools)."""
        with self._lock:
            self._pools.add(pool)

    def _pool_callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if not self.enabled:
                return []
            with self._lock:
                pools = list(self._pools)
            return [Observation(sum(getattr(pool, name) for pool in pools))]

        return observe

    def set_depth(self, key: int, queue: str, ready: int, consumers: int) -> None:
        """The latest passive declare of ``queue`` by the poller ``key``."""
        self._depth[key] = (queue, ready, consumers)

    def drop_depth(self, key: int) -> None:
        self._depth.pop(key, None)

    def count_publish(self, destination: str, index: int | None) -> None:
        """One more published message (index 0), or a settled one: its outcome's index,
        or ``None`` without confirms. The in-flight count (index 1) follows."""
        with self._publish_lock:
            counts = self._publish_counts.get(destination)
            if counts is None:
                counts = self._publish_counts[destination] = [0] * (2 + len(PUBLISH_OUTCOMES))
            if index == 0:
                counts[0] += 1
                counts[1] += 1
            else:
                counts[1] -= 1
                if index is not None:
                    counts[index] += 1

    def _publish_callback(self, index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if not self.enabled:
                return []
            with self._publish_lock:
                rows = [(dest, counts[index]) for dest, counts in self._publish_counts.items()]
            return [Observation(value, {A_DESTINATION: dest}) for dest, value in rows]

        return observe

    def _stats_callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if not self.enabled:
                return []
            totals = self._consumer_totals()
            return [
                Observation(values[name], {A_DESTINATION: queue})
                for queue, values in totals.items()
            ]

        return observe

    def _consumer_totals(self) -> dict[str, dict[str, int]]:
        """Per queue: the counters of every consumer started while instrumented."""
        with self._lock:
            live = []
            for entry in self._consumers:
                ref, queue, stats = entry
                if ref() is None:  # gone: keep its counts so the totals stay monotonic
                    retired = self._retired.setdefault(queue, dict.fromkeys(CONSUMER_COUNTERS, 0))
                    for name in CONSUMER_COUNTERS:
                        retired[name] += getattr(stats, name)
                else:
                    live.append(entry)
            self._consumers = live
            totals = {queue: dict(values) for queue, values in self._retired.items()}
            for _ref, queue, stats in live:
                values = totals.setdefault(queue, dict.fromkeys(CONSUMER_COUNTERS, 0))
                for name in CONSUMER_COUNTERS:
                    values[name] += getattr(stats, name)
        return totals

    def _depth_callback(self, index: int) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if not self.enabled:
                return []
            latest: dict[str, int] = {}
            for queue, ready, consumers in list(self._depth.values()):
                latest[queue] = ready if index == 1 else consumers
            return [Observation(value, {A_DESTINATION: queue}) for queue, value in latest.items()]

        return observe


_by_provider: weakref.WeakKeyDictionary[Any, Metrics] = weakref.WeakKeyDictionary()
_global: list[Metrics] = []
_lock = threading.Lock()


def metrics_for(meter_provider: MeterProvider | None) -> Metrics:
    """The instruments on ``meter_provider`` (``None``: the global one), made once."""
    with _lock:
        if meter_provider is None:
            if not _global:
                _global.append(Metrics(None))
            return _global[0]
        found = _by_provider.get(meter_provider)
        if found is None:
            found = _by_provider[meter_provider] = Metrics(meter_provider)
        return found
