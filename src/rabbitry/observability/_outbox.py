"""Metrics of durable outbox publishers: is the outbox growing, how old is its oldest row.

Every :class:`~rabbitry.AsyncOutboxPublisher` started while instrumented is followed
weakly and read (``stats()``, an in-memory snapshot) when the metrics are collected,
summed per outbox name. The counters of a publisher that is gone keep their last values,
so the totals never go down.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Observation

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from opentelemetry.metrics import Meter

    from ..outbox_publisher import AsyncOutboxPublisher, OutboxStats

#: The outbox's name (its file path for ``SQLiteOutbox``).
A_OUTBOX = "rabbitry.outbox"

#: name -> (unit, description); levels, exported as gauges.
GAUGES = {
    "pending": ("{message}", "messages stored and not yet confirmed"),
    "pending_bytes": ("By", "bytes of the pending messages (bodies and properties)"),
    "oldest_age": ("s", "age of the oldest pending message"),
    "in_flight": ("{message}", "messages sent and waiting for their confirm"),
    "dead": ("{message}", "messages in the dead table (returned or refused)"),
}
#: name -> description; monotonic since each publisher started, exported as counters.
COUNTERS = {
    "stored": "messages stored",
    "acked": "messages confirmed and deleted",
    "resent": "sends that were resends (failed sends, rows found at start)",
}


class OutboxMetrics:
    """The ``rabbitry.outbox.*`` instruments and the publishers they read."""

    def __init__(self, meter: Meter, closed: Callable[[], bool]) -> None:
        self._closed = closed
        self._lock = threading.Lock()
        # [weak publisher, outbox name, its last counter values]
        self._followed: list[tuple[weakref.ref[AsyncOutboxPublisher], str, dict[str, int]]] = []
        self._retired: dict[str, dict[str, int]] = {}
        for name, (unit, text) in GAUGES.items():
            meter.create_observable_gauge(
                f"rabbitry.outbox.{name}", [self._callback(name)], unit, text
            )
        for name, text in COUNTERS.items():
            meter.create_observable_counter(
                f"rabbitry.outbox.{name}", [self._callback(name)], "{message}", text
            )

    def follow(self, publisher: AsyncOutboxPublisher) -> None:
        last = dict.fromkeys(COUNTERS, 0)
        with self._lock:
            self._followed.append((weakref.ref(publisher), publisher.outbox.name, last))

    def _callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            if self._closed():
                return []
            return [
                Observation(values[name], {A_OUTBOX: outbox})
                for outbox, values in self._read().items()
            ]

        return observe

    def _read(self) -> dict[str, dict[str, float]]:
        """Per outbox name: gauges summed over live publishers (the oldest age: the
        largest, 0 when empty), counters over all publishers ever followed."""
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            live = []
            for entry in self._followed:
                ref, outbox, last = entry
                publisher = ref()
                values = out.setdefault(outbox, _empty())
                if publisher is None:  # gone: its last counts stay in the totals
                    retired = self._retired.setdefault(outbox, dict.fromkeys(COUNTERS, 0))
                    for name in COUNTERS:
                        retired[name] += last[name]
                    continue
                live.append(entry)
                try:
                    stats = publisher.stats()
                except RuntimeError:  # its rows changed under the read (another thread)
                    continue
                _add(values, stats, last)
            self._followed = live
            for outbox, retired in self._retired.items():
                values = out.setdefault(outbox, _empty())
                for name in COUNTERS:
                    values[name] += retired[name]
        return out


def _empty() -> dict[str, float]:
    return dict.fromkeys((*GAUGES, *COUNTERS), 0)


def _add(values: dict[str, float], stats: OutboxStats, last: dict[str, int]) -> None:
    for name in ("pending", "pending_bytes", "in_flight", "dead"):
        values[name] += getattr(stats, name)
    values["oldest_age"] = max(values["oldest_age"], stats.oldest_age or 0.0)
    for name in COUNTERS:
        last[name] = getattr(stats, name)
        values[name] += last[name]
