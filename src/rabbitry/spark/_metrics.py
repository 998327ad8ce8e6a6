"""What the source and the sink did, per micro-batch: counts, an INFO line, OTel counters.

Pure Python (no pyspark import). PySpark's Python data source API has no custom metrics
(the streaming query progress shows Spark's own ``numInputRows`` only), so each reader
and writer keeps its counts here, logs them at INFO on logger ``rabbitry.spark`` once
per micro-batch, and, while :mod:`rabbitry.observability` is instrumented in its
process (option ``otel=true`` instruments it with the global providers), adds them to
the OpenTelemetry counters ``rabbitry.spark.source.<count>`` and
``rabbitry.spark.sink.<count>``, attribute ``messaging.destination.name`` (the queue
read, the exchange written to).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from .. import observability

__all__ = ["SINK_COUNTS", "SOURCE_COUNTS", "Counts", "enable_otel"]

logger = logging.getLogger("rabbitry.spark")

#: Source counts, exported as ``rabbitry.spark.source.<name>``.
SOURCE_COUNTS = {
    "rows": "rows handed to Spark",
    "bytes": "body bytes of the rows handed to Spark",
    "acks": "deliveries acknowledged after Spark committed their batch",
    "redelivered": "rows of deliveries flagged redelivered by the broker",
}
#: Sink counts, exported as ``rabbitry.spark.sink.<name>``.
SINK_COUNTS = {
    "rows": "rows published",
    "bytes": "body bytes of the rows published",
    "confirmed": "rows the broker confirmed",
    "nacked": "rows not confirmed (nacked, refused, timed out)",
    "unroutable": "rows returned unroutable (mandatory)",
}

_A_DESTINATION = "messaging.destination.name"
_UNITS = {"bytes": "By", "acks": "{message}"}
_lock = threading.Lock()
# Counters per meter provider (None: the global one); the SDK refuses duplicates.
_instruments: dict[int, tuple[Any, dict[str, Any]]] = {}


def enable_otel() -> None:
    """Instrument rabbitry in this process with the global providers (once)."""
    if not observability.is_instrumented():
        observability.instrument()


def _counters(kind: str) -> dict[str, Any] | None:
    active = observability.current_instrumentation()
    if active is None:
        return None
    provider = active.meter_provider
    key = id(provider)
    with _lock:
        known = _instruments.get(key)
        if known is None or (known[0] is not None and known[0]() is not provider):
            from opentelemetry import metrics

            from .._version import __version__

            meter = metrics.get_meter("rabbitry.spark", __version__, provider)
            made = {
                f"{family}.{name}": meter.create_counter(
                    f"rabbitry.spark.{family}.{name}", _UNITS.get(name, "{row}"), text
                )
                for family, table in (("source", SOURCE_COUNTS), ("sink", SINK_COUNTS))
                for name, text in table.items()
            }
            ref = weakref.ref(provider) if provider is not None else None
            known = (ref, made)
            _instruments[key] = known
    return {name: counter for name, counter in known[1].items() if name.startswith(kind + ".")}


class Counts:
    """Totals of one source or sink object (``kind`` ``source`` or ``sink``)."""

    def __init__(self, kind: str, destination: str) -> None:
        self.kind = kind
        self.destination = destination
        names = SOURCE_COUNTS if kind == "source" else SINK_COUNTS
        #: Totals since the object was made.
        self.totals = dict.fromkeys(names, 0)

    def add(self, **deltas: int) -> None:
        """Add to the totals and, when instrumented, to the OTel counters."""
        for name, value in deltas.items():
            self.totals[name] += value
        counters = _counters(self.kind)
        if counters is None:
            return
        attributes = {_A_DESTINATION: self.destination}
        for name, value in deltas.items():
            if value:
                counters[f"{self.kind}.{name}"].add(value, attributes)
