"""Row schema of reads, message → row conversion, and row → message for writes.

Pure Python (no pyspark or pyarrow import). Read rows are tuples in the order of
:data:`READ_SCHEMA`; the readers build the same rows column by column as Arrow batches
(:mod:`rabbitry.spark._arrow`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..batching import BatchRecord, is_envelope, unpack
from ..exceptions import ConfigurationError
from ..protocol.spec import BasicProperties

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ..protocol.message import Message

__all__ = [
    "PROPERTY_FIELDS",
    "READ_SCHEMA",
    "WRITE_COLUMNS",
    "RowSink",
    "TupleRows",
    "check_write_columns",
    "fields_to_message",
    "message_records",
    "message_rows",
    "message_to_row",
    "row_fields",
    "row_message_id",
    "row_to_message",
]

# content_type ... app_id: the basic properties besides headers, message_id, timestamp
# (own columns) and the deprecated cluster_id.
PROPERTY_FIELDS: tuple[tuple[str, str], ...] = (
    ("content_type", "STRING"),
    ("content_encoding", "STRING"),
    ("delivery_mode", "INT"),
    ("priority", "INT"),
    ("correlation_id", "STRING"),
    ("reply_to", "STRING"),
    ("expiration", "STRING"),
    ("type", "STRING"),
    ("user_id", "STRING"),
    ("app_id", "STRING"),
)

READ_SCHEMA = (
    "body BINARY, routing_key STRING, exchange STRING, queue STRING, offset BIGINT, "
    "delivery_tag BIGINT, redelivered BOOLEAN, delivery_count INT, message_id STRING, "
    "timestamp TIMESTAMP, headers MAP<STRING, STRING>, properties STRUCT<"
    + ", ".join(f"{name}: {kind}" for name, kind in PROPERTY_FIELDS)
    + ">"
)

# Columns a write accepts; ``body`` or ``value`` is required.
WRITE_COLUMNS = ("body", "value", "routing_key", "exchange", "message_id", "headers", "properties")


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)


def headers_to_map(headers: Mapping[str, Any] | None) -> dict[str, str] | None:
    """Header table → map<string,string>: nested tables and arrays become JSON."""
    if not headers:
        return None
    return {
        key: value if type(value) is str else _text(value)
        for key, value in headers.items()
        if value is not None
    }


def row_message_id(message: Message) -> str | None:
    """The ``message_id`` of a message's row.

    A record of a batch envelope gets ``<envelope's message_id>:<record's index>``
    (from 0): the records of an envelope share its properties, so each needs an id of
    its own to be told apart, and a redelivered envelope gives its records the same ids
    again. ``None`` when the envelope has no ``message_id``.
    """
    message_id = message.properties.message_id
    if message_id is not None and isinstance(message, BatchRecord):
        return f"{message_id}:{message.index}"
    return message_id


def message_to_row(
    message: Message, queue: str, offset: int, *, stream_offset: bool = False
) -> tuple[Any, ...]:
    """One delivery as a row tuple of :data:`READ_SCHEMA`."""
    props = message.properties
    headers = props.headers
    delivery_count = None
    if headers:
        count = headers.get("x-delivery-count")
        if isinstance(count, int):
            delivery_count = count
        if stream_offset:
            found = headers.get("x-stream-offset")
            if isinstance(found, int):
                offset = found
    timestamp = props.timestamp
    if isinstance(timestamp, int):
        timestamp = datetime.fromtimestamp(timestamp, UTC)
    return (
        message.body,
        message.routing_key,
        message.exchange,
        queue,
        offset,
        message.delivery_tag,
        message.redelivered,
        delivery_count,
        row_message_id(message),
        timestamp,
        headers_to_map(headers),
        tuple(getattr(props, name) for name, _ in PROPERTY_FIELDS),
    )


def _no_settle(how: str, **options: object) -> None:
    return None  # the source acknowledges envelopes by delivery tag itself


def message_records(message: Message) -> list[Message]:
    """The messages whose rows a delivery gives: itself, or the records of an envelope.

    The records of an envelope (``springBatchFormat`` header, see
    :mod:`rabbitry.batching`) carry the envelope's ``delivery_tag``, ``redelivered`` flag
    and properties (without the batch headers); their rows' ``message_id`` is
    :func:`row_message_id`.

    Raises:
        BatchFormatError: an envelope of an unknown format, or a malformed one.
    """
    if not is_envelope(message):
        return [message]
    return list(unpack(message, _no_settle))


def message_rows(
    message: Message, queue: str, offset: int, *, consecutive: bool = False
) -> list[tuple[Any, ...]]:
    """The rows of one delivery: one, or one per record of a batch envelope.

    The records of an envelope (``springBatchFormat`` header, see
    :mod:`rabbitry.batching`) get the envelope's ``delivery_tag`` and properties (without
    the batch headers), a ``message_id`` each (:func:`row_message_id`), and the envelope's
    ``offset`` (a message position), or
    with ``consecutive`` one offset each from ``offset`` on (a row count).

    Raises:
        BatchFormatError: an envelope of an unknown format, or a malformed one.
    """
    if not is_envelope(message):
        return [message_to_row(message, queue, offset)]
    step = 1 if consecutive else 0
    return [
        message_to_row(record, queue, offset + index * step)
        for index, record in enumerate(message_records(message))
    ]


class RowSink(Protocol):
    """Where a reader puts the rows of its deliveries (tuples or Arrow columns)."""

    def add(self, message: Message, offset: int, *, consecutive: bool = False) -> int:
        """Add the rows of ``message`` (see :func:`message_rows`); how many."""
        ...


class TupleRows:
    """A :class:`RowSink` that keeps row tuples (:func:`message_rows`) in ``rows``."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.rows: list[tuple[Any, ...]] = []

    def add(self, message: Message, offset: int, *, consecutive: bool = False) -> int:
        """Add the rows of ``message``; how many."""
        rows = message_rows(message, self.queue, offset, consecutive=consecutive)
        self.rows.extend(rows)
        return len(rows)


