"""rabbitry.observability against the broker: traces, metrics, the Prometheus endpoint.

The OpenTelemetry SDK records into memory (``InMemorySpanExporter``,
``InMemoryMetricReader``); every test instruments rabbitry with its own providers and
uninstruments it afterwards.

* One message whose handler always fails is retried twice and parked: one trace holds
  the publish span and the three process spans (children of it), whose events name
  each move with its attempt number; for the broker-driven and the republish retry path.
* A handler's own spans are children of the process span, in the sync consumer's worker
  threads too.
* A returned (mandatory, unroutable), nacked or refused publish ends its span with error
  status; ``publish_batch`` gets one span per message, with its own outcome.
* The publisher, consumer, outbox and recovery metrics (a recovery and one that gives
  up) equal the counts of a known workload; consumer lag is the depth of the consumed
  queue; instrumenting again with the same meter provider keeps counting.
* ``serve_prometheus`` serves those counters over HTTP.
* Instrumented without an SDK, messages go out untouched (nothing to propagate).
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tests.support.broker_ctl import rabbitmqctl
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import AsyncConnection, Connection, Message, observability
from rabbitry.config import parse_urls
from rabbitry.exceptions import Reject
from rabbitry.outbox import SQLiteOutbox
from rabbitry.publisher import OutgoingMessage
from rabbitry.recovery import RecoveryPolicy, State
from rabbitry.topology import Exchange, Queue, RetryPolicy, Topology

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(120)

WAIT = 30.0


class Telemetry:
    """The in-memory SDK pipeline rabbitry is instrumented with."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        found.extend(item.data.data_points)
        return found

    def value(self, metric: str, **attributes: Any) -> Any:
        """The value (or histogram count) of the point whose attributes include these."""
        wanted = {key.replace("__", "."): value for key, value in attributes.items()}
        matches = [
            p
            for p in self.points(metric)
            if all(p.attributes.get(k) == v for k, v in wanted.items())
        ]
        assert len(matches) <= 1, f"{metric} {wanted}: several points {matches}"
        if not matches:
            return None
        point = matches[0]
        return point.count if hasattr(point, "bucket_counts") else point.value


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    pipeline = Telemetry()
    observability.instrument(pipeline.tracer_provider, pipeline.meter_provider)
    try:
        yield pipeline
    finally:
        observability.uninstrument()
        pipeline.tracer_provider.shutdown()
        pipeline.meter_provider.shutdown()


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"not reached within {WAIT} s: {what}"
        await asyncio.sleep(0.02)


def declare_retry(names: Names, queue: str, policy: RetryPolicy) -> str:
    retry_names = policy.names(queue)
    names.track_exchange(retry_names.dlx)
    for extra in (*retry_names.retry_queues, retry_names.parking_lot):
        assert extra is not None
        names.track_queue(extra)
    assert retry_names.parking_lot is not None
    return retry_names.parking_lot


# --------------------------------------------------------------------------- traces


