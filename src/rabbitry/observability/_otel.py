"""The OpenTelemetry hooks: spans, context propagation and metrics (extra ``otel``).

Imported only by :func:`rabbitry.observability.instrument`, so the library itself never
imports ``opentelemetry``. One :class:`Instrumentation` is installed at a time as
``_state.active``; the publisher, consumer and connection call its methods.

Spans follow the OpenTelemetry messaging conventions: ``publish <exchange>`` (PRODUCER,
``messaging.operation.type`` ``send``) from the publisher's ``publish`` until the
broker settles the message, and ``process <queue>`` (CONSUMER, ``process``) around a
consumer's handling of a delivery, its ack or its move included. The publish span's
context travels in the message headers (``traceparent``/``tracestate`` with the default
propagator); the process span is its child, and a retried message keeps the headers it
was published with, so every attempt joins the same trace.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import INVALID_SPAN, Link, SpanKind, Status, StatusCode

from .._version import __version__
from ..exceptions import AMQPError, Nacked, PublishRefused, Unroutable
from ..protocol.spec import BasicProperties
from ..publisher import OutgoingMessage, port_of
from ..publishing.unobserved import peek
from ..recovery import State
from ._metrics import A_DESTINATION, A_OUTCOME, A_STATE, OUTCOME_INDEX, metrics_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider
    from opentelemetry.util.types import AttributeValue

    from ..aio.connection import AsyncConnection
    from ..consumer import AsyncConsumer
    from ..outbox_publisher import AsyncOutboxPublisher
    from ..pool import AsyncChannelPool
    from ..protocol.message import Message
    from ..publisher import AsyncPublisher, Body
    from ..topology import RetryDecision

logger = logging.getLogger("rabbitry.observability")

SYSTEM = "rabbitmq"
#: The destination name of the default exchange ("").
DEFAULT_EXCHANGE = "amq.default"

# Attribute names (OpenTelemetry semantic conventions, messaging).
A_SYSTEM = "messaging.system"
A_OPERATION_NAME = "messaging.operation.name"
A_OPERATION_TYPE = "messaging.operation.type"
A_ROUTING_KEY = "messaging.rabbitmq.destination.routing_key"
A_DELIVERY_TAG = "messaging.rabbitmq.message.delivery_tag"
A_MESSAGE_ID = "messaging.message.id"
A_CONVERSATION_ID = "messaging.message.conversation_id"
A_BODY_SIZE = "messaging.message.body.size"
A_BATCH_COUNT = "messaging.batch.message_count"
A_CONSUMER_GROUP = "messaging.consumer.group.name"
A_SERVER_ADDRESS = "server.address"
A_SERVER_PORT = "server.port"
A_ERROR_TYPE = "error.type"
# rabbitry's own.
A_ATTEMPT = "rabbitry.attempt"
A_REDELIVERED = "rabbitry.redelivered"
A_DELAY = "rabbitry.retry.delay"

#: The error type of the handler failure in the running process span (per task).
_handler_error: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rabbitry_handler_error", default=None
)


class _HeaderGetter(Getter[Any]):
    """Reads propagation fields from AMQP headers (values may arrive as bytes)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            return None
        if isinstance(value, bytes | bytearray):
            return [bytes(value).decode("utf-8", "replace")]
        return [str(value)]

    def keys(self, carrier: Any) -> list[str]:
        return list(carrier)


_GETTER = _HeaderGetter()


def publish_outcome(exc: BaseException | None) -> str:
    """The ``rabbitry.outcome`` of a publish from its future's exception."""
    if exc is None:
        return "confirmed"
    if isinstance(exc, Nacked):
        return "nacked"
    if isinstance(exc, Unroutable):
        return "returned"
    if isinstance(exc, PublishRefused):
        return "refused"
    return "failed"