def check_write_columns(columns: Iterable[str]) -> None:
    """Refuse a write schema with unknown columns or without a body column."""
    names = [name.lower() for name in columns]
    unknown = [name for name in names if name not in WRITE_COLUMNS]
    if unknown:
        raise ConfigurationError(
            f"format 'rabbitmq' write: unknown column(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(WRITE_COLUMNS)} (select or drop columns first)"
        )
    if "body" not in names and "value" not in names:
        raise ConfigurationError(
            "format 'rabbitmq' write: a column 'body' (or 'value'), binary or string, is required"
        )
    if "body" in names and "value" in names:
        raise ConfigurationError("format 'rabbitmq' write: give either 'body' or 'value', not both")


def _as_dict(value: Any) -> dict[str, Any] | None:
    """A Spark map / struct value as a dict (Row, dict, or Arrow's list of pairs)."""
    if value is None:
        return None
    if isinstance(value, dict):
        return value
    as_dict = getattr(value, "asDict", None)
    if as_dict is not None:
        return dict(as_dict())
    if isinstance(value, list):
        return dict(value)
    raise ConfigurationError(f"format 'rabbitmq' write: expected a map or struct, got {value!r}")


def row_fields(row: Mapping[str, Any]) -> tuple[Any, Any, Any, Any, Any, Any]:
    """A write row's values: ``(body or value, routing_key, exchange, message_id,
    headers, properties)``, ``None`` where the row has none."""
    body = row.get("body")
    if body is None:
        body = row.get("value")
    get = row.get
    return (
        body,
        get("routing_key"),
        get("exchange"),
        get("message_id"),
        get("headers"),
        get("properties"),
    )


def row_to_message(
    row: Mapping[str, Any],
    default_routing_key: str,
    default_exchange: str,
    message_id: str,
    delivery_mode: int = 2,
) -> tuple[bytes, str, str, BasicProperties]:
    """A write row → (body, exchange, routing key, properties).

    ``message_id`` is used when the row has no ``message_id`` value.
    """
    return fields_to_message(
        row_fields(row), default_routing_key, default_exchange, message_id, delivery_mode
    )


def fields_to_message(
    fields: tuple[Any, Any, Any, Any, Any, Any],
    default_routing_key: str,
    default_exchange: str,
    message_id: str,
    delivery_mode: int = 2,
) -> tuple[bytes, str, str, BasicProperties]:
    """A write row's values (:func:`row_fields`) → (body, exchange, routing key,
    properties).

    ``message_id`` is used when the row has no ``message_id`` value.
    """
    body, row_key, row_exchange, row_id, row_headers, row_properties = fields
    if body is None:
        raise ConfigurationError("format 'rabbitmq' write: a row has a null body")
    if isinstance(body, str):
        body = body.encode()
    elif not isinstance(body, bytes):
        body = bytes(body)
    routing_key = row_key or default_routing_key
    exchange = row_exchange
    if exchange is None:
        exchange = default_exchange
    values: dict[str, Any] = {}
    extra = _as_dict(row_properties)
    if extra:
        for name, _ in PROPERTY_FIELDS:
            value = extra.get(name)
            if value is not None:
                values[name] = value
        for name in ("timestamp", "message_id", "cluster_id"):
            if extra.get(name) is not None:
                values[name] = extra[name]
    headers = _as_dict(row_headers)
    if headers:
        values["headers"] = headers
    values["message_id"] = row_id or values.get("message_id") or message_id
    if "delivery_mode" not in values:
        values["delivery_mode"] = delivery_mode
    return body, exchange, routing_key, BasicProperties(**values)
