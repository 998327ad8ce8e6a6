"""The write side of the data source, without pyspark: one task's rows → confirmed messages.

Memory is bounded by the confirm window (``maxInFlight``), not by the partition: each
publish's outcome is tallied when it settles and nothing per row is kept afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..batching import encode_records, envelope_headers
from ..batching_publisher import DEFAULT_BATCH_BYTES
from ..exceptions import (
    AMQPError,
    ChannelClosed,
    ConfigurationError,
    ConnectionClosed,
    NotFound,
    PublishFailed,
    Unroutable,
    UnroutableRows,
)
from ..protocol.spec import BasicProperties
from ._arrow import batch_fields
from ._rows import fields_to_message, row_fields
from ._super import routed_batch_fields, routed_row_fields

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Iterable, Iterator, Mapping

    from ._metrics import Counts
    from ._options import WriteOptions

__all__ = [
    "PublishResult",
    "UnroutableRows",
    "check_batch_columns",
    "publish_batches",
    "publish_rows",
]

#: A write row's values, in the order of :func:`~rabbitry.spark._rows.row_fields`.
Fields = tuple[Any, Any, Any, Any, Any, Any]

logger = logging.getLogger("rabbitry.spark")

# Distinct (exchange, routing key) pairs named in an UnroutableRows message.
_MAX_NAMED_ROUTES = 5


@dataclasses.dataclass
class PublishResult:
    """What one write task published (all confirmed)."""

    partition_id: int
    attempt: int
    published: int
    confirmed: int
    first_message_id: str | None
    last_message_id: str | None
    bytes: int = 0


class _Tally:
    """Outcomes of the task's publishes, counted as they settle (IO thread)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.sent = 0
        self.bytes = 0
        self.settled = 0
        self.failed = 0
        self.returned = 0
        self.routes: dict[tuple[str, str], int] = {}
        self.first_error: BaseException | None = None

    def track(self, future: concurrent.futures.Future[None], rows: int = 1, size: int = 0) -> None:
        """Count ``rows`` rows of ``size`` body bytes sent in the message of ``future``
        (more than one in an envelope)."""
        with self._lock:
            self.sent += rows
            self.bytes += size
        future.add_done_callback(functools.partial(self._settle, rows))

    def _settle(self, rows: int, future: concurrent.futures.Future[None]) -> None:
        error = future.exception()
        with self._lock:
            self.settled += rows
            if error is not None:
                self.failed += rows
                if isinstance(error, Unroutable):
                    self.returned += rows
                    route = (error.message.exchange, error.message.routing_key)
                    if route in self.routes or len(self.routes) < _MAX_NAMED_ROUTES:
                        self.routes[route] = self.routes.get(route, 0) + rows
                if self.first_error is None:
                    self.first_error = error
            if self.settled == self.sent:
                self._lock.notify_all()

    def wait(self, deadline: float) -> bool:
        """Until every publish settled or ``deadline``; whether all settled."""
        with self._lock:
            while self.settled < self.sent:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True


def _failure(tally: _Tally, partition_id: int, exchange: str) -> PublishFailed:
    if tally.returned:
        routes = ", ".join(
            f"exchange {ex!r} routing key {key!r}: {count}"
            for (ex, key), count in tally.routes.items()
        )
        message = (
            f"rabbitmq write (partition {partition_id}): {tally.returned} row(s) were "
            f"unroutable (returned by the broker: no queue is bound for them) — {routes}. "
            "Bind a queue, fix the routing key, or set mandatory=false to let the broker "
            "drop unroutable rows"
        )
        logger.error("%s", message)
        return UnroutableRows(message, tally.returned, dict(tally.routes))
    error = tally.first_error
    message = (
        f"rabbitmq write (partition {partition_id}, exchange {exchange!r}): "
        f"{tally.failed} of {tally.sent} message(s) not confirmed: "
        f"{type(error).__name__}: {error}{_broker_reason(error)}"
    )
    logger.error("%s", message)
    return PublishFailed(message)


def _broker_reason(error: BaseException | None) -> str:
    """Why the broker closed the channel or connection that ``error`` came from, as text
    to append to a message (empty when it did not say).

    A publish whose channel the broker closed (a 403 on the exchange, a 406 ...) fails
    with an outcome that names only the channel's end; the broker's reply code and text
    are its ``__cause__``, which Spark does not show: the task's message must say them.
    """
    seen: set[int] = set()
    cause = error.__cause__ if error is not None else None
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ChannelClosed | ConnectionClosed) and cause.reply_code:
            what = "channel" if isinstance(cause, ChannelClosed) else "connection"
            return f" (the broker closed the {what}: {type(cause).__name__}: {cause})"
        cause = cause.__cause__
    return ""