@pytest.mark.parametrize(
    "policy_args",
    [{"delays": [0.05], "max_attempts": 3}, {"delays": [0.05, 0.1]}],
    ids=["broker-driven", "republish"],
)
async def test_one_trace_follows_a_message_through_two_retries_to_the_parking_lot(
    conn: AsyncConnection, names: Names, telemetry: Telemetry, policy_args: dict[str, Any]
) -> None:
    queue = names.queue("work")
    policy = RetryPolicy(**policy_args, queue=queue)
    parking_lot = declare_retry(names, queue, policy)
    await Topology(queues=[Queue(queue)]).with_retry(queue, policy).aapply(conn)
    async with await conn.publisher() as publisher:
        await (await publisher.send(b"doomed", routing_key=queue))

    async def failing(message: Message) -> None:
        raise RuntimeError("cannot handle it")

    consumer = conn.consumer(queue, failing, retry=policy)
    async with consumer:
        await eventually(lambda: consumer.stats.parked == 1, "the message is parked")
    await eventually(lambda: len(telemetry.finished(f"process {queue}")) == 3, "3 process spans")

    (publish,) = telemetry.finished("publish amq.default")
    processes = sorted(
        telemetry.finished(f"process {queue}"), key=lambda s: s.attributes["rabbitry.attempt"]
    )
    assert publish.kind is SpanKind.PRODUCER
    assert publish.attributes["messaging.system"] == "rabbitmq"
    assert publish.attributes["messaging.operation.type"] == "send"
    assert publish.attributes["messaging.rabbitmq.destination.routing_key"] == queue
    assert publish.attributes["rabbitry.outcome"] == "confirmed"
    assert publish.status.status_code is StatusCode.UNSET
    message_id = publish.attributes["messaging.message.id"]
    assert [s.attributes["rabbitry.attempt"] for s in processes] == [1, 2, 3]
    for span in processes:
        assert span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == publish.context.trace_id
        assert span.parent is not None and span.parent.span_id == publish.context.span_id
        assert span.attributes["messaging.operation.type"] == "process"
        assert span.attributes["messaging.destination.name"] == queue
        assert span.attributes["messaging.message.id"] == message_id
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "RuntimeError"
    moves = [
        [(e.name, e.attributes["rabbitry.attempt"]) for e in s.events if e.name != "exception"]
        for s in processes
    ]
    assert moves == [[("rabbitry.retry", 1)], [("rabbitry.retry", 2)], [("rabbitry.park", 3)]]
    park = next(e for e in processes[2].events if e.name == "rabbitry.park")
    assert park.attributes["messaging.rabbitmq.destination.routing_key"] == parking_lot
    assert all(any(e.name == "exception" for e in s.events) for s in processes)
    assert telemetry.value("rabbitry.consumer.retried", messaging__destination__name=queue) == 2
    assert telemetry.value("rabbitry.consumer.parked", messaging__destination__name=queue) == 1


async def test_a_handler_span_is_a_child_of_the_process_span(
    conn: AsyncConnection, names: Names, telemetry: Telemetry
) -> None:
    queue = names.queue()
    await Topology(queues=[Queue(queue)]).aapply(conn)
    tracer = telemetry.tracer_provider.get_tracer("test")

    async def handler(message: Message) -> None:
        with tracer.start_as_current_span("handler work"):
            pass

    async with await conn.publisher() as publisher:
        await (await publisher.send(b"m", routing_key=queue))
    async with conn.consumer(queue, handler):
        await eventually(lambda: len(telemetry.finished(f"process {queue}")) == 1, "processed")
    (process,) = telemetry.finished(f"process {queue}")
    (work,) = telemetry.finished("handler work")
    assert work.parent is not None and work.parent.span_id == process.context.span_id
    assert process.status.status_code is StatusCode.UNSET


def test_the_sync_twins_propagate_the_trace_into_the_handler_thread(
    url: str, names: Names, telemetry: Telemetry
) -> None:
    queue = names.queue()
    tracer = telemetry.tracer_provider.get_tracer("test")
    handled = threading.Event()

    def handler(message: Message) -> None:
        with tracer.start_as_current_span("handler work"):
            pass
        handled.set()

    with Connection(url) as conn:
        Topology(queues=[Queue(queue)]).apply(conn)
        with conn.publisher() as publisher:
            publisher.publish(b"m", routing_key=queue).result(WAIT)
        consumer = conn.consumer(queue, handler)
        consumer.start(timeout=WAIT)
        assert handled.wait(WAIT)
        consumer.stop(timeout=WAIT)
    (publish,) = telemetry.finished("publish amq.default")
    (process,) = telemetry.finished(f"process {queue}")
    (work,) = telemetry.finished("handler work")
    assert process.parent is not None and process.parent.span_id == publish.context.span_id
    assert work.parent is not None and work.parent.span_id == process.context.span_id


