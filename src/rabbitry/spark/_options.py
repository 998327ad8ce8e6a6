"""Options of the ``rabbitmq`` data source: parsing, validation and connecting.

The option names and the reader of the raw option map are in
:mod:`rabbitry.spark._option_map`.

Pure Python (no pyspark import), so it is unit-tested without Spark. Spark hands options
over as strings with lower-cased keys; every lookup here is case-insensitive and every
error names the option as documented (``maxMessagesPerBatch``, not ``maxmessagesperbatch``).
The parsed objects are frozen dataclasses of plain values: they pickle to executors
without sockets, and connections are opened from them per task (:meth:`ConnectOptions.connect`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import ssl
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote

from ..config import default_url, parse_urls
from ..exceptions import ConfigurationError, TopologyValidationError
from ..topology import SuperStream
from ._option_map import OPTION_NAMES as OPTION_NAMES
from ._option_map import OptionMap

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..sync.connection import Connection

__all__ = [
    "ConnectOptions",
    "ReadOptions",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
    "trace_options",
]

QueueType = Literal["classic", "quorum", "stream"]
ConsumeMode = Literal["requeue", "destructive"]


@dataclasses.dataclass(frozen=True)
class ConnectOptions:
    """How to reach the broker; a plain value object (the password is not in repr)."""

    urls: tuple[str, ...] = dataclasses.field(default_factory=lambda: (default_url(),), repr=False)
    connection_name: str | None = None
    heartbeat: int | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_verify: bool = True
    tls_server_name: str | None = None

    @property
    def uses_tls_options(self) -> bool:
        """Any TLS option was given."""
        return bool(
            self.tls_ca_file or self.tls_cert_file or self.tls_key_file or not self.tls_verify
        )

    def effective_urls(self) -> list[str]:
        """The URLs to connect to, with ``tlsServerName`` as their SNI when given."""
        if not self.tls_server_name:
            return list(self.urls)
        sni = f"server_name_indication={quote(self.tls_server_name, safe='')}"
        return [f"{url}{'&' if '?' in url else '?'}{sni}" for url in self.urls]

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context built from the options (in the calling process), or ``None``."""
        if not self.uses_tls_options:
            return None
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if not self.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def connect(self, suffix: str = "") -> Connection:
        """Open a new connection (the caller closes it).

        Args:
            suffix: appended to the connection name (which task, which role).

        Returns:
            The open connection.
        """
        from ..sync.connection import Connection

        name = self.connection_name or "rabbitry-spark"
        conn = Connection(
            self.effective_urls(),
            heartbeat=self.heartbeat,
            connection_name=f"{name}{suffix}",
            ssl_context=self.ssl_context(),
        )
        conn.connect(timeout=30)
        return conn


def _parse_connect(opts: OptionMap) -> ConnectOptions:
    # Without option url: $RABBITMQ_URL (read where the options are parsed, i.e. on the
    # driver; the parsed URL is what the executors use), else the local default.
    text = opts.text("url") or default_url()
    urls = tuple(part.strip() for part in text.replace(";", ",").split(",") if part.strip())
    if not urls:
        raise ConfigurationError("option url: at least one URL is required")
    try:
        params = parse_urls(list(urls))
    except ConfigurationError as exc:
        # The message of parse_urls names the field; it never contains the password.
        raise ConfigurationError(f"option url: {exc}") from None
    heartbeat = opts.opt_int("heartbeat", 0, 65535)
    result = ConnectOptions(
        urls=urls,
        connection_name=opts.text("connectionName"),
        heartbeat=heartbeat,
        tls_ca_file=opts.text("tlsCaFile"),
        tls_cert_file=opts.text("tlsCertFile"),
        tls_key_file=opts.text("tlsKeyFile"),
        tls_verify=opts.flag("tlsVerify", True),
        tls_server_name=opts.text("tlsServerName"),
    )
    if result.tls_server_name:
        try:
            parse_urls(result.effective_urls())
        except ConfigurationError as exc:
            raise ConfigurationError(f"option tlsServerName: {exc}") from None
    for option, path in (
        ("tlsCaFile", result.tls_ca_file),
        ("tlsCertFile", result.tls_cert_file),
        ("tlsKeyFile", result.tls_key_file),
    ):
        # Paths are checked on the driver only when they exist there; executors may
        # have them at the same path without the driver having them.
        if path is not None and not path.strip():
            raise ConfigurationError(f"option {option}: empty path")
    if result.tls_key_file and not result.tls_cert_file:
        raise ConfigurationError("option tlsKeyFile: requires tlsCertFile")
    if (result.uses_tls_options or result.tls_server_name) and not all(p.use_tls for p in params):
        raise ConfigurationError(
            "option tlsCaFile/tlsCertFile/tlsKeyFile/tlsVerify/tlsServerName: "
            "TLS options need amqps:// URLs in option url"
        )
    return result


