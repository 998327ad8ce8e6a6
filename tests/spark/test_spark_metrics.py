"""The source and the sink count what they did: totals, one INFO line per batch, OTel.

The reader and writer objects are driven here in the test process the way Spark drives
them (``write``/``commit``, ``read``/``commit``/``stop``) so the in-memory metric reader
sees their counters; no JVM is started.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rabbitry import observability
from rabbitry.spark import trace_options
from rabbitry.spark._options import parse_read_options, parse_write_options
from rabbitry.spark._write import UnroutableRows
from rabbitry.spark.datasource import QueueStreamReader, StreamWriter

if TYPE_CHECKING:
    from collections.abc import Callable


ROWS = 25
BODY = b"0123456789"


def _values(reader: InMemoryMetricReader, queue: str) -> dict[str, int]:
    found: dict[str, int] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if not metric.name.startswith("rabbitry.spark."):
                    continue
                for point in metric.data.data_points:
                    if point.attributes.get("messaging.destination.name") == queue:
                        found[metric.name] = point.value
    return found


def test_sink_and_source_count_rows_bytes_confirms_and_acks(
    url: str, make_queue: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    metric_reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[metric_reader])
    observability.instrument(meter_provider=provider)
    caplog.set_level(logging.INFO, logger="rabbitry.spark")
    try:
        writer = StreamWriter(parse_write_options({"url": url, "routingKey": queue}))
        batch = pa.RecordBatch.from_pylist([{"body": BODY} for _ in range(ROWS)])
        message = writer.write(iter([batch]))
        writer.commit([message], 0)

        source = QueueStreamReader(
            parse_read_options({"url": url, "queue": queue, "maxMessagesPerBatch": "10"})
        )
        offset: dict[str, Any] = source.initialOffset()
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(rows) < ROWS and time.monotonic() < deadline:
            batches, offset = source.read(offset)  # record batches
            rows.extend(row for batch in batches for row in batch.to_pylist())
        source.commit(offset)
        source.stop()
    finally:
        observability.uninstrument()
    assert len(rows) == ROWS
    assert writer.counts.totals == {
        "rows": ROWS,
        "bytes": ROWS * len(BODY),
        "confirmed": ROWS,
        "nacked": 0,
        "unroutable": 0,
    }
    assert source.counts.totals == {
        "rows": ROWS,
        "bytes": ROWS * len(BODY),
        "acks": ROWS,
        "redelivered": 0,
    }
    # The write task (an executor's, here in this process) reports to OTel with the
    # exchange as destination: "" for the default exchange.
    assert _values(metric_reader, "") == {
        "rabbitry.spark.sink.rows": ROWS,
        "rabbitry.spark.sink.bytes": ROWS * len(BODY),
        "rabbitry.spark.sink.confirmed": ROWS,
    }
    assert _values(metric_reader, queue) == {
        "rabbitry.spark.source.rows": ROWS,
        "rabbitry.spark.source.bytes": ROWS * len(BODY),
        "rabbitry.spark.source.acks": ROWS,
    }
    lines = [r.getMessage() for r in caplog.records if r.name == "rabbitry.spark"]
    assert f"rabbitmq stream write batch 0: {ROWS} row(s), {ROWS * 10} byte(s), " in lines[0]
    batches = [line for line in lines if line.startswith(f"rabbitmq source {queue!r} batch")]
    assert batches and all("redelivered" in line for line in batches)


def test_unroutable_rows_are_counted_by_the_failed_task(url: str) -> None:
    metric_reader = InMemoryMetricReader()
    observability.instrument(meter_provider=MeterProvider(metric_readers=[metric_reader]))
    try:
        options = parse_write_options(
            {"url": url, "exchange": "amq.direct", "routingKey": "rabbitry-nowhere"}
        )
        writer = StreamWriter(options)
        with pytest.raises(UnroutableRows):
            writer.write(iter([pa.RecordBatch.from_pylist([{"body": BODY}])]))
    finally:
        observability.uninstrument()
    assert _values(metric_reader, "amq.direct") == {
        "rabbitry.spark.sink.rows": 1,
        "rabbitry.spark.sink.bytes": len(BODY),
        "rabbitry.spark.sink.unroutable": 1,
    }


def test_option_otel_instruments_the_reader_process() -> None:
    options = parse_read_options({"queue": "q", "otel": "true"})
    assert options.otel and not parse_read_options({"queue": "q"}).otel
    assert not observability.is_instrumented()
    try:
        QueueStreamReader(options)
        assert observability.is_instrumented()
    finally:
        observability.uninstrument()


def test_trace_options_make_each_row_publish_span_a_child_of_the_job_span(
    url: str, make_queue: Callable[..., str]
) -> None:
    queue = make_queue()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.instrument(tracer_provider=provider)
    try:
        with provider.get_tracer("test").start_as_current_span("nightly export") as job:
            options = trace_options()
        assert options["otel"] == "true" and "traceparent" in options
        writer = StreamWriter(parse_write_options({"url": url, "routingKey": queue, **options}))
        batch = pa.RecordBatch.from_pylist([{"body": BODY} for _ in range(ROWS)])
        # The task runs where the job's span is not current (an executor): another thread.
        with concurrent.futures.ThreadPoolExecutor(1) as executor:
            message = executor.submit(writer.write, iter([batch])).result(timeout=60)
        writer.commit([message], 0)
    finally:
        observability.uninstrument()
    publishes = [s for s in exporter.get_finished_spans() if s.name == "publish amq.default"]
    assert len(publishes) == ROWS
    job_context = job.get_span_context()
    for span in publishes:
        assert span.parent is not None and span.parent.span_id == job_context.span_id
        assert span.context is not None and span.context.trace_id == job_context.trace_id


def test_trace_options_outside_a_span_carry_no_context() -> None:
    assert trace_options() == {"otel": "true"}