async def test_a_returned_publish_ends_its_span_with_error_status(
    conn: AsyncConnection, names: Names, telemetry: Telemetry
) -> None:
    exchange = names.exchange()
    await Topology(exchanges=[Exchange(exchange, "direct")]).aapply(conn)
    async with await conn.publisher() as publisher:
        future = await publisher.send(b"lost", exchange=exchange, routing_key="nowhere",
                                         mandatory=True)  # fmt: skip
        with pytest.raises(rabbitry.Unroutable):
            await future
    await eventually(lambda: len(telemetry.finished(f"publish {exchange}")) == 1, "span ended")
    (span,) = telemetry.finished(f"publish {exchange}")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["rabbitry.outcome"] == "returned"
    assert span.attributes["error.type"] == "Unroutable"
    assert (
        telemetry.value("rabbitry.publisher.returned", messaging__destination__name=exchange) == 1
    )


async def test_a_nacked_publish_ends_its_span_with_error_status(
    conn: AsyncConnection, names: Names, telemetry: Telemetry
) -> None:
    queue = names.queue()
    full = {"x-max-length": 0, "x-overflow": "reject-publish"}
    await Topology(queues=[Queue(queue, arguments=full)]).aapply(conn)
    async with await conn.publisher() as publisher:
        with pytest.raises(rabbitry.Nacked):
            await (await publisher.send(b"refused", routing_key=queue))
    (span,) = telemetry.finished("publish amq.default")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["rabbitry.outcome"] == "nacked"
    assert telemetry.value("rabbitry.publisher.nacked") == 1
    assert telemetry.value("rabbitry.publisher.confirm.duration", rabbitry__outcome="nacked") == 1


async def test_publish_batch_has_a_span_per_message_with_its_own_outcome(
    conn: AsyncConnection, names: Names, telemetry: Telemetry
) -> None:
    queue = names.queue()
    exchange = names.exchange()
    await Topology(queues=[Queue(queue)], exchanges=[Exchange(exchange, "direct")]).aapply(conn)
    lost = OutgoingMessage(b"lost", exchange=exchange, routing_key="nowhere", mandatory=True)
    async with await conn.publisher() as publisher:
        outcomes = await publisher.publish_batch([b"a", lost, b"b"], routing_key=queue)
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], rabbitry.Unroutable)
    (returned,) = telemetry.finished(f"publish {exchange}")
    assert returned.status.status_code is StatusCode.ERROR
    assert returned.attributes["rabbitry.outcome"] == "returned"
    confirmed = telemetry.finished("publish amq.default")
    assert [s.attributes["rabbitry.outcome"] for s in confirmed] == ["confirmed"] * 2
    channel = await conn.channel()
    got = [await channel.basic_get(queue, no_ack=True) for _ in range(2)]
    ids = {s.context.span_id for s in confirmed}
    assert {_parent_span_id(m) for m in got if m is not None} == ids
    default = {"messaging__destination__name": "amq.default"}
    assert telemetry.value("rabbitry.publisher.published", **default) == 2
    assert telemetry.value("rabbitry.publisher.confirmed", **default) == 2
    assert (
        telemetry.value("rabbitry.publisher.returned", messaging__destination__name=exchange) == 1
    )


def test_the_sync_publish_batch_has_a_span_per_message(
    url: str, names: Names, telemetry: Telemetry
) -> None:
    queue = names.queue()
    with Connection(url) as conn:
        Topology(queues=[Queue(queue)]).apply(conn)
        with conn.publisher() as publisher:
            assert publisher.publish_batch([b"a", b"b", b"c"], routing_key=queue) == [None] * 3
    spans = telemetry.finished("publish amq.default")
    assert [s.attributes["rabbitry.outcome"] for s in spans] == ["confirmed"] * 3
    assert len({s.attributes["messaging.message.id"] for s in spans}) == 3
    default = {"messaging__destination__name": "amq.default"}
    assert telemetry.value("rabbitry.publisher.published", **default) == 3
    assert telemetry.value("rabbitry.publisher.in_flight", **default) == 0


