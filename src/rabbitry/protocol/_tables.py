"""Field tables: the typed values, the table encoder and the table decoder.

Field tables follow RabbitMQ's reading of the type letters (the "AMQP 0-9-1 errata"
page), which differs from the 0-9-1 spec for ``s`` (signed 16-bit), ``l`` (signed
64-bit) and adds ``x`` (byte array)::

    t bool      b int8      B uint8     s int16    u uint16    I int32    i uint32
    l int64     f float32   d float64   D decimal  S longstr   x bytes    T timestamp
    F table     A array     V void

Decoding gives plain Python values (all integers as ``int``). Encoding picks ``I`` or
``l`` for an ``int`` and ``d`` for a ``float``; to send another letter wrap the value
in :class:`Int8`, :class:`UInt8`, :class:`Int16`, :class:`UInt16`, :class:`Int32`,
:class:`UInt32`, :class:`Int64` or :class:`Float32`, which are ``int``/``float``
subclasses and compare equal to the plain value.

The names are re-exported by :mod:`rabbitry.protocol.frames`, the codec's public face.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeAlias

from ..exceptions import LocalProtocolError, RemoteProtocolError

#: Tables and arrays nested deeper than this are refused both ways: a hostile peer
#: must not be able to exhaust the interpreter's stack with 10,000 nested tables.
MAX_NESTING = 64

_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")

FieldValue: TypeAlias = Any
FieldTable: TypeAlias = Mapping[str, FieldValue]

# --------------------------------------------------------------------------- typed values


class Int8(int):
    """An ``int`` sent as field type ``b`` (signed 8-bit)."""

    __slots__ = ()


class UInt8(int):
    """An ``int`` sent as field type ``B`` (unsigned 8-bit)."""

    __slots__ = ()


class Int16(int):
    """An ``int`` sent as field type ``s`` (signed 16-bit, RabbitMQ's reading)."""

    __slots__ = ()


class UInt16(int):
    """An ``int`` sent as field type ``u`` (unsigned 16-bit)."""

    __slots__ = ()


class Int32(int):
    """An ``int`` sent as field type ``I`` (signed 32-bit)."""

    __slots__ = ()


class UInt32(int):
    """An ``int`` sent as field type ``i`` (unsigned 32-bit)."""

    __slots__ = ()


class Int64(int):
    """An ``int`` sent as field type ``l`` (signed 64-bit, RabbitMQ's reading)."""

    __slots__ = ()


class Float32(float):
    """A ``float`` sent as field type ``f`` (IEEE 754 single precision)."""

    __slots__ = ()


_INT_TYPES: dict[type, tuple[bytes, struct.Struct]] = {
    Int8: (b"b", struct.Struct(">cb")),
    UInt8: (b"B", struct.Struct(">cB")),
    Int16: (b"s", struct.Struct(">ch")),
    UInt16: (b"u", struct.Struct(">cH")),
    Int32: (b"I", struct.Struct(">ci")),
    UInt32: (b"i", struct.Struct(">cI")),
    Int64: (b"l", struct.Struct(">cq")),
}
_cI = struct.Struct(">ci")
_cq = struct.Struct(">cq")
_cd = struct.Struct(">cd")
_cf = struct.Struct(">cf")
_cB = struct.Struct(">cB")
_cQ = struct.Struct(">cQ")
_cBI = struct.Struct(">cBI")
_cIhead = struct.Struct(">cI")


# --------------------------------------------------------------------------- tables: encode


def _path_error(path: str, rule: str) -> LocalProtocolError:
    return LocalProtocolError(f"{path}: {rule}")


def _utf8(text: str, path: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise _path_error(path, f"text is not encodable as UTF-8 ({exc.reason})") from None


def _timestamp_seconds(value: datetime, path: str) -> int:
    # A naive datetime is taken as UTC: AMQP timestamps are POSIX seconds, and
    # silently applying the machine's local zone would shift them.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    seconds = int(value.timestamp())
    if not 0 <= seconds < 1 << 64:
        raise _path_error(path, "timestamp must be at or after 1970-01-01 UTC")
    return seconds


def _encode_value(value: FieldValue, out: list[bytes], path: str, depth: int) -> None:
    cls = type(value)
    if cls is str:
        out.append(_cIhead.pack(b"S", len(raw := _utf8(value, path))))
        out.append(raw)
    elif cls is bool:
        out.append(b"t\x01" if value else b"t\x00")
    elif cls is int:
        if -0x80000000 <= value <= 0x7FFFFFFF:
            out.append(_cI.pack(b"I", value))
        elif -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
            out.append(_cq.pack(b"l", value))
        else:
            raise _path_error(path, "integer does not fit a signed 64-bit field (type l)")
    elif cls is float:
        out.append(_cd.pack(b"d", value))
    elif value is None:
        out.append(b"V")
    elif cls in _INT_TYPES:
        letter, fmt = _INT_TYPES[cls]
        try:
            out.append(fmt.pack(letter, value))
        except struct.error:
            raise _path_error(
                path, f"{cls.__name__} value {int(value)} is out of range for type {letter!r}"
            ) from None
    elif cls is Float32:
        try:
            out.append(_cf.pack(b"f", value))
        except (struct.error, OverflowError):
            raise _path_error(path, f"Float32 value {value} is out of range for type 'f'") from None
    elif isinstance(value, Mapping):
        if depth >= MAX_NESTING:
            raise _path_error(path, f"tables and arrays nest deeper than {MAX_NESTING}")
        body = encode_table_body(value, path, depth + 1)
        out.append(_cIhead.pack(b"F", len(body)))
        out.append(body)
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_NESTING:
            raise _path_error(path, f"tables and arrays nest deeper than {MAX_NESTING}")
        parts: list[bytes] = []
        for index, item in enumerate(value):
            _encode_value(item, parts, f"{path}[{index}]", depth + 1)
        body = b"".join(parts)
        out.append(_cIhead.pack(b"A", len(body)))
        out.append(body)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out.append(_cIhead.pack(b"x", len(raw)))
        out.append(raw)
    elif isinstance(value, datetime):
        out.append(_cQ.pack(b"T", _timestamp_seconds(value, path)))
    elif isinstance(value, Decimal):
        sign, _digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise _path_error(path, "decimal must be finite")
        scale = -exponent if exponent < 0 else 0
        unscaled = int(value.scaleb(scale))
        if sign or not 0 <= unscaled <= 0xFFFFFFFF or scale > 255:
            raise _path_error(
                path,
                "decimal must be >= 0 with at most 255 decimal places and an unscaled value "
                "below 2**32 (RabbitMQ reads type D as scale:octet value:uint32)",
            )
        out.append(_cBI.pack(b"D", scale, unscaled))
    elif isinstance(value, str):
        _encode_value(str(value), out, path, depth)
    elif isinstance(value, bool):
        _encode_value(bool(value), out, path, depth)
    elif isinstance(value, int):
        _encode_value(int(value), out, path, depth)
    elif isinstance(value, float):
        _encode_value(float(value), out, path, depth)
    else:
        raise _path_error(path, f"cannot encode a value of type {cls.__name__} in a field table")


def encode_table_body(table: FieldTable, path: str = "table", depth: int = 0) -> bytes:
    """Encode a field table's entries without the 4-byte length prefix.

    Args:
        table: keys are ``str`` (at most 255 UTF-8 bytes); values as in the module doc.
        path: how errors name the table, e.g. ``"basic.properties.headers"``.
        depth: the current nesting level.

    Returns:
        The entries, each a shortstr key, a type letter and the value.

    Raises:
        LocalProtocolError: a key or value cannot be encoded; the message names its path.
    """
    out: list[bytes] = []
    for key, value in table.items():
        if type(key) is not str:
            raise _path_error(path, f"table keys must be str, got {type(key).__name__}")
        raw_key = _utf8(key, f"{path} key {key[:20]!r}")
        if len(raw_key) > 255:
            raise _path_error(f"{path}[{key[:20]!r}...]", "table key longer than 255 bytes")
        out.append(_B.pack(len(raw_key)))
        out.append(raw_key)
        _encode_value(value, out, f"{path}[{key!r}]", depth)
    return b"".join(out)


def encode_table(table: FieldTable | None, path: str = "table") -> bytes:
    """Encode a field table with its 4-byte length prefix; ``None`` is the empty table.

    Args:
        table: the table (see :func:`encode_table_body`), or ``None``.
        path: how errors name the table.

    Returns:
        The table as a ``long`` byte count followed by its entries.

    Raises:
        LocalProtocolError: ``table`` is not a mapping, or an entry cannot be encoded.
    """
    if not table:
        return b"\x00\x00\x00\x00"
    if not isinstance(table, Mapping):
        raise _path_error(path, f"must be a mapping, got {type(table).__name__}")
    body = encode_table_body(table, path)
    return _I.pack(len(body)) + body


# --------------------------------------------------------------------------- tables: decode

_unpack_b = struct.Struct(">b").unpack_from
_unpack_h = struct.Struct(">h").unpack_from
_unpack_H = _H.unpack_from
_unpack_i = struct.Struct(">i").unpack_from
_unpack_I = _I.unpack_from
_unpack_q = struct.Struct(">q").unpack_from
_unpack_Q = _Q.unpack_from
_unpack_f = struct.Struct(">f").unpack_from
_unpack_d = struct.Struct(">d").unpack_from
_unpack_BI = struct.Struct(">BI").unpack_from


def _take(buf: bytes, offset: int, length: int, what: str) -> bytes:
    end = offset + length
    if end > len(buf):
        raise RemoteProtocolError(f"{what} runs past the end of its frame", 502)
    return buf[offset:end]


def _decode_value(buf: bytes, offset: int, depth: int) -> tuple[FieldValue, int]:
    kind = buf[offset]
    offset += 1
    if kind == 0x53:  # S
        (length,) = _unpack_I(buf, offset)
        raw = _take(buf, offset + 4, length, "field value S")
        try:
            return raw.decode("utf-8"), offset + 4 + length
        except UnicodeDecodeError:
            # Not text after all: hand the bytes over rather than mangle or refuse them.
            return bytes(raw), offset + 4 + length
    if kind == 0x49:  # I
        return _unpack_i(buf, offset)[0], offset + 4
    if kind == 0x6C or kind == 0x4C:  # l, and L which RabbitMQ reads the same way
        return _unpack_q(buf, offset)[0], offset + 8
    if kind == 0x74:  # t
        return buf[offset] != 0, offset + 1
    if kind == 0x46:  # F
        if depth >= MAX_NESTING:
            raise RemoteProtocolError(f"field tables nested deeper than {MAX_NESTING}", 502)
        (length,) = _unpack_I(buf, offset)
        end = offset + 4 + length
        if end > len(buf):
            raise RemoteProtocolError("nested field table runs past the end of its frame", 502)
        return _decode_entries(buf, offset + 4, end, depth + 1), end
    if kind == 0x41:  # A
        if depth >= MAX_NESTING:
            raise RemoteProtocolError(f"field arrays nested deeper than {MAX_NESTING}", 502)
        (length,) = _unpack_I(buf, offset)
        offset += 4
        end = offset + length
        if end > len(buf):
            raise RemoteProtocolError("field array runs past the end of its frame", 502)
        items = []
        while offset < end:
            item, offset = _decode_value(buf, offset, depth + 1)
            items.append(item)
        if offset != end:
            raise RemoteProtocolError("field array length does not match its items", 502)
        return items, end
    if kind == 0x64:  # d
        return _unpack_d(buf, offset)[0], offset + 8
    if kind == 0x56:  # V
        return None, offset
    if kind == 0x78:  # x
        (length,) = _unpack_I(buf, offset)
        return bytes(_take(buf, offset + 4, length, "field value x")), offset + 4 + length
    if kind == 0x54:  # T
        return decode_timestamp(_unpack_Q(buf, offset)[0]), offset + 8
    if kind == 0x62:  # b
        return _unpack_b(buf, offset)[0], offset + 1
    if kind == 0x42:  # B
        return buf[offset], offset + 1
    if kind == 0x73:  # s
        return _unpack_h(buf, offset)[0], offset + 2
    if kind == 0x75:  # u
        return _unpack_H(buf, offset)[0], offset + 2
    if kind == 0x69:  # i
        return _unpack_I(buf, offset)[0], offset + 4
    if kind == 0x66:  # f
        return _unpack_f(buf, offset)[0], offset + 4
    if kind == 0x44:  # D
        scale, unscaled = _unpack_BI(buf, offset)
        return Decimal(unscaled).scaleb(-scale), offset + 5
    raise RemoteProtocolError(f"unknown field type {chr(kind)!r} (0x{kind:02x})", 502)


def decode_timestamp(seconds: int) -> datetime:
    """An aware UTC datetime for POSIX ``seconds``.

    Args:
        seconds: an AMQP timestamp (a 64-bit count of seconds since the epoch).

    Returns:
        The time as an aware ``datetime`` in UTC.

    Raises:
        RemoteProtocolError: the value is beyond what ``datetime`` can hold (502).
    """
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        raise RemoteProtocolError(f"timestamp {seconds} is out of range", 502) from None


def _decode_entries(buf: bytes, offset: int, end: int, depth: int) -> dict[str, FieldValue]:
    table: dict[str, FieldValue] = {}
    while offset < end:
        length = buf[offset]
        offset += 1
        key = _take(buf, offset, length, "field table key").decode("utf-8", "surrogateescape")
        offset += length
        table[key], offset = _decode_value(buf, offset, depth)
    if offset != end:
        raise RemoteProtocolError("field table length does not match its entries", 502)
    return table


def decode_table(buf: bytes, offset: int) -> tuple[dict[str, FieldValue], int]:
    """Decode a length-prefixed field table at ``offset``.

    Args:
        buf: the payload holding the table.
        offset: where its 4-byte length starts.

    Returns:
        ``(table, offset after it)``.

    Raises:
        RemoteProtocolError: malformed input (reply code 502). ``struct.error`` and
        ``IndexError`` may also escape for truncated input; :func:`decode_method`
        turns every one of them into a :class:`RemoteProtocolError`.
    """
    (length,) = _unpack_I(buf, offset)
    offset += 4
    end = offset + length
    if end > len(buf):
        raise RemoteProtocolError("field table runs past the end of its frame", 502)
    if length == 0:
        return {}, end
    return _decode_entries(buf, offset, end, 0), end


def split_timestamp(value: int | datetime, path: str) -> int:
    """Seconds since the epoch for a timestamp property given as int or datetime.

    Args:
        value: POSIX seconds, or a datetime (a naive one is taken as UTC).
        path: how errors name the property.

    Returns:
        The seconds to send (a datetime before 1970 raises :class:`LocalProtocolError`).
    """
    if isinstance(value, datetime):
        return _timestamp_seconds(value, path)
    return value