#: Which option a field of :class:`~rabbitry.topology.SuperStream` comes from.
_LAYOUT_OPTIONS = {"partitions": "superStreamPartitions", "binding_keys": "superStreamBindingKeys"}


def _parse_super_stream(opts: OptionMap) -> SuperStream | None:
    """Options ``superStream``, ``superStreamPartitions``, ``superStreamBindingKeys``."""
    name = opts.text("superStream")
    count = opts.opt_int("superStreamPartitions", 1, 100_000)
    keys_text = opts.text("superStreamBindingKeys")
    if name is None:
        for option, value in (
            ("superStreamPartitions", count),
            ("superStreamBindingKeys", keys_text),
        ):
            if value is not None:
                raise ConfigurationError(f"option {option}: needs option superStream")
        return None
    if count is None and keys_text is None:
        raise ConfigurationError(
            "option superStreamPartitions: required with superStream (or give its binding "
            "keys in superStreamBindingKeys): AMQP 0-9-1 cannot list a super stream's "
            "partitions"
        )
    keys = None if keys_text is None else [key.strip() for key in keys_text.split(",")]
    try:
        return SuperStream(name.strip(), count, binding_keys=keys)
    except TopologyValidationError as exc:
        option = next(
            (o for f, o in _LAYOUT_OPTIONS.items() if exc.field.startswith(f)), "superStream"
        )
        raise ConfigurationError(f"option {option}: {exc.field}: {exc.rule}") from None


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Validated options of a read (batch or streaming).

    A super stream read (option ``superStream``) has ``queue`` set to the super stream's
    name and reads the stream queues of ``super_stream``; :meth:`for_stream` gives the
    options of one of them.
    """

    connect: ConnectOptions
    queue: str
    queue_type: QueueType = "classic"
    prefetch: int = 2000
    max_messages_per_batch: int = 1000
    max_records_per_trigger: int = 100_000
    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"
    num_partitions: int = 1
    poll_timeout: float = 1.0
    idle_timeout: float = 0.2
    fail_on_data_loss: bool = True
    max_messages: int | None = None
    consume: ConsumeMode = "requeue"
    accept_delivery_count: bool = False
    exclusive_wait: float = 600.0
    #: Batch reads of quorum queues: the queue's delivery limit as the user states it.
    delivery_limit: int | None = None
    #: Batch reads of quorum queues: the management API to read the delivery limit from.
    management_url: str | None = dataclasses.field(default=None, repr=False)
    max_batch_wait: float = 1.0
    #: Classic/quorum streaming: seconds a lost broker is waited for (``recoveryTimeoutMs``).
    recovery_timeout: float = 300.0
    otel: bool = False
    super_stream: SuperStream | None = None
    #: ``startingOffsets`` per partition queue, where a JSON object gives them.
    partition_offsets: tuple[tuple[str, str], ...] = ()

    @property
    def streams(self) -> tuple[str, ...]:
        """The stream queues read: a super stream's partitions, or ``(queue,)``."""
        if self.super_stream is not None:
            return self.super_stream.queues
        return (self.queue,)

    def for_stream(self, stream: str) -> ReadOptions:
        """The options of a read of one stream queue of this read.

        Args:
            stream: one of :attr:`streams`.

        Returns:
            These options with ``queue`` set to ``stream`` and its ``startingOffsets``.
        """
        if stream == self.queue and self.super_stream is None:
            return self
        starting = dict(self.partition_offsets).get(stream, self.starting_offsets)
        return dataclasses.replace(
            self, queue=stream, starting_offsets=starting, super_stream=None, partition_offsets=()
        )