def _parent_span_id(message: Message) -> int:
    """The span id in the message's ``traceparent`` header."""
    headers = message.properties.headers or {}
    value = headers["traceparent"]
    text = value.decode() if isinstance(value, bytes) else value
    return int(text.split("-")[2], 16)


async def test_a_refused_publish_ends_its_span_with_error_status(
    conn: AsyncConnection, names: Names, telemetry: Telemetry
) -> None:
    missing = names.exchange("never-declared")
    async with await conn.publisher() as publisher:
        with pytest.raises(rabbitry.PublishRefused):
            await (await publisher.send(b"m", exchange=missing, routing_key="k"))
    (span,) = telemetry.finished(f"publish {missing}")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["rabbitry.outcome"] == "refused"
    assert telemetry.value("rabbitry.publisher.refused", messaging__destination__name=missing) == 1
    assert (
        telemetry.value("rabbitry.publisher.in_flight", messaging__destination__name=missing) == 0
    )


# --------------------------------------------------------------------------- metrics


def run_workload(url: str, names: Names, published: int, rejected: int) -> str:
    """Publish ``published`` messages with the sync publisher and consume them; the
    handler rejects the first ``rejected`` (parked at once). Returns the queue name."""
    queue = names.queue()
    policy = RetryPolicy(max_attempts=1, queue=queue)
    declare_retry(names, queue, policy)
    done = threading.Event()
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.body)
        if len(seen) == published:
            done.set()
        if int(message.body) < rejected:
            raise Reject("not wanted")

    with Connection(url) as conn:
        Topology(queues=[Queue(queue)]).with_retry(queue, policy).apply(conn)
        with conn.publisher() as publisher:
            futures = [publisher.publish(b"%d" % i, routing_key=queue) for i in range(published)]
            for future in futures:
                future.result(WAIT)
        consumer = conn.consumer(queue, handler, retry=policy)
        consumer.start(timeout=WAIT)
        assert done.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while consumer.stats.acked + consumer.stats.parked < published:
            assert time.monotonic() < deadline, consumer.stats
            time.sleep(0.02)
        consumer.stop(timeout=WAIT)
    return queue


def test_metrics_equal_the_counts_of_a_known_workload(
    url: str, names: Names, telemetry: Telemetry
) -> None:
    queue = run_workload(url, names, published=12, rejected=3)
    value = telemetry.value
    destination = {"messaging__destination__name": "amq.default"}
    assert value("rabbitry.publisher.published", **destination) == 12
    assert value("rabbitry.publisher.confirmed", **destination) == 12
    assert value("rabbitry.publisher.in_flight", **destination) == 0
    assert value("rabbitry.publisher.confirm.duration", **destination) == 12
    assert value("rabbitry.publisher.nacked", **destination) == 0
    of_queue = {"messaging__destination__name": queue}
    assert value("rabbitry.consumer.delivered", **of_queue) == 12
    assert value("rabbitry.consumer.acked", **of_queue) == 9
    assert value("rabbitry.consumer.failed", **of_queue) == 3
    assert value("rabbitry.consumer.parked", **of_queue) == 3
    assert value("rabbitry.consumer.retried", **of_queue) == 0
    assert (
        value("rabbitry.consumer.redelivered", **of_queue) == 0
    )  # known from the start, never counted
    durations = telemetry.points("rabbitry.consumer.process.duration")
    by_error = {p.attributes.get("error.type"): p.count for p in durations}
    assert by_error == {None: 9, "Reject": 3}
    assert value("rabbitry.connection.state", rabbitry__connection__state="closed") == 1
    assert value("rabbitry.connection.state", rabbitry__connection__state="open") == 0