def publish_rows(
    options: WriteOptions,
    rows: Iterable[Mapping[str, Any]],
    id_prefix: str,
    partition_id: int,
    attempt: int,
    counts: Counts | None = None,
) -> PublishResult:
    """Publish every row with pipelined confirms; raise :class:`PublishFailed` otherwise.

    ``message_id`` defaults to ``f"{id_prefix}:{index}"`` (deterministic per task, so a
    retried task publishes the same ids). Publishing stops at the first failed publish
    seen (returned, nacked, timed out), waits for the rest, and raises. What settled is
    added to ``counts`` either way. With ``superStream`` each row goes to the super
    stream's exchange with its partition's binding key (:mod:`rabbitry.spark._super`).

    Raises:
        UnroutableRows: rows were returned (``mandatory``).
        PublishFailed: anything else that kept a row from being confirmed.
    """
    with _job_context(options):
        if options.super_stream is None:
            fields: Iterator[Fields] = map(row_fields, rows)
        else:
            fields = routed_row_fields(options, rows)
        return _publish_rows(options, fields, id_prefix, partition_id, attempt, counts)


def publish_batches(
    options: WriteOptions,
    batches: Iterable[Any],
    id_prefix: str,
    partition_id: int,
    attempt: int,
    counts: Counts | None = None,
) -> PublishResult:
    """:func:`publish_rows` for the rows of Arrow record batches (Spark's Arrow writers).

    The same messages, ids and errors as for ``batch.to_pylist()`` rows; each column is
    taken from a batch once instead of building a dict per row.
    """
    with _job_context(options):
        if options.super_stream is None:
            fields = batch_fields(batches)
        else:
            fields = routed_batch_fields(options, batches)
        return _publish_rows(options, fields, id_prefix, partition_id, attempt, counts)


