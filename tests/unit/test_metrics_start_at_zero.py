"""Counters and histograms whose labels are known read 0 before their first event, so
``increase()``/``rate()`` in Prometheus see that event (the Prometheus text output)."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families
from tests.unit.fake_broker import FakeBroker

import rabbitry
from rabbitry import observability
from rabbitry.observability._metrics import DURATION_BUCKETS, ZeroHistogram
from rabbitry.observability.prometheus import render

RECOVERED = '{rabbitry_outcome="recovered"}'
FAILED = '{rabbitry_outcome="failed"}'


def _samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, labels in the order rabbitry writes them."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def test_a_histogram_with_known_labels_renders_zero_buckets_sum_and_count() -> None:
    histogram = ZeroHistogram(
        "rabbitry.connection.recovery.duration", "s", "recoveries", DURATION_BUCKETS
    )
    histogram.attribute_sets.append({"rabbitry.outcome": "recovered"})
    text = render(None, [histogram])
    samples = _samples(text)
    name = "rabbitry_connection_recovery_duration_seconds"
    assert "# TYPE rabbitry_connection_recovery_duration_seconds histogram" in text
    assert samples[f"{name}_count{RECOVERED}"] == 0
    assert samples[f"{name}_sum{RECOVERED}"] == 0
    buckets = [k for k in samples if k.startswith(f"{name}_bucket")]
    assert len(buckets) == len(DURATION_BUCKETS) + 1
    assert all(samples[k] == 0 for k in buckets)


async def test_a_connection_starts_its_recovery_series_at_zero() -> None:
    server = observability.serve_prometheus(port=0)
    try:
        with FakeBroker() as broker:
            conn = rabbitry.AsyncConnection(
                broker.url, heartbeat=0, connection_timeout=5, recovery=None
            )
            await conn.connect()
            try:
                samples = _samples(
                    await asyncio.get_running_loop().run_in_executor(None, server.reader.render)
                )
            finally:
                await conn.close(timeout=2)
    finally:
        server.close()
        observability.uninstrument()
    for outcome in (RECOVERED, FAILED):
        assert samples[f"rabbitry_connection_recoveries_total{outcome}"] == 0
        assert samples[f"rabbitry_connection_recovery_duration_seconds_count{outcome}"] == 0
    assert samples["rabbitry_connection_blocked_duration_seconds_count"] == 0


def test_a_measured_label_set_is_not_rendered_twice() -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    from rabbitry.observability._otel import Instrumentation
    from rabbitry.observability.prometheus import PrometheusReader

    reader = PrometheusReader()
    provider = MeterProvider(metric_readers=[reader])
    instrumentation = Instrumentation(meter_provider=provider)
    reader.zero_source = instrumentation.metrics.zero_series
    try:
        metrics = instrumentation.metrics
        metrics.start_connection()
        metrics.recovery_duration.record(0.5, {"rabbitry.outcome": "recovered"})
        metrics.recoveries.add(1, {"rabbitry.outcome": "recovered"})
        text = reader.render()
    finally:
        instrumentation.close()
        provider.shutdown()
    samples = _samples(text)
    assert samples[f"rabbitry_connection_recovery_duration_seconds_count{RECOVERED}"] == 1
    assert samples[f"rabbitry_connection_recovery_duration_seconds_count{FAILED}"] == 0
    assert samples[f"rabbitry_connection_recoveries_total{RECOVERED}"] == 1
    assert samples[f"rabbitry_connection_recoveries_total{FAILED}"] == 0
    assert text.count(f"rabbitry_connection_recovery_duration_seconds_count{RECOVERED}") == 1