class Instrumentation:
    """Spans and metrics for rabbitry; installed by :func:`~rabbitry.observability.instrument`.

    Args:
        tracer_provider: where spans go (``None``: the global provider).
        meter_provider: where metrics go (``None``: the global provider).
        consumer_lag_interval: seconds between passive declares of each consumed queue
            (the ``rabbitry.queue.messages`` gauge); ``None`` turns it off.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        *,
        consumer_lag_interval: float | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.consumer_lag_interval = consumer_lag_interval
        self._tracer = trace.get_tracer("rabbitry", __version__, tracer_provider)
        self.metrics = metrics_for(meter_provider)
        self.metrics.enabled = True
        self.metrics.owner = self
        self._closed = False
        # Whether an SDK (or another implementation) backs each provider; until both
        # do, asked again at most once a second (_refresh).
        self._tracing = self._metering = self._complete = False
        self._next_check = 0.0
        self._pollers: set[asyncio.Task[None]] = set()

    def _refresh(self) -> None:
        """Find out whether spans and measurements would be recorded.

        With the API's own (proxy or no-op) providers they would all be dropped, so the
        hooks skip that work. Asking the API costs microseconds, so it is asked at most
        once a second; a global provider can be set once only, so a yes is kept.
        """
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + 1.0
        self._tracing = not _api_default(self.tracer_provider or trace.get_tracer_provider())
        self._metering = not _api_default(self.meter_provider or metrics.get_meter_provider())
        self._complete = self._tracing and self._metering

    def close(self) -> None:
        """Stop the pollers and report nothing more from the observable instruments."""
        self._closed = True
        if self.metrics.owner is self:
            self.metrics.enabled = False
        for task in list(self._pollers):
            try:
                task.get_loop().call_soon_threadsafe(task.cancel)
            except RuntimeError:  # its loop is closed: the task is gone with it
                pass

    # ------------------------------------------------------------------ publisher

    def publish(
        self,
        publisher: AsyncPublisher,
        exchange: str,
        routing_key: str,
        properties: BasicProperties | None,
    ) -> tuple[BasicProperties | None, Callable[[Any], None] | None]:
        """Start the ``publish`` span of one message and put its context in the headers.

        Returns:
            The properties to send, and what to call with the publish's future; ``None``
            instead of it when nothing would be recorded (no SDK behind either provider).
        """
        if not self._complete:
            if time.monotonic() >= self._next_check:
                self._refresh()
            if not (self._tracing or self._metering):
                return properties, None
        destination = exchange or DEFAULT_EXCHANGE
        if not self._tracing:
            return properties, _PublishWatch(self, INVALID_SPAN, destination, publisher.confirm)
        span = self._tracer.start_span(f"publish {destination}", kind=SpanKind.PRODUCER)
        if span.get_span_context().is_valid:  # e.g. a sampler that drops it without a trace
            props = BasicProperties() if properties is None else copy.copy(properties)
            if props.message_id is None:
                props.message_id = port_of(publisher).new_message_id()
            if span.is_recording():
                params = port_of(publisher).connection.params
                attributes: dict[str, AttributeValue] = {
                    A_SYSTEM: SYSTEM,
                    A_OPERATION_NAME: "publish",
                    A_OPERATION_TYPE: "send",
                    A_DESTINATION: destination,
                    A_MESSAGE_ID: props.message_id,
                    A_SERVER_ADDRESS: params.host,
                    A_SERVER_PORT: params.port,
                }
                if routing_key:
                    attributes[A_ROUTING_KEY] = routing_key
                if props.correlation_id:
                    attributes[A_CONVERSATION_ID] = props.correlation_id
                span.set_attributes(attributes)
            headers = dict(props.headers) if props.headers else {}
            propagate.inject(headers, context=trace.set_span_in_context(span))
            props.headers = headers
            properties = props
        return properties, _PublishWatch(self, span, destination, publisher.confirm)

    def publish_batch(
        self,
        publisher: AsyncPublisher,
        messages: Iterable[OutgoingMessage | Body],
        exchange: str,
        routing_key: str,
        properties: BasicProperties | None,
    ) -> tuple[Iterable[OutgoingMessage | Body], Callable[[Any], None] | None]:
        """:meth:`publish` for each message of a batch; the same ``None`` when idle."""
        if isinstance(messages, bytes | bytearray | memoryview | str | OutgoingMessage):
            return messages, None  # publish_batch refuses one message itself
        if not self._complete:
            if time.monotonic() >= self._next_check:
                self._refresh()
            if not (self._tracing or self._metering):
                return messages, None
        out: list[OutgoingMessage | Body] = []
        watches: list[_PublishWatch] = []
        for message in messages:
            if isinstance(message, OutgoingMessage):
                props, watch = self.publish(
                    publisher,
                    exchange if message.exchange is None else message.exchange,
                    routing_key if message.routing_key is None else message.routing_key,
                    properties if message.properties is None else message.properties,
                )
                out.append(dataclasses.replace(message, properties=props))
            else:
                props, watch = self.publish(publisher, exchange, routing_key, properties)
                out.append(OutgoingMessage(message, properties=props))
            assert isinstance(watch, _PublishWatch)
            watches.append(watch)
        return out, _BatchWatch(watches)

    # ------------------------------------------------------------------ consumer

    def records_process(self) -> bool:
        """Whether :meth:`process` would record anything (else the consumer skips it)."""
        if not self._complete and time.monotonic() >= self._next_check:
            self._refresh()
        return self._tracing or self._metering

    async def process(
        self,
        consumer: AsyncConsumer,
        work: Message | list[Message],
        handling: Awaitable[None],
    ) -> None:
        metric_attributes = {A_DESTINATION: consumer.queue}
        if isinstance(work, list):
            redelivered = sum(message.redelivered for message in work)
        else:
            redelivered = work.redelivered
        if redelivered and self._metering:
            self.metrics.redelivered.add(redelivered, metric_attributes)
        span = self._process_span(consumer, work) if self._tracing else None
        token = None if span is None else otel_context.attach(trace.set_span_in_context(span))
        error = _handler_error.set(None)
        start = time.perf_counter()
        try:
            await handling
        finally:
            failed = _handler_error.get()
            _handler_error.reset(error)
            if self._metering:
                if failed is not None:
                    metric_attributes[A_ERROR_TYPE] = failed
                self.metrics.process_duration.record(time.perf_counter() - start, metric_attributes)
            if span is not None:
                assert token is not None
                otel_context.detach(token)
                span.end()

    def _process_span(self, consumer: AsyncConsumer, work: Message | list[Message]) -> Span:
        """Start the ``process`` span of one delivery (a child of the context it carries)
        or of a batch (linked to theirs)."""
        queue = consumer.queue
        attributes: dict[str, AttributeValue] = {
            A_SYSTEM: SYSTEM,
            A_OPERATION_NAME: "process",
            A_OPERATION_TYPE: "process",
            A_DESTINATION: queue,
            A_CONSUMER_GROUP: queue,
        }
        if isinstance(work, list):
            links = []
            for message in work:
                context = trace.get_current_span(self._extract(message)).get_span_context()
                if context.is_valid:
                    links.append(Link(context))
            attributes[A_BATCH_COUNT] = len(work)
            return self._tracer.start_span(
                f"process {queue}", kind=SpanKind.CONSUMER, links=links, attributes=attributes
            )
        message = work
        if message.routing_key:
            attributes[A_ROUTING_KEY] = message.routing_key
        message_id = message.properties.message_id
        if message_id:
            attributes[A_MESSAGE_ID] = message_id
        attributes[A_DELIVERY_TAG] = message.delivery_tag
        attributes[A_BODY_SIZE] = len(message.body)
        attributes[A_REDELIVERED] = message.redelivered
        if consumer.retry is not None:
            attributes[A_ATTEMPT] = consumer.retry.attempts(message, queue) + 1
        return self._tracer.start_span(
            f"process {queue}",
            context=self._extract(message),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )

    @staticmethod
    def _extract(message: Message) -> otel_context.Context:
        headers = message.properties.headers
        return propagate.extract(headers or {}, getter=_GETTER)

    def handler_failed(self, consumer: AsyncConsumer, message: Message, exc: BaseException) -> None:
        kind = type(exc).__qualname__
        _handler_error.set(kind)
        span = trace.get_current_span()
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"handler raised {kind}"))
        span.set_attribute(A_ERROR_TYPE, kind)

    def moved(
        self,
        consumer: AsyncConsumer,
        message: Message,
        outcome: str,
        decision: RetryDecision | None,
    ) -> None:
        attributes: dict[str, AttributeValue] = {A_DELIVERY_TAG: message.delivery_tag}
        if decision is not None:
            attributes[A_ATTEMPT] = decision.attempts
            if outcome != "drop":  # where the message went
                attributes[A_DESTINATION] = decision.exchange or DEFAULT_EXCHANGE
                if decision.routing_key:
                    attributes[A_ROUTING_KEY] = decision.routing_key
            if decision.delay is not None:
                attributes[A_DELAY] = decision.delay
        span = trace.get_current_span()
        span.add_event(f"rabbitry.{outcome}", attributes)
        span.set_attribute(A_OUTCOME, outcome)

    def consumer_started(self, consumer: AsyncConsumer, connection: AsyncConnection) -> None:
        self.metrics.follow_consumer(consumer)
        interval = self.consumer_lag_interval
        if interval is not None:
            task = asyncio.get_running_loop().create_task(
                self._poll_depth(consumer, connection, interval)
            )
            self._pollers.add(task)
            task.add_done_callback(self._pollers.discard)

    async def _poll_depth(
        self, consumer: AsyncConsumer, connection: AsyncConnection, interval: float
    ) -> None:
        """Passive-declare the consumer's queue (on ``connection``, its connection) every
        ``interval`` s while it runs."""
        key = id(consumer)
        channel = None
        failures = 0
        try:
            while not self._closed and consumer.is_running and not connection.is_closed:
                try:
                    if channel is None or channel.is_closed:
                        channel = await connection.channel(timeout=interval)
                    ok = await channel.queue_declare(consumer.queue, passive=True, timeout=interval)
                    self.metrics.set_depth(key, consumer.queue, ok.message_count, ok.consumer_count)
                    failures = 0
                except AMQPError as exc:
                    self.metrics.drop_depth(key)
                    failures += 1
                    if failures == 1:
                        logger.warning(
                            "queue depth of %r not available: %r (retrying every %g s)",
                            consumer.queue,
                            exc,
                            interval,
                        )
                await asyncio.sleep(interval)
        finally:
            self.metrics.drop_depth(key)
            if channel is not None and not channel.is_closed and connection.is_open:
                try:
                    await channel.close()
                except AMQPError:
                    pass

    # ------------------------------------------------------------------ connection

    def outbox_started(self, publisher: AsyncOutboxPublisher) -> None:
        self.metrics.outboxes.follow(publisher)

    def connection_created(self, connection: AsyncConnection) -> None:
        connection.on_state_change(_ConnectionWatch(self, connection.state))
        connection.add_blocked_callback(_BlockedWatch(self))

    def pool_created(self, pool: AsyncChannelPool) -> None:
        self.metrics.follow_pool(pool)


def _api_default(provider: object) -> bool:
    """``provider`` is the OpenTelemetry API's own (proxy or no-op): nothing records."""
    return type(provider).__module__.startswith(("opentelemetry.trace", "opentelemetry.metrics"))