async def test_instrumenting_again_with_the_same_meter_provider_keeps_counting(
    conn: AsyncConnection, names: Names, telemetry: Telemetry
) -> None:
    queue = names.queue()
    await Topology(queues=[Queue(queue)]).aapply(conn)
    default = {"messaging__destination__name": "amq.default"}
    async with await conn.publisher() as publisher:
        await (await publisher.send(b"1", routing_key=queue))
        observability.uninstrument()
        assert telemetry.value("rabbitry.publisher.published", **default) is None
        await (await publisher.send(b"not counted", routing_key=queue))
        observability.instrument(telemetry.tracer_provider, telemetry.meter_provider)
        observability.instrument(telemetry.tracer_provider, telemetry.meter_provider)
        await (await publisher.send(b"2", routing_key=queue))
    assert telemetry.value("rabbitry.publisher.published", **default) == 2
    assert telemetry.value("rabbitry.publisher.confirmed", **default) == 2
    assert len(telemetry.finished("publish amq.default")) == 2


async def test_a_recovery_is_counted_with_its_duration(
    url: str, names: Names, telemetry: Telemetry
) -> None:
    name = names.queue("conn")  # a unique connection name; no queue is declared
    policy = RecoveryPolicy(initial_delay=0.05, max_delay=0.2)
    async with AsyncConnection(url, connection_name=name, recovery=policy) as conn:
        recovered = asyncio.Event()
        conn.on_state_change(lambda state, _cause: state is State.OPEN and recovered.set())
        listing = await asyncio.to_thread(
            rabbitmqctl, url, "list_connections", "-q", "pid", "client_properties"
        )
        (pid,) = [line.split("\t", 1)[0] for line in listing.splitlines() if f'"{name}"' in line]
        await asyncio.to_thread(rabbitmqctl, url, "close_connection", pid, "recovery test")
        async with asyncio.timeout(WAIT):
            await recovered.wait()
        recovered_attrs = {"rabbitry__outcome": "recovered"}
        assert telemetry.value("rabbitry.connection.recoveries", **recovered_attrs) == 1
        assert telemetry.value("rabbitry.connection.recovery.duration", **recovered_attrs) == 1
        state = "rabbitry__connection__state"
        assert telemetry.value("rabbitry.connection.state", **{state: "open"}) == 1
        assert telemetry.value("rabbitry.connection.state", **{state: "recovering"}) == 0


async def test_a_recovery_that_gives_up_is_counted_as_failed(
    url: str, telemetry: Telemetry
) -> None:
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        policy = RecoveryPolicy(initial_delay=0.05, max_delay=0.1, max_attempts=2)
        conn = AsyncConnection(proxy.url(), connection_timeout=1, recovery=policy)
        await conn.connect()
        proxy.refuse(True)
        proxy.reset()
        await conn.wait_closed(WAIT)
        await conn.close()
    failed = {"rabbitry__outcome": "failed"}
    assert telemetry.value("rabbitry.connection.recoveries", **failed) == 1
    assert telemetry.value("rabbitry.connection.recovery.duration", **failed) == 1
    assert (
        telemetry.value("rabbitry.connection.recoveries", rabbitry__outcome="recovered") == 0
    )  # it starts at 0
    state = "rabbitry__connection__state"
    assert telemetry.value("rabbitry.connection.state", **{state: "closed"}) == 1
    assert telemetry.value("rabbitry.connection.state", **{state: "recovering"}) == 0


async def test_consumer_lag_exports_the_depth_of_the_consumed_queue(
    conn: AsyncConnection, names: Names
) -> None:
    telemetry = Telemetry()
    observability.instrument(meter_provider=telemetry.meter_provider, consumer_lag_interval=0.05)
    try:
        queue = names.queue()
        await Topology(queues=[Queue(queue)]).aapply(conn)
        release = asyncio.Event()

        async def stuck(message: Message) -> None:
            await release.wait()

        async with await conn.publisher() as publisher:
            for _ in range(5):
                await (await publisher.send(b"m", routing_key=queue))
        consumer = conn.consumer(queue, stuck, prefetch=1)
        async with consumer:
            of_queue = {"messaging__destination__name": queue}
            # One message is with the handler; the four others wait in the queue.
            await eventually(
                lambda: telemetry.value("rabbitry.queue.messages", **of_queue) == 4, "lag of 4"
            )
            assert telemetry.value("rabbitry.queue.consumers", **of_queue) == 1
            release.set()
            await eventually(
                lambda: telemetry.value("rabbitry.queue.messages", **of_queue) == 0, "drained"
            )
    finally:
        observability.uninstrument()
        telemetry.meter_provider.shutdown()


