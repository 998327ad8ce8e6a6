"""Read rows as Arrow record batches, and write rows taken from Arrow record batches.

Reads: :class:`ArrowRows` collects deliveries and builds each column of
:data:`~rabbitry.spark._rows.READ_SCHEMA` with one ``pyarrow.array`` call from the list
of its values (the bodies as one binary array), instead of a Python tuple per row that
Spark then converts value by value. The values are those of
:func:`~rabbitry.spark._rows.message_to_row`. Batches are bounded in rows and body
bytes, so a large micro-batch is handed to Spark in pieces.

Writes: :func:`batch_fields` turns a record batch into the values of each row, one
``to_pylist`` per column instead of a dict per row.

Needs pyarrow (part of the ``spark`` extra), not pyspark.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..batching import is_envelope
from ._rows import PROPERTY_FIELDS, headers_to_map, message_records, row_message_id

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from ..protocol.message import Message

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_ROWS", "READ_ARROW_SCHEMA", "ArrowRows", "batch_fields"]

#: The most rows in one record batch of a read (Spark's own default Arrow batch size).
MAX_BATCH_ROWS = 10_000
#: A record batch of a read is closed once its bodies reach this many bytes.
MAX_BATCH_BYTES = 32 * 1024 * 1024

_PROPERTIES = pa.struct(
    [
        pa.field(name, pa.string() if kind == "STRING" else pa.int32())
        for name, kind in PROPERTY_FIELDS
    ]
)

#: :data:`~rabbitry.spark._rows.READ_SCHEMA` as Spark converts it to Arrow (UTC).
READ_ARROW_SCHEMA = pa.schema(
    [
        ("body", pa.binary()),
        ("routing_key", pa.string()),
        ("exchange", pa.string()),
        ("queue", pa.string()),
        ("offset", pa.int64()),
        ("delivery_tag", pa.int64()),
        ("redelivered", pa.bool_()),
        ("delivery_count", pa.int32()),
        ("message_id", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.map_(pa.string(), pa.string())),
        ("properties", _PROPERTIES),
    ]
)

_PROPERTY_GETTERS = [
    (attrgetter(name), _PROPERTIES.field(name).type) for name, _ in PROPERTY_FIELDS
]
_BODY = attrgetter("body")
_PROPS = attrgetter("properties")


def _delivery_count(headers: Any) -> int | None:
    if not headers:
        return None
    count = headers.get("x-delivery-count")
    return count if isinstance(count, int) else None


def _timestamp(value: Any) -> datetime | None:
    """A timestamp property as :func:`~rabbitry.spark._rows.message_to_row` gives it, in
    UTC as Spark converts a row's timestamp (a naive datetime is local time)."""
    if value is None:
        return None
    if isinstance(value, int):
        return datetime.fromtimestamp(value, UTC)
    if value.tzinfo is UTC:
        return value  # type: ignore[no-any-return]
    return value.astimezone(UTC)  # type: ignore[no-any-return]