class _PublishWatch:
    """Ends a publish span and counts the outcome when the publish future settles."""

    __slots__ = ("confirm", "destination", "instrumentation", "span", "start")

    def __init__(
        self, instrumentation: Instrumentation, span: Span, destination: str, confirm: bool
    ) -> None:
        self.instrumentation = instrumentation
        self.span = span
        self.destination = destination
        self.confirm = confirm
        self.start = time.perf_counter()

    def __call__(self, future: Any) -> None:
        """``future`` was handed to the caller: the message is on its way."""
        self.instrumentation.metrics.count_publish(self.destination, 0)
        future.add_done_callback(self._settled)

    def _settled(self, future: Any) -> None:
        # peek: recording the outcome is not the application looking at it
        self.settle(asyncio.CancelledError() if future.cancelled() else peek(future))

    def settle(self, exc: BaseException | None) -> None:
        """The broker (or the channel's end) settled the message: ``exc`` is why not."""
        instrumentation = self.instrumentation
        span = self.span
        if not self.confirm and exc is None:
            instrumentation.metrics.count_publish(self.destination, None)
            span.set_attribute(A_OUTCOME, "sent")
            span.end()
            return
        outcome = publish_outcome(exc)
        instrumentation.metrics.count_publish(self.destination, OUTCOME_INDEX[outcome])
        if outcome != "failed":  # the broker answered: that took the confirm latency
            instrumentation.metrics.confirm_duration.record(
                time.perf_counter() - self.start,
                {A_DESTINATION: self.destination, A_OUTCOME: outcome},
            )
        if span.is_recording():
            span.set_attribute(A_OUTCOME, outcome)
            if exc is not None:
                kind = type(exc).__qualname__
                span.set_attribute(A_ERROR_TYPE, kind)
                span.set_status(Status(StatusCode.ERROR, f"{outcome}: {exc}"))
        span.end()