@contextlib.contextmanager
def _job_context(options: WriteOptions) -> Iterator[None]:
    """Make the job's trace context (options ``traceparent``/``tracestate``) current, so
    each row's ``publish`` span is its child (with :mod:`rabbitry.observability` on)."""
    if options.traceparent is None:
        yield
        return
    try:
        from opentelemetry import context
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
    except ImportError:
        raise ConfigurationError(
            "option traceparent: needs OpenTelemetry on the executors: pip install 'rabbitry[otel]'"
        ) from None
    carrier = {"traceparent": options.traceparent}
    if options.tracestate:
        carrier["tracestate"] = options.tracestate
    token = context.attach(TraceContextTextMapPropagator().extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


def _publish_rows(
    options: WriteOptions,
    rows: Iterator[Fields],
    id_prefix: str,
    partition_id: int,
    attempt: int,
    counts: Counts | None,
) -> PublishResult:
    conn = options.connect.connect(f" [spark writer p{partition_id}]")
    tally = _Tally()
    first_id: str | None = None
    last_id: str | None = None
    exchange = options.exchange
    try:
        if options.check_exchange and exchange:
            probe = conn.channel()
            try:
                probe.exchange_declare(exchange, passive=True)
            except NotFound:
                raise PublishFailed(
                    f"option exchange: exchange {exchange!r} does not exist"
                ) from None
            probe.close()
        publisher = conn.publisher(
            confirm=True,
            max_in_flight=options.max_in_flight,
            mandatory=options.mandatory,
            timeout=options.confirm_timeout,
        )
        routing_key = options.routing_key or ""
        mode = 2 if options.persistent else 1
        publish = publisher.publish
        track = tally.track
        try:
            if options.batch_records > 1:
                first_id, last_id = _publish_envelopes(options, rows, id_prefix, publisher, tally)
            for index, row in enumerate(rows if options.batch_records == 1 else ()):
                if tally.failed:
                    break
                body, to_exchange, key, props = fields_to_message(
                    row, routing_key, exchange, f"{id_prefix}:{index}", mode
                )
                if first_id is None:
                    first_id = props.message_id
                last_id = props.message_id
                track(
                    publish(body, exchange=to_exchange, routing_key=key, properties=props),
                    1,
                    len(body),
                )
        except PublishFailed:
            raise  # already says what failed (e.g. a row an envelope cannot carry)
        except AMQPError as exc:
            raise PublishFailed(
                f"rabbitmq write (partition {partition_id}): publishing failed after "
                f"{tally.sent} message(s): {type(exc).__name__}: {exc}{_broker_reason(exc)}"
            ) from exc
        if not tally.wait(time.monotonic() + options.confirm_timeout):
            raise PublishFailed(
                f"rabbitmq write (partition {partition_id}, exchange {exchange!r}): "
                f"{tally.sent - tally.settled} of {tally.sent} message(s) not confirmed "
                f"within {options.confirm_timeout:.0f} s (option confirmTimeoutMs)"
            )
        if tally.failed:
            raise _failure(tally, partition_id, exchange) from tally.first_error
        return PublishResult(
            partition_id, attempt, tally.sent, tally.sent, first_id, last_id, tally.bytes
        )
    finally:
        if counts is not None:
            counts.add(
                rows=tally.sent,
                bytes=tally.bytes,
                confirmed=tally.settled - tally.failed,
                nacked=tally.failed - tally.returned,
                unroutable=tally.returned,
            )
        with contextlib.suppress(Exception):
            conn.close(timeout=5)


_PER_ROW_COLUMNS = ("message_id", "headers", "properties")


def check_batch_columns(options: WriteOptions, columns: Iterable[str]) -> None:
    """Refuse per-row property columns in a write with ``batchRecords`` > 1 (driver side)."""
    if options.batch_records == 1:
        return
    per_row = [c for c in columns if c in _PER_ROW_COLUMNS]
    if per_row:
        raise ConfigurationError(
            f"option batchRecords: the rows of a batch envelope share its properties, so "
            f"the column(s) {', '.join(per_row)} cannot be written with batchRecords="
            f"{options.batch_records}; drop them or set batchRecords=1"
        )


def _publish_envelopes(
    options: WriteOptions,
    rows: Iterator[Fields],
    id_prefix: str,
    publisher: Any,
    tally: _Tally,
) -> tuple[str | None, str | None]:
    """``batchRecords`` > 1: consecutive rows of one target in batch envelopes.

    An envelope holds up to ``batchRecords`` rows and at most
    :data:`~rabbitry.batching_publisher.DEFAULT_BATCH_BYTES` of body (a larger row goes
    alone, as a plain message); its ``message_id`` is ``<id prefix>:<index of its first
    row>``, so a retried task sends the same envelopes with the same ids. Rows with a
    ``message_id``, ``headers`` or ``properties`` value are refused: the records of an
    envelope share its properties.
    """
    routing_key = options.routing_key or ""
    mode = 2 if options.persistent else 1
    limit = DEFAULT_BATCH_BYTES
    first_id: str | None = None
    last_id: str | None = None
    bodies: list[bytes] = []
    size = 0
    target: tuple[str, str] | None = None
    start = 0

    def send() -> None:
        nonlocal first_id, last_id
        message_id = f"{id_prefix}:{start}"
        first_id = first_id or message_id
        last_id = message_id
        assert target is not None
        if len(bodies) == 1:
            body, headers = bodies[0], None
        else:
            body, headers = encode_records(bodies), envelope_headers(None, len(bodies))
        props = BasicProperties(message_id=message_id, delivery_mode=mode, headers=headers)
        future = publisher.publish(
            body, exchange=target[0], routing_key=target[1], properties=props
        )
        tally.track(future, len(bodies), sum(len(body) for body in bodies))

    for index, row in enumerate(rows):
        if tally.failed:
            break
        for column, value in zip(_PER_ROW_COLUMNS, row[3:], strict=True):
            if value is not None:
                raise PublishFailed(
                    f"option batchRecords: row {index} has a {column!r} value, but the rows "
                    "of an envelope share its properties; drop the column or set "
                    "batchRecords=1"
                )
        body, to_exchange, key, _props = fields_to_message(
            row, routing_key, options.exchange, "", mode
        )
        where = (to_exchange, key)
        if bodies and (
            where != target or len(bodies) >= options.batch_records or size + 4 + len(body) > limit
        ):
            send()
            bodies, size = [], 0
        if not bodies:
            target, start = where, index
        bodies.append(body)
        size += 4 + len(body)
    if bodies and not tally.failed:
        send()
    return first_id, last_id