class ArrowRows:
    """Rows of :data:`~rabbitry.spark._rows.READ_SCHEMA` as ``pyarrow.RecordBatch``.

    :meth:`add` takes a delivery (a :class:`~rabbitry.spark._rows.RowSink`); once the
    pending rows reach ``max_rows`` or their bodies ``max_bytes``, they become a batch
    that :meth:`ready` hands out (a delivery's rows are never split between batches).
    :meth:`finish` hands out the rest. ``rows``, ``bytes`` and ``redelivered`` count
    everything added.
    """

    def __init__(
        self, queue: str, max_rows: int = MAX_BATCH_ROWS, max_bytes: int = MAX_BATCH_BYTES
    ) -> None:
        self.queue = queue
        self.max_rows = max(1, max_rows)
        self.max_bytes = max_bytes
        self._messages: list[Message] = []
        self._offsets: list[int] = []
        self._size = 0
        self._done: list[Any] = []
        #: Rows added so far.
        self.rows = 0
        #: Body bytes of the rows added so far.
        self.bytes = 0
        #: Rows added so far that the broker had delivered before.
        self.redelivered = 0

    def add(self, message: Message, offset: int, *, consecutive: bool = False) -> int:
        """Add the rows of a delivery (one per record of an envelope); how many.

        Args:
            message: the delivery.
            offset: its row's ``offset`` (an envelope's records share it, or with
                ``consecutive`` count up from it).
            consecutive: give the records of an envelope one offset each.

        Raises:
            BatchFormatError: an envelope of an unknown format, or a malformed one.
        """
        if is_envelope(message):
            records = message_records(message)
            step = 1 if consecutive else 0
            size = 0
            for index, record in enumerate(records):
                self._messages.append(record)
                self._offsets.append(offset + index * step)
                size += len(record.body)
            count = len(records)
        else:
            self._messages.append(message)
            self._offsets.append(offset)
            size = len(message.body)
            count = 1
        self.rows += count
        self.bytes += size
        if message.redelivered:
            self.redelivered += count
        self._size += size
        if len(self._messages) >= self.max_rows or self._size >= self.max_bytes:
            self._done.append(self._build())
        return count

    def ready(self) -> list[Any]:
        """The batches completed so far (each handed out once)."""
        done, self._done = self._done, []
        return done

    def finish(self) -> list[Any]:
        """The completed batches and the pending rows as a last one."""
        if self._messages:
            self._done.append(self._build())
        return self.ready()

    def _build(self) -> Any:
        messages, offsets = self._messages, self._offsets
        self._messages, self._offsets, self._size = [], [], 0
        count = len(messages)
        props = list(map(_PROPS, messages))
        headers = [p.headers for p in props]
        properties = pa.StructArray.from_arrays(
            [pa.array(list(map(getter, props)), kind) for getter, kind in _PROPERTY_GETTERS],
            fields=list(_PROPERTIES),
        )
        columns = [
            pa.array(list(map(_BODY, messages)), pa.binary()),
            pa.array([m.routing_key for m in messages], pa.string()),
            pa.array([m.exchange for m in messages], pa.string()),
            pa.repeat(pa.scalar(self.queue, pa.string()), count),
            pa.array(offsets, pa.int64()),
            pa.array([m.delivery_tag for m in messages], pa.int64()),
            pa.array([m.redelivered for m in messages], pa.bool_()),
            pa.array(list(map(_delivery_count, headers)), pa.int32()),
            pa.array(list(map(row_message_id, messages)), pa.string()),
            pa.array([_timestamp(p.timestamp) for p in props], READ_ARROW_SCHEMA.field(9).type),
            pa.array(list(map(headers_to_map, headers)), READ_ARROW_SCHEMA.field(10).type),
            properties,
        ]
        return pa.RecordBatch.from_arrays(columns, schema=READ_ARROW_SCHEMA)


#: The columns :func:`batch_fields` reads, in the order of
#: :func:`~rabbitry.spark._rows.row_fields` (``body`` falls back to ``value``).
_WRITE_FIELDS = ("routing_key", "exchange", "message_id", "headers", "properties")


def batch_fields(batches: Iterable[Any]) -> Iterator[tuple[Any, Any, Any, Any, Any, Any]]:
    """The rows of write record batches as :func:`~rabbitry.spark._rows.row_fields` gives
    them for ``batch.to_pylist()`` rows, taking each column with one ``to_pylist``."""
    for batch in batches:
        names = batch.schema.names
        count = batch.num_rows
        columns: list[Iterable[Any]] = [
            batch.column(name).to_pylist() if name in names else repeat(None, count)
            for name in ("body", *_WRITE_FIELDS)
        ]
        if "value" in names:
            values = batch.column("value").to_pylist()
            columns[0] = [v if b is None else b for b, v in zip(columns[0], values, strict=True)]
        yield from zip(*columns, strict=False)