class _BatchWatch:
    """The :class:`_PublishWatch` of every message of a batch, settled together from the
    batch's list of outcomes (their spans end when the whole batch is settled)."""

    __slots__ = ("watches",)

    def __init__(self, watches: list[_PublishWatch]) -> None:
        self.watches = watches

    def __call__(self, future: Any) -> None:
        for watch in self.watches:
            watch.instrumentation.metrics.count_publish(watch.destination, 0)
        future.add_done_callback(self._settled)

    def _settled(self, future: Any) -> None:
        outcomes: list[BaseException | None]
        if future.cancelled() or future.exception() is not None:
            error = asyncio.CancelledError() if future.cancelled() else future.exception()
            outcomes = [error] * len(self.watches)
        else:
            outcomes = future.result()
        for watch, outcome in zip(self.watches, outcomes, strict=True):
            watch.settle(outcome)


class _BlockedWatch:
    """Measures each period a connection is blocked by the broker (resource alarm)."""

    __slots__ = ("instrumentation", "since")

    def __init__(self, instrumentation: Instrumentation) -> None:
        self.instrumentation = instrumentation
        self.since: float | None = None

    def __call__(self, reason: str | None) -> None:
        if reason is not None:
            if self.since is None:
                self.since = time.monotonic()
        elif self.since is not None:
            self.instrumentation.metrics.blocked_duration.record(time.monotonic() - self.since)
            self.since = None


class _ConnectionWatch:
    """Follows one connection's states: the state gauge, recoveries and their duration."""

    __slots__ = ("instrumentation", "since", "state")

    def __init__(self, instrumentation: Instrumentation, state: State) -> None:
        self.instrumentation = instrumentation
        self.state = state
        self.since: float | None = None
        instrumentation.metrics.connection_state.add(1, {A_STATE: state.value})
        instrumentation.metrics.start_connection()

    def __call__(self, state: State, _cause: AMQPError | None) -> None:
        instrumentation = self.instrumentation
        instrumentation.metrics.connection_state.add(-1, {A_STATE: self.state.value})
        instrumentation.metrics.connection_state.add(1, {A_STATE: state.value})
        self.state = state
        if state is State.RECOVERING:
            if self.since is None:
                self.since = time.monotonic()
        elif self.since is not None:
            outcome = "recovered" if state is State.OPEN else "failed"
            instrumentation.metrics.recoveries.add(1, {A_OUTCOME: outcome})
            instrumentation.metrics.recovery_duration.record(
                time.monotonic() - self.since, {A_OUTCOME: outcome}
            )
            self.since = None