def _offset_spec(name: str, text: str, allowed: tuple[str, ...]) -> str:
    value = text.strip().lower()
    if value in allowed:
        return value
    if value.startswith("timestamp:") and "earliest" in allowed:
        try:
            int(value.split(":", 1)[1])
        except ValueError:
            raise ConfigurationError(
                f"option {name}: timestamp:<epoch seconds> expected, got {text!r}"
            ) from None
        return value
    try:
        number = int(value)
    except ValueError:
        raise ConfigurationError(
            f"option {name}: must be {', '.join(allowed)} or an offset (integer ≥ 0), got {text!r}"
        ) from None
    if number < 0:
        raise ConfigurationError(f"option {name}: offset must be ≥ 0, got {number}")
    return str(number)


def _partition_offsets(text: str, layout: SuperStream | None) -> tuple[tuple[str, str], ...]:
    """``startingOffsets`` as a JSON object: ``{"<partition queue>": offset spec}``."""
    name = "startingOffsets"
    if layout is None:
        raise ConfigurationError(
            f"option {name}: offsets per partition (a JSON object) need option superStream"
        )
    try:
        given = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"option {name}: not a JSON object: {exc}") from None
    if not isinstance(given, dict):
        raise ConfigurationError(f"option {name}: not a JSON object: {text!r}")
    unknown = sorted(set(given) - set(layout.queues))
    if unknown:
        raise ConfigurationError(
            f"option {name}: {', '.join(map(repr, unknown))} is not a partition of super "
            f"stream {layout.name!r} (its partitions: {', '.join(layout.queues)})"
        )
    result = []
    for queue, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ConfigurationError(
                f"option {name}: {queue!r}: an offset or a name, got {value!r}"
            )
        spec = _offset_spec(f"{name} ({queue!r})", str(value), ("earliest", "latest"))
        result.append((queue, spec))
    return tuple(result)


