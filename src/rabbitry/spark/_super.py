"""Super streams in the data source, without pyspark: routing written rows to partitions,
and sharing a read's limit between the partitions.

Writes (option ``superStream``): each row is published to the super stream's exchange
with the binding key of its partition: the partition hash routing picks for the value of
the column ``partitionKeyColumn`` (:func:`~rabbitry.topology.partition_for`, as the
stream clients do), or the index given in the column ``partition``.

Reads: each partition is a stream queue read as a single stream is
(:class:`~rabbitry.spark.datasource.StreamQueueReader`); :func:`share_limit` splits a
micro-batch's row limit between them and :func:`per_stream` runs a probe on every
partition at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import ConfigurationError, NotFound
from ..topology import partition_for
from ._arrow import batch_fields
from ._rows import check_write_columns, row_fields

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from ..topology import SuperStream
    from ._options import ConnectOptions, ReadOptions, WriteOptions

__all__ = [
    "PARTITION_COLUMN",
    "check_partition_count",
    "check_routing_type",
    "check_write_schema",
    "per_stream",
    "routed_batch_fields",
    "routed_row_fields",
    "share_limit",
]

#: The write column that gives a row's partition by its index (0 .. N-1).
PARTITION_COLUMN = "partition"

Fields = tuple[Any, Any, Any, Any, Any, Any]
T = TypeVar("T")


def check_write_schema(options: WriteOptions, columns: Iterable[str]) -> None:
    """Refuse a write schema the options cannot publish (driver side).

    With ``superStream`` the rows need exactly one way to their partition: the column
    named by ``partitionKeyColumn``, or a ``partition`` column. That column is not
    published; ``exchange`` and ``routing_key`` columns are refused (the partition
    decides both), unless ``routing_key`` is the partition key column.

    Raises:
        ConfigurationError: naming the option or column and the rule.
    """
    names = list(columns)
    layout = options.super_stream
    if layout is None:
        check_write_columns(names)
        return
    lowered = {name.lower() for name in names}
    key_column = options.partition_key_column
    has_partition = PARTITION_COLUMN in lowered
    if key_column is not None and key_column.lower() not in lowered:
        raise ConfigurationError(
            f"option partitionKeyColumn: the rows have no column {key_column!r} "
            f"(columns: {', '.join(names)})"
        )
    if key_column is not None and has_partition and key_column.lower() != PARTITION_COLUMN:
        raise ConfigurationError(
            f"option partitionKeyColumn: the rows also have a {PARTITION_COLUMN!r} column; "
            "give one way to the partition (drop that column or the option)"
        )
    if key_column is None and not has_partition:
        raise ConfigurationError(
            f"option superStream: give option partitionKeyColumn (rows go to the partition "
            f"the hash of that column picks) or a {PARTITION_COLUMN!r} column (the "
            f"partition's index, 0..{layout.partitions - 1})"
        )
    routing = (key_column or PARTITION_COLUMN).lower()
    for fixed in ("exchange", "routing_key"):
        if fixed in lowered and fixed != routing:
            raise ConfigurationError(
                f"option superStream: the column {fixed!r} cannot be written (rows go to the "
                "super stream's exchange with their partition's binding key)"
            )
    check_write_columns([name for name in names if name.lower() != routing])


_INTEGER_TYPES = ("tinyint", "smallint", "int", "bigint")
_KEY_TYPES = ("string", "binary", *_INTEGER_TYPES)


def check_routing_type(options: WriteOptions, types: Mapping[str, str]) -> None:
    """Refuse a routing column whose Spark type no row of it could route (driver side).

    Args:
        options: the write.
        types: each column's Spark type, as ``DataType.simpleString()`` gives it.

    Raises:
        ConfigurationError: the ``partition`` column is not an integer column, or the
            ``partitionKeyColumn`` column is not a string, binary or integer column.
            Without the check, the first row failed its task.
    """
    if options.super_stream is None:
        return
    lowered = {name.lower(): kind for name, kind in types.items()}
    key_column = options.partition_key_column
    if key_column is None:
        kind = lowered.get(PARTITION_COLUMN)
        if kind is not None and kind not in _INTEGER_TYPES:
            raise ConfigurationError(
                f"column {PARTITION_COLUMN!r}: must be an integer column (a partition "
                f"index), got {kind}"
            )
        return
    kind = lowered.get(key_column.lower())
    if kind is not None and kind not in _KEY_TYPES:
        raise ConfigurationError(
            f"column {key_column!r} (partitionKeyColumn): must be a string, binary or "
            f"integer column (what the stream clients' hash takes), got {kind}"
        )


def _target(layout: SuperStream, key_column: str | None, value: Any) -> str:
    """The binding key of the partition of a row whose routing column holds ``value``."""
    keys = layout.binding_keys
    if key_column is None:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(keys):
            raise ConfigurationError(
                f"column {PARTITION_COLUMN!r}: must be a partition index in "
                f"0..{len(keys) - 1} (super stream {layout.name!r}), got {value!r}"
            )
        return keys[value]
    if value is None:
        raise ConfigurationError(f"column {key_column!r}: a row has no partition key (null)")
    try:
        return keys[partition_for(value, len(keys))]
    except TypeError as exc:
        raise ConfigurationError(f"column {key_column!r} (partitionKeyColumn): {exc}") from None


def _column(names: Iterable[str], wanted: str) -> str:
    """The actual name of column ``wanted`` (Spark matches column names in any case)."""
    lowered = wanted.lower()
    return next(name for name in names if name.lower() == lowered)


def routed_batch_fields(options: WriteOptions, batches: Iterable[Any]) -> Iterator[Fields]:
    """The rows of Arrow record batches as :func:`~rabbitry.spark._arrow.batch_fields`
    gives them, each with the super stream's exchange and its partition's binding key.

    Raises:
        ConfigurationError: a row's partition key is null or of another type, or its
            partition index is out of range.
    """
    layout = options.super_stream
    assert layout is not None
    key_column = options.partition_key_column
    wanted = key_column or PARTITION_COLUMN
    for batch in batches:
        values = batch.column(_column(batch.schema.names, wanted)).to_pylist()
        for row, value in zip(batch_fields([batch]), values, strict=True):
            yield (row[0], _target(layout, key_column, value), layout.name, *row[3:])


def routed_row_fields(options: WriteOptions, rows: Iterable[Mapping[str, Any]]) -> Iterator[Fields]:
    """:func:`routed_batch_fields` for rows given as dicts.

    Raises:
        ConfigurationError: as :func:`routed_batch_fields`.
    """
    layout = options.super_stream
    assert layout is not None
    key_column = options.partition_key_column
    wanted = key_column or PARTITION_COLUMN
    for row in rows:
        fields = row_fields(row)
        value = row[_column(row, wanted)]
        yield (fields[0], _target(layout, key_column, value), layout.name, *fields[3:])


def share_limit(available: Mapping[str, int], limit: int) -> dict[str, int]:
    """How many rows each stream gives a micro-batch of at most ``limit`` rows.

    Streams get equal shares, and a share a stream cannot fill goes to the others, so
    the batch holds ``min(limit, sum(available))`` rows and no stream waits while
    another has more than its share.

    Args:
        available: rows each stream has beyond the batch's start (>= 0).
        limit: the most rows in the batch (>= 0).

    Returns:
        The rows taken from each stream, never more than it has.
    """
    taken = dict.fromkeys(available, 0)
    left = max(0, limit)
    hungry = sorted(name for name, count in available.items() if count > 0)
    while hungry and left > 0:
        share = left // len(hungry)
        if share == 0:  # fewer rows left than streams: one more each, in name order
            for name in hungry[:left]:
                taken[name] += 1
            break
        for name in hungry:
            give = min(share, available[name] - taken[name])
            taken[name] += give
            left -= give
        hungry = [name for name in hungry if taken[name] < available[name]]
    return taken


def per_stream(options: ReadOptions, probe: Callable[[ReadOptions], T]) -> dict[str, T]:
    """``probe`` run on every stream of the read at once (its partitions, or its queue).

    Args:
        options: the read.
        probe: a function of the options of one stream (e.g. ``stream_tail``).

    Returns:
        ``{stream: probe(options.for_stream(stream))}``.
    """
    streams = options.streams
    if len(streams) == 1:
        return {streams[0]: probe(options.for_stream(streams[0]))}
    with ThreadPoolExecutor(min(8, len(streams)), thread_name_prefix="rabbitry-probe") as pool:
        results = pool.map(lambda stream: probe(options.for_stream(stream)), streams)
        return dict(zip(streams, results, strict=True))


def check_partition_count(connect: ConnectOptions, layout: SuperStream) -> None:
    """Refuse a super stream whose partitions are not the ones the options name.

    Every partition's stream queue must exist. AMQP 0-9-1 cannot list a super stream's
    partitions, but with RabbitMQ's default layout (queues ``<name>-0`` ..
    ``<name>-<N-1>``) a queue ``<name>-<N>`` shows that there are more. Left unchecked,
    a read would skip those partitions and a write would route keys to other partitions
    than stream clients do, without an error.

    Raises:
        ConfigurationError: a partition's queue does not exist, or queue ``<name>-<N>``
            does.
    """
    count = len(layout.queues)
    default = [f"{layout.name}-{index}" for index in range(count)]
    is_default = list(layout.queues) == default and layout.binding_keys == tuple(
        map(str, range(count))
    )
    extra = f"{layout.name}-{count}"
    conn = connect.connect(" [spark planner]")
    try:
        for queue in layout.queues:
            try:
                conn.channel().queue_declare(queue, passive=True)
            except NotFound:
                raise ConfigurationError(
                    f"option superStream: partition {queue!r} of super stream "
                    f"{layout.name!r} does not exist (superStreamPartitions or "
                    "superStreamBindingKeys name the partitions)"
                ) from None
        if not is_default:
            return  # partitions named explicitly: the caller listed them
        try:
            conn.channel().queue_declare(extra, passive=True)
        except NotFound:
            return
    finally:
        conn.close(timeout=5)
    raise ConfigurationError(
        f"option superStreamPartitions: {count}, but queue {extra!r} exists: super stream "
        f"{layout.name!r} has more partitions (reading {count} would skip the others, and "
        "writing would route keys to other partitions than stream clients do)"
    )