async def test_outbox_metrics_follow_the_outbox_publisher(
    conn: AsyncConnection, names: Names, telemetry: Telemetry, tmp_path: Path
) -> None:
    queue = names.queue()
    exchange = names.exchange()
    await Topology(queues=[Queue(queue)], exchanges=[Exchange(exchange, "direct")]).aapply(conn)
    path = str(tmp_path / "outbox.db")
    async with await conn.publisher(outbox=SQLiteOutbox(path), timeout=WAIT) as publisher:
        for body in (b"1", b"2", b"3"):
            await publisher.publish(body, routing_key=queue)
        await publisher.publish(b"lost", exchange=exchange, routing_key="nowhere", mandatory=True)
        await publisher.flush(timeout=WAIT)
        outbox = {"rabbitry__outbox": path}
        assert telemetry.value("rabbitry.outbox.stored", **outbox) == 4
        assert telemetry.value("rabbitry.outbox.dead", **outbox) == 1
        assert telemetry.value("rabbitry.outbox.pending", **outbox) == 0
        assert telemetry.value("rabbitry.outbox.oldest_age", **outbox) == 0
        assert telemetry.value("rabbitry.outbox.acked", **outbox) == publisher.stats().acked
    assert telemetry.value("rabbitry.outbox.stored", **outbox) == 4  # closed: kept


# --------------------------------------------------------------------------- Prometheus


def test_the_prometheus_endpoint_serves_the_workload_counters(url: str, names: Names) -> None:
    server = observability.serve_prometheus(0)
    try:
        queue = run_workload(url, names, published=7, rejected=2)
        with urllib.request.urlopen(server.url, timeout=WAIT) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = response.read().decode()
    finally:
        server.close()
        observability.uninstrument()
    lines = set(text.splitlines())
    dest = 'messaging_destination_name="amq.default"'
    assert f"rabbitry_publisher_published_total{{{dest}}} 7" in lines
    assert f"rabbitry_publisher_confirmed_total{{{dest}}} 7" in lines
    assert f"rabbitry_publisher_confirm_duration_seconds_count{{{dest},rabbitry_outcome=" \
        '"confirmed"} 7' in lines  # fmt: skip
    assert f'rabbitry_consumer_delivered_total{{messaging_destination_name="{queue}"}} 7' in lines
    assert f'rabbitry_consumer_acked_total{{messaging_destination_name="{queue}"}} 5' in lines
    assert f'rabbitry_consumer_parked_total{{messaging_destination_name="{queue}"}} 2' in lines
    assert "# TYPE rabbitry_publisher_confirmed_total counter" in lines
    assert "# TYPE rabbitry_consumer_process_duration_seconds histogram" in lines


async def test_without_an_sdk_instrumenting_leaves_messages_untouched(
    conn: AsyncConnection, names: Names
) -> None:
    """With only the API's no-op providers there is nothing to propagate: no headers."""
    queue = names.queue()
    await Topology(queues=[Queue(queue)]).aapply(conn)
    observability.instrument()
    try:
        async with await conn.publisher() as publisher:
            await (await publisher.send(b"m", routing_key=queue))
    finally:
        observability.uninstrument()
    channel = await conn.channel()
    message = await channel.basic_get(queue, no_ack=True)
    assert message is not None
    assert message.properties.headers is None
    assert message.properties.message_id is not None