def parse_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Validate the options of a read; raises ``ConfigurationError`` naming the option."""
    opts = OptionMap(options)
    connect = _parse_connect(opts)
    layout = _parse_super_stream(opts)
    if layout is None:
        queue = opts.required("queue")
    elif opts.text("queue") is not None:
        raise ConfigurationError(
            "option queue: not with superStream (the super stream's partitions are read)"
        )
    else:
        queue = layout.name
        kind = (opts.text("queueType", "stream") or "").strip().lower()
        if kind != "stream":
            raise ConfigurationError(
                f"option queueType: a super stream's partitions are streams, got {kind!r}"
            )
    queue_type = (opts.text("queueType", "classic") or "classic").strip().lower()
    if layout is not None:
        queue_type = "stream"
    if queue_type not in ("classic", "quorum", "stream"):
        raise ConfigurationError(
            f"option queueType: must be classic, quorum or stream, got {queue_type!r}"
        )
    max_batch = opts.integer("maxMessagesPerBatch", 1000, 1, 10_000_000)
    default_prefetch = min(65535, max(2 * max_batch, 1000))
    prefetch = opts.integer("prefetch", default_prefetch, 1, 65535)
    if queue_type != "stream" and prefetch < max_batch:
        raise ConfigurationError(
            f"option prefetch ({prefetch}) must be ≥ maxMessagesPerBatch ({max_batch}): "
            "deliveries are acknowledged only after Spark commits the batch, so a smaller "
            "prefetch could never fill a batch (2 × maxMessagesPerBatch is recommended)"
        )
    starting_text = opts.text("startingOffsets", "earliest") or ""
    partition_offsets: tuple[tuple[str, str], ...] = ()
    if starting_text.strip().startswith("{"):
        partition_offsets = _partition_offsets(starting_text, layout)
        starting_text = "earliest"
    starting = _offset_spec("startingOffsets", starting_text, ("earliest", "latest"))
    ending = _offset_spec("endingOffsets", opts.text("endingOffsets", "latest") or "", ("latest",))
    if queue_type != "stream":
        for name in ("startingOffsets", "endingOffsets"):
            if opts.text(name) is not None:
                raise ConfigurationError(
                    f"option {name}: only for queueType=stream (a {queue_type} queue has "
                    "no offsets)"
                )
    consume = (opts.text("consume", "requeue") or "requeue").strip().lower()
    if consume not in ("requeue", "destructive"):
        raise ConfigurationError(
            f"option consume: must be requeue (batch reads leave the queue as it was) or "
            f"destructive (batch reads acknowledge what they read), got {consume!r}"
        )
    num_partitions = opts.integer("numPartitions", 1, 1, 1024)
    if starting.isdigit() and ending.isdigit() and int(ending) < int(starting):
        raise ConfigurationError(
            f"option endingOffsets ({ending}) must be ≥ startingOffsets ({starting})"
        )
    return ReadOptions(
        connect=connect,
        queue=queue,
        queue_type=queue_type,  # type: ignore[arg-type]  # checked above
        prefetch=prefetch,
        max_messages_per_batch=max_batch,
        max_records_per_trigger=opts.integer("maxRecordsPerTrigger", 100_000, 1, 2**31 - 1),
        starting_offsets=starting,
        ending_offsets=ending,
        num_partitions=num_partitions,
        poll_timeout=opts.integer("pollTimeoutMs", 1000, 1, 3_600_000) / 1000.0,
        idle_timeout=opts.integer("idleTimeoutMs", 200, 1, 3_600_000) / 1000.0,
        fail_on_data_loss=opts.flag("failOnDataLoss", True),
        max_messages=opts.opt_int("maxMessages", 0),
        consume=consume,  # type: ignore[arg-type]  # checked above
        accept_delivery_count=opts.flag("acceptDeliveryCount", False),
        exclusive_wait=opts.integer("exclusiveWaitMs", 600_000, 0, 86_400_000) / 1000.0,
        delivery_limit=opts.opt_int("deliveryLimit", -1),
        management_url=opts.text("managementUrl") or None,
        max_batch_wait=opts.integer("maxBatchWaitMs", 1000, 1, 3_600_000) / 1000.0,
        recovery_timeout=opts.integer("recoveryTimeoutMs", 300_000, 0, 86_400_000) / 1000.0,
        otel=opts.flag("otel", False),
        super_stream=layout,
        partition_offsets=partition_offsets,
    )


@dataclasses.dataclass(frozen=True)
class WriteOptions:
    """Validated options of a write (batch or streaming)."""

    connect: ConnectOptions
    exchange: str = ""
    routing_key: str | None = None
    max_in_flight: int = 1000
    confirm_timeout: float = 30.0
    mandatory: bool = True
    job_id: str | None = None
    persistent: bool = True
    check_exchange: bool = True
    batch_records: int = 1
    otel: bool = False
    traceparent: str | None = None
    tracestate: str | None = None
    #: Option ``superStream``: rows go to its partitions (``exchange`` is its name).
    super_stream: SuperStream | None = None
    #: Option ``partitionKeyColumn``: the column hashed to pick a row's partition.
    partition_key_column: str | None = None


def trace_options() -> dict[str, str]:
    """Write options that carry the current OpenTelemetry trace context to the executors.

    Spark runs the sink's tasks in other processes, where the driver's current span is
    unknown; with these options each row's ``publish`` span is a child of it::

        with tracer.start_as_current_span("nightly export"):
            df.write.format("rabbitmq").options(**trace_options()) ... .save()

    Returns:
        ``otel`` (``"true"``: instrument the executors' publishers with their global
        providers) and, when a span is current, ``traceparent`` and ``tracestate``.

    Raises:
        ConfigurationError: OpenTelemetry is not installed (``rabbitry[otel]``).
    """
    try:
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
    except ImportError:
        raise ConfigurationError(
            "trace_options() needs OpenTelemetry: pip install 'rabbitry[otel]'"
        ) from None
    # The options carry the W3C format, whatever propagator is configured globally.
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    options = {"otel": "true"}
    for key in ("traceparent", "tracestate"):
        if carrier.get(key):
            options[key] = carrier[key]
    return options


# W3C trace context: version 00, a trace id and a parent id that are not all zeros.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def _trace_context(opts: OptionMap) -> tuple[str | None, str | None]:
    """The ``traceparent`` and ``tracestate`` options, checked (W3C trace context)."""
    traceparent = opts.text("traceparent")
    tracestate = opts.text("tracestate")
    if traceparent is None:
        if tracestate is not None:
            raise ConfigurationError("option tracestate: needs option traceparent")
        return None, None
    traceparent = traceparent.strip()
    if _TRACEPARENT.fullmatch(traceparent) is None:
        raise ConfigurationError(
            "option traceparent: must be a W3C traceparent "
            f"'00-<32 hex digits>-<16 hex digits>-<2 hex digits>' (ids not all zeros), "
            f"got {traceparent!r}"
        )
    if tracestate is not None and len(tracestate) > 512:
        raise ConfigurationError("option tracestate: longer than 512 characters")
    return traceparent, tracestate


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Validate the options of a write; raises ``ConfigurationError`` naming the option."""
    opts = OptionMap(options)
    connect = _parse_connect(opts)
    exchange = opts.text("exchange", "") or ""
    if len(exchange.encode()) > 255:
        raise ConfigurationError("option exchange: longer than 255 bytes")
    routing_key = opts.text("routingKey")
    if routing_key is not None and len(routing_key.encode()) > 255:
        raise ConfigurationError("option routingKey: longer than 255 bytes")
    layout = _parse_super_stream(opts)
    key_column = opts.text("partitionKeyColumn")
    if key_column is not None:
        key_column = key_column.strip()
        if not key_column:
            raise ConfigurationError("option partitionKeyColumn: empty")
        if layout is None:
            raise ConfigurationError("option partitionKeyColumn: needs option superStream")
    if layout is not None:
        for option, value in (("exchange", opts.text("exchange")), ("routingKey", routing_key)):
            if value is not None:
                raise ConfigurationError(
                    f"option {option}: not with superStream (rows go to the super stream's "
                    "exchange with the binding key of their partition)"
                )
        exchange = layout.name
    traceparent, tracestate = _trace_context(opts)
    return WriteOptions(
        connect=connect,
        exchange=exchange,
        routing_key=routing_key,
        max_in_flight=opts.integer("maxInFlight", 1000, 1, 1_000_000),
        confirm_timeout=opts.integer("confirmTimeoutMs", 30_000, 1, 86_400_000) / 1000.0,
        mandatory=opts.flag("mandatory", True),
        job_id=opts.text("jobId"),
        persistent=opts.flag("persistent", True),
        check_exchange=opts.flag("checkExchange", True),
        batch_records=opts.integer("batchRecords", 1, 1, 10_000),
        otel=opts.flag("otel", False),
        traceparent=traceparent,
        tracestate=tracestate,
        super_stream=layout,
        partition_key_column=key_column,
    )


def tls_paths_exist(connect: ConnectOptions) -> list[str]:
    """Names of TLS file options whose path does not exist in this process."""
    missing = []
    for option, path in (
        ("tlsCaFile", connect.tls_ca_file),
        ("tlsCertFile", connect.tls_cert_file),
        ("tlsKeyFile", connect.tls_key_file),
    ):
        if path and not os.path.isfile(path):
            missing.append(option)
    return missing
