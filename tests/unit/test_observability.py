"""rabbitry.observability without a broker: optional import, switch, exposition format."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.metrics import Meter, NoOpMeter, NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families
from tests.unit.fake_broker import FakeBroker

import rabbitry
from rabbitry import observability
from rabbitry.exceptions import ConfigurationError
from rabbitry.observability import _state
from rabbitry.observability._otel import A_OUTCOME, A_STATE, Instrumentation
from rabbitry.observability._outbox import A_OUTBOX
from rabbitry.observability.prometheus import PrometheusReader

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "observability.md"
DASHBOARD = ROOT / "docs" / "grafana" / "rabbitry.json"


def test_importing_rabbitry_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, rabbitry, rabbitry.observability\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_instrument_without_opentelemetry_raises_a_configuration_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "rabbitry.observability._otel", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ConfigurationError, match=r"rabbitry\[otel\]"):
        observability.instrument()
    assert _state.active is None


@pytest.mark.parametrize("interval", [0, -1.0, True, "5"])
def test_instrument_refuses_a_consumer_lag_interval_that_is_not_a_positive_number(
    interval: object,
) -> None:
    with pytest.raises(ConfigurationError, match="consumer_lag_interval"):
        observability.instrument(consumer_lag_interval=interval)  # type: ignore[arg-type]
    assert not observability.is_instrumented()


def test_instrument_sets_the_switch_and_uninstrument_clears_it() -> None:
    observability.instrument(meter_provider=MeterProvider())
    try:
        assert _state.active is not None
        assert observability.is_instrumented()
    finally:
        observability.uninstrument()
    assert _state.active is None
    observability.uninstrument()  # idempotent


def test_the_exposition_has_counters_gauges_and_cumulative_histogram_buckets() -> None:
    reader = PrometheusReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("t")
    counter = meter.create_counter("a.b.sent", "{message}", 'said "hi"\nthen')
    counter.add(3, {"messaging.destination.name": 'x"y'})
    meter.create_up_down_counter("a.in_flight").add(-2)
    histogram = meter.create_histogram(
        "a.duration", "s", explicit_bucket_boundaries_advisory=(0.1, 1.0)
    )
    for value in (0.05, 0.5, 5.0):
        histogram.record(value, {"ok": True})
    text = reader.render()
    provider.shutdown()
    lines = text.splitlines()
    assert '# HELP a_b_sent_total said "hi"\\nthen' in lines
    assert "# TYPE a_b_sent_total counter" in lines
    assert 'a_b_sent_total{messaging_destination_name="x\\"y"} 3' in lines
    assert "# TYPE a_in_flight gauge" in lines
    assert "a_in_flight -2" in lines
    assert "# TYPE a_duration_seconds histogram" in lines
    assert 'a_duration_seconds_bucket{ok="true",le="0.1"} 1' in lines
    assert 'a_duration_seconds_bucket{ok="true",le="1.0"} 2' in lines
    assert 'a_duration_seconds_bucket{ok="true",le="+Inf"} 3' in lines
    assert 'a_duration_seconds_sum{ok="true"} 5.55' in lines
    assert 'a_duration_seconds_count{ok="true"} 3' in lines


class _RecordingMeter(NoOpMeter):
    """A no-op meter that remembers what was created: (name, unit, kind)."""

    def __init__(self) -> None:
        super().__init__("rabbitry")
        self.created: list[tuple[str, str, str]] = []

    def __getattribute__(self, attribute: str) -> Any:
        value = super().__getattribute__(attribute)
        if not attribute.startswith("create_"):
            return value

        def create(name: str, *args: Any, **kwargs: Any) -> Any:
            # (name, unit, description) or (name, callbacks, unit, description)
            at = 1 if attribute.startswith("create_observable_") else 0
            unit = args[at] if len(args) > at else kwargs.get("unit", "")
            self.created.append((name, unit, attribute.removeprefix("create_")))
            return value(name, *args, **kwargs)

        return create


class _RecordingMeterProvider(NoOpMeterProvider):
    def __init__(self) -> None:
        self.meter = _RecordingMeter()

    def get_meter(self, name: str, *args: Any, **kwargs: Any) -> Meter:
        return self.meter


def _prometheus_name(name: str, unit: str, kind: str) -> str:
    base = name.replace(".", "_") + {"s": "_seconds", "By": "_bytes"}.get(unit, "")
    return base + "_total" if kind in ("counter", "observable_counter") else base


def test_every_metric_is_documented_and_the_dashboard_uses_only_real_metrics() -> None:
    provider = _RecordingMeterProvider()
    Instrumentation(meter_provider=provider)
    created = provider.meter.created
    kinds = "counter|up-down counter|histogram, s|gauge|gauge, s"
    metric_row = rf"^\| `(rabbitry\.[a-z_.]+)` \| (?:{kinds}) \|"
    documented = set(re.findall(metric_row, DOC.read_text(), re.M))
    assert {name for name, _unit, _kind in created} == documented
    exposed = {_prometheus_name(*row) for row in created}
    histograms = {
        _prometheus_name(name, unit, kind) for name, unit, kind in created if kind == "histogram"
    }
    exposed |= {f"{name}_{part}" for name in histograms for part in ("bucket", "sum", "count")}
    dashboard = json.loads(DASHBOARD.read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            used |= set(re.findall(r"\b(rabbitry_[a-z_]+)", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        used |= set(re.findall(r"\b(rabbitry_[a-z_]+)", variable.get("definition", "")))
    used -= {name.replace(".", "_") for name in (A_OUTCOME, A_STATE, A_OUTBOX)}  # labels
    assert used, "the dashboard queries no rabbitry metric"
    assert used <= exposed, f"the dashboard uses unknown metrics: {sorted(used - exposed)}"


def test_the_exposition_of_every_rabbitry_metric_parses_as_prometheus_text() -> None:
    reader = PrometheusReader()
    provider = MeterProvider(metric_readers=[reader])
    instrumentation = Instrumentation(meter_provider=provider)
    metrics = instrumentation.metrics
    metrics.count_publish("orders", 0)
    metrics.count_publish("orders", 2)
    metrics.confirm_duration.record(0.002, {"messaging.destination.name": "orders"})
    metrics.process_duration.record(0.01, {"messaging.destination.name": 'a "quoted"\nq'})
    metrics.connection_state.add(1, {"rabbitry.connection.state": "open"})
    metrics.set_depth(1, "orders", 7, 2)
    text = reader.render()
    instrumentation.close()
    provider.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # The parser names counters without their _total suffix.
    assert families["rabbitry_publisher_published"].type == "counter"
    assert families["rabbitry_publisher_in_flight"].type == "gauge"
    assert families["rabbitry_publisher_confirm_duration_seconds"].type == "histogram"
    assert families["rabbitry_queue_messages"].samples[0].value == 7
    (sample,) = [
        s
        for s in families["rabbitry_consumer_process_duration_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert sample.labels == {"messaging_destination_name": 'a "quoted"\nq'}
    assert sample.value == 1


async def test_blocked_periods_and_pool_waiters_are_measured() -> None:
    """A broker-side block is one ``blocked.duration`` measurement once it ends; a
    pool's waiting callers and lent channels are reported while they last."""
    reader = InMemoryMetricReader()
    observability.instrument(meter_provider=MeterProvider(metric_readers=[reader]))

    def value(name: str) -> Any:
        data = reader.get_metrics_data()
        points = [
            point
            for resource in (data.resource_metrics if data else [])
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]
        assert len(points) <= 1, points
        if not points:
            return None
        return points[0].count if hasattr(points[0], "bucket_counts") else points[0].value

    async def eventually(predicate: Any) -> None:
        for _ in range(1000):
            if predicate():
                return
            await asyncio.sleep(0.005)
        raise AssertionError("not reached in 5 s")

    try:
        with FakeBroker() as broker:
            conn = rabbitry.AsyncConnection(
                broker.url, heartbeat=0, connection_timeout=5, recovery=None
            )
            await conn.connect()
            try:
                broker.block("low on memory")
                await eventually(lambda: conn.is_blocked)
                assert value("rabbitry.connection.blocked.duration") is None
                broker.unblock()
                await eventually(lambda: not conn.is_blocked)
                assert value("rabbitry.connection.blocked.duration") == 1

                pool = await conn.channel_pool(size=1, confirm=False)
                second = pool.acquire()
                async with pool.acquire():
                    waiter = asyncio.create_task(second.__aenter__())
                    await eventually(lambda: pool.waiting == 1)
                    assert value("rabbitry.pool.waiters") == 1
                    assert value("rabbitry.pool.in_use") == 1
                assert (await asyncio.wait_for(waiter, 5)).is_open  # handed on
                assert (value("rabbitry.pool.waiters"), value("rabbitry.pool.in_use")) == (0, 1)
                await second.__aexit__(None, None, None)
                assert value("rabbitry.pool.in_use") == 0
                await pool.close()
            finally:
                await conn.close(timeout=2)
    finally:
        observability.uninstrument()
