"""``--metrics``: instrument rabbitry for one command and print its metrics at the end.

An OpenTelemetry SDK meter provider with an in-memory reader (extra ``otel``); the
command's connections, publishers and consumers are made after :meth:`CommandMetrics.start`
so they are followed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from .. import observability
from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from ._common import State

__all__ = ["CommandMetrics", "metrics_option"]

metrics_option = click.option(
    "--metrics",
    is_flag=True,
    help="Record rabbitry's OpenTelemetry metrics (needs the otel extra) and print them "
    "at the end.",
)


class CommandMetrics:
    """rabbitry instrumented with an SDK meter provider read in memory."""

    def __init__(self) -> None:
        try:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        except ImportError as exc:
            raise ConfigurationError(
                "--metrics needs opentelemetry-sdk: pip install 'rabbitry[otel]'"
            ) from exc
        self._reader = InMemoryMetricReader()
        self._provider = MeterProvider(metric_readers=[self._reader])
        observability.instrument(meter_provider=self._provider)

    def collect(self) -> list[dict[str, Any]]:
        """Every rabbitry data point now: name, attributes, value (a histogram's count
        and sum), sorted by name."""
        points: list[dict[str, Any]] = []
        data = self._reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if not metric.name.startswith("rabbitry."):
                        continue
                    point: Any
                    for point in metric.data.data_points:
                        record: dict[str, Any] = {
                            "name": metric.name,
                            "attributes": dict(point.attributes or {}),
                        }
                        if hasattr(point, "bucket_counts"):
                            record["count"] = point.count
                            record["sum"] = round(point.sum, 6)
                        else:
                            record["value"] = point.value
                        points.append(record)
        points.sort(key=lambda p: (p["name"], sorted(p["attributes"].items())))
        return points

    def close(self) -> None:
        """Stop recording (idempotent)."""
        observability.uninstrument()
        self._provider.shutdown()


def format_point(point: dict[str, Any]) -> str:
    """One line: ``name{attr=value,...} value`` (``count=… sum=…`` for a histogram)."""
    attributes = ",".join(f"{key}={value}" for key, value in sorted(point["attributes"].items()))
    label = f"{point['name']}{{{attributes}}}" if attributes else point["name"]
    if "count" in point:
        return f"{label} count={point['count']} sum={point['sum']:g}"
    return f"{label} {point['value']}"


def print_metrics(state: State, points: list[dict[str, Any]]) -> None:
    """The human-readable block (with ``--json`` the command puts them in its JSON)."""
    if state.json or state.quiet:
        return
    state.info("metrics:")
    for point in points:
        state.info(f"  {format_point(point)}")
