"""rabbitry.observability without a broker: optional import, switch, exposition format."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider

from rabbitry import observability
from rabbitry.exceptions import ConfigurationError
from rabbitry.observability import _state
from rabbitry.observability.prometheus import PrometheusReader


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
