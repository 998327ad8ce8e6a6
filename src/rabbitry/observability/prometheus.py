"""A Prometheus endpoint for OpenTelemetry metrics (needs ``opentelemetry-sdk``).

:class:`PrometheusReader` is an SDK metric reader that collects when scraped and renders
the Prometheus text exposition format (version 0.0.4); :class:`PrometheusServer` serves
it over HTTP from a daemon thread. Names follow the usual OpenTelemetry to Prometheus
mapping: dots become underscores, a unit of seconds (bytes) adds ``_seconds``
(``_bytes``), a monotonic sum adds ``_total``; attribute names become label names the
same way.
"""

from __future__ import annotations

import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    MetricReader,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as HistogramData

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from ._metrics import ZeroHistogram

__all__ = ["PrometheusReader", "PrometheusServer", "render"]

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]")
_UNIT_SUFFIXES = {"s": "_seconds", "By": "_bytes"}
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PrometheusReader(MetricReader):
    """A pull reader: metrics are collected when :meth:`render` is called (a scrape)."""

    def __init__(self) -> None:
        cumulative = AggregationTemporality.CUMULATIVE
        super().__init__(
            preferred_temporality={
                kind: cumulative
                for kind in (
                    Counter,
                    UpDownCounter,
                    Histogram,
                    ObservableCounter,
                    ObservableUpDownCounter,
                    ObservableGauge,
                )
            }
        )
        self._latest: MetricsData | None = None
        self._collecting = threading.Lock()
        #: rabbitry's histograms with known label sets, rendered at zero until their first
        #: measurement (set by ``serve_prometheus``).
        self.zero_source: Callable[[], Iterable[ZeroHistogram]] | None = None

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        self._latest = metrics_data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Drop the last collected metrics (the meter provider calls it at its shutdown).

        Args:
            timeout_millis: the OpenTelemetry reader interface's deadline (nothing here
                waits).
            **kwargs: other options of that interface, ignored.
        """
        self._latest = None

    def render(self) -> str:
        """Collect now and return the exposition text."""
        with self._collecting:
            self._latest = None
            self.collect()
            data = self._latest
        return render(data, self.zero_source() if self.zero_source is not None else ())


def render(data: MetricsData | None, zero: Iterable[ZeroHistogram] = ()) -> str:
    """The Prometheus text format of ``data`` (one family per metric name).

    Args:
        data: what a reader collected.
        zero: histograms whose label sets are known: each set without a point in
            ``data`` is rendered with zero buckets, sum and count.

    Returns:
        The exposition text ("" when there is nothing to show).
    """
    families: dict[str, tuple[str, str, list[str]]] = {}
    if data is not None:
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    _family(metric, families)
    for histogram in zero:
        _zero_family(histogram, families)
    out = []
    for name, (kind, help_text, lines) in families.items():
        out.append(f"# HELP {name} {_escape_help(help_text)}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
    return "\n".join(out) + "\n" if out else ""


def _base_name(name: str, unit: str | None) -> str:
    base = _INVALID.sub("_", name)
    suffix = _UNIT_SUFFIXES.get(unit or "")
    if suffix and not base.endswith(suffix):
        base += suffix
    return base


def _zero_family(histogram: ZeroHistogram, families: dict[str, tuple[str, str, list[str]]]) -> None:
    name = _base_name(histogram.name, histogram.unit)
    family = families.setdefault(name, ("histogram", histogram.description, []))
    lines = family[2]
    for attributes in histogram.attribute_sets:
        count_line = f"{name}_count{_labels(attributes)} "
        if any(line.startswith(count_line) for line in lines):
            continue
        for bound in histogram.bounds:
            lines.append(f"{name}_bucket{_labels(attributes, le=_number(bound))} 0")
        lines.append(f"{name}_bucket{_labels(attributes, le='+Inf')} 0")
        lines.append(f"{name}_sum{_labels(attributes)} 0")
        lines.append(count_line + "0")


def _family(metric: Any, families: dict[str, tuple[str, str, list[str]]]) -> None:
    base = _base_name(metric.name, metric.unit)
    point_data = metric.data
    if isinstance(point_data, Sum):
        kind = "counter" if point_data.is_monotonic else "gauge"
        name = base + "_total" if point_data.is_monotonic and not base.endswith("_total") else base
        lines = [
            f"{name}{_labels(p.attributes)} {_number(p.value)}" for p in point_data.data_points
        ]
    elif isinstance(point_data, Gauge):
        kind, name = "gauge", base
        lines = [
            f"{name}{_labels(p.attributes)} {_number(p.value)}" for p in point_data.data_points
        ]
    elif isinstance(point_data, HistogramData):
        kind, name = "histogram", base
        lines = []
        for point in point_data.data_points:
            cumulative = 0
            for bound, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
                cumulative += count
                lines.append(
                    f"{name}_bucket{_labels(point.attributes, le=_number(bound))} {cumulative}"
                )
            lines.append(f"{name}_bucket{_labels(point.attributes, le='+Inf')} {point.count}")
            lines.append(f"{name}_sum{_labels(point.attributes)} {_number(point.sum)}")
            lines.append(f"{name}_count{_labels(point.attributes)} {point.count}")
    else:  # exponential histograms and future kinds: not rendered
        return
    if name in families:
        families[name][2].extend(lines)
    else:
        families[name] = (kind, metric.description or "", lines)


def _labels(attributes: Mapping[str, Any] | None, le: str | None = None) -> str:
    pairs = [
        f'{_INVALID_LABEL.sub("_", key)}="{_escape(value)}"'
        for key, value in (attributes or {}).items()
    ]
    if le is not None:
        pairs.append(f'le="{le}"')
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _escape(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if math.isnan(value):
            return "NaN"
        return repr(value)
    return str(value)


class PrometheusServer:
    """Serves a :class:`PrometheusReader` on ``/metrics`` from a daemon thread.

    Usable as a context manager; ``close()`` stops it.

    Attributes:
        host: the address it listens on.
        port: the port it listens on (the one picked when 0 was asked).
    """

    def __init__(self, reader: PrometheusReader, *, host: str = "127.0.0.1", port: int = 9464):
        self.reader = reader

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served")
                    return
                body = reader.render().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", _CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes are not worth a log line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"rabbitry-prometheus-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
