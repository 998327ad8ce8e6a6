"""The hot codec: frames, field tables and the base of the generated method classes.

Everything that runs once per message lives here, so that a compiled helper can replace
this one module later without touching the state machines.

Theory of operation
-------------------
A frame is ``type:octet channel:short size:long payload:size*octet frame-end:octet``
(AMQP 0-9-1 §4.2.3). :class:`FrameReader` keeps at most one partial frame between calls;
when the buffer is empty and the new chunk holds whole frames, they are sliced straight
out of that chunk, so the common case copies each payload exactly once.

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
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar, TypeAlias

from ..exceptions import LocalProtocolError, RemoteProtocolError

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "FRAME_MIN_SIZE",
    "FRAME_OVERHEAD",
    "HEARTBEAT_FRAME",
    "MAX_NESTING",
    "PROTOCOL_HEADER",
    "FieldTable",
    "FieldValue",
    "Float32",
    "FrameReader",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "Method",
    "UInt8",
    "UInt16",
    "UInt32",
    "ack_frame",
    "content_frames",
    "decode_table",
    "encode_table",
    "encode_table_body",
    "method_frame",
]

#: Frame types (§4.2.3): a method, a content header, a piece of content body, a heartbeat.
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
#: The smallest frame_max a peer may propose, and the limit until connection.tune.
FRAME_MIN_SIZE = 4096
#: The octet every frame ends with (0xCE); any other value there is a frame error (501).
FRAME_END = 206
#: type (1) + channel (2) + size (4) + frame-end (1)
FRAME_OVERHEAD = 8
#: What a client sends first (§4.2.2): "AMQP", 0, then the version 0-9-1.
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
#: A heartbeat is a whole frame of type 8 on channel 0 with an empty payload (§4.2.7).
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

#: Tables and arrays nested deeper than this are refused both ways: a hostile peer
#: must not be able to exhaust the interpreter's stack with 10,000 nested tables.
MAX_NESTING = 64

_FRAME_HEAD = struct.Struct(">BHI")
_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_Q = struct.Struct(">Q")
_HH = struct.Struct(">HH")
_HHQ = struct.Struct(">HHQ")

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


# --------------------------------------------------------------------------- methods


class Method:
    """Base of the generated AMQP method classes (see ``spec.py``).

    Subclasses define ``__slots__`` for their arguments, ``encode()`` for the argument
    payload and ``decode(buf, offset)``. Instances compare by class and arguments.
    """

    __slots__ = ()

    CLASS_ID: ClassVar[int] = 0
    METHOD_ID: ClassVar[int] = 0
    INDEX: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = False
    FIELDS: ClassVar[tuple[str, ...]] = ()
    FIELD_TYPES: ClassVar[tuple[str, ...]] = ()
    #: For a synchronous request: the method classes that answer it.
    RESPONSES: ClassVar[tuple[type[Method], ...]] = ()
    #: ``class_id, method_id`` packed, ready to prefix the arguments.
    PREFIX: ClassVar[bytes] = b""

    def encode(self) -> bytes:
        """Encode the arguments (without class and method id)."""
        raise NotImplementedError

    @classmethod
    def decode(cls, buf: bytes, offset: int) -> tuple[Method, int]:
        """Decode the arguments at ``offset``.

        Args:
            buf: the method frame's payload.
            offset: where the arguments start (after class and method id).

        Returns:
            The method and the offset after its arguments.

        Raises:
            NotImplementedError: on this base class; each generated class has its own.
        """
        raise NotImplementedError

    def encode_error(self, exc: BaseException) -> LocalProtocolError:
        """Explain why :meth:`encode` failed, naming the first invalid field.

        Args:
            exc: what the encoder raised (``struct.error``, ``TypeError``...).

        Returns:
            The error to raise, ``"<method>.<field>: <rule>"`` when a field is to blame.
        """
        for name, kind in zip(self.FIELDS, self.FIELD_TYPES, strict=True):
            problem = check_field(getattr(self, name), kind)
            if problem:
                return LocalProtocolError(f"{self.NAME}.{name}: {problem}")
        return LocalProtocolError(f"{self.NAME}: cannot encode ({exc})")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for name, kind in zip(self.FIELDS, self.FIELD_TYPES, strict=True):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs and not (kind == "table" and not mine and not theirs):
                return False  # an absent table and an empty one are the same on the wire
        return True

    def __hash__(self) -> int:
        return hash((self.INDEX, *(repr(getattr(self, n)) for n in self.FIELDS)))

    def __repr__(self) -> str:
        args = ", ".join(
            f"{n}={'***' if n in _SECRET_FIELDS else repr(getattr(self, n))}" for n in self.FIELDS
        )
        return f"<{self.NAME}({args})>"


#: Method arguments that carry credentials: never shown by ``repr``.
_SECRET_FIELDS = frozenset({"response", "challenge", "new_secret"})

_LIMITS = {
    "octet": 0xFF,
    "short": 0xFFFF,
    "long": 0xFFFFFFFF,
    "longlong": 0xFFFFFFFFFFFFFFFF,
    "timestamp": 0xFFFFFFFFFFFFFFFF,
}


def check_field(value: object, kind: str) -> str | None:
    """Return why ``value`` cannot be sent as an AMQP ``kind``, or ``None`` if it can.

    Args:
        value: a method argument.
        kind: its type in the spec (octet, short, long, longlong, timestamp, shortstr,
            longstr, table or bit).

    Returns:
        The broken rule in words, or ``None``.
    """
    if kind in _LIMITS:
        if kind == "timestamp" and isinstance(value, datetime):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an int ({kind}), got {type(value).__name__}"
        if not 0 <= value <= _LIMITS[kind]:
            return f"must be in 0..{_LIMITS[kind]} ({kind}), got {value}"
        return None
    if kind == "shortstr":
        if not isinstance(value, str):
            return f"must be a str, got {type(value).__name__}"
        try:
            raw = value.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            return f"is not encodable as UTF-8 ({exc.reason})"
        if len(raw) > 255:
            return f"must be at most 255 bytes in UTF-8 (shortstr), got {len(raw)}"
        return None
    if kind == "longstr":
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"is not encodable as UTF-8 ({exc.reason})"
            return None
        if not isinstance(value, (bytes, bytearray, memoryview)):
            return f"must be bytes or str, got {type(value).__name__}"
        return None
    if kind == "table":
        if value is not None and not isinstance(value, Mapping):
            return f"must be a mapping or None, got {type(value).__name__}"
        try:
            encode_table(value)
        except LocalProtocolError as exc:
            return str(exc)
        return None
    return None  # bit: any truthy/falsy value is accepted


def encode_longstr(value: str | bytes | bytearray | memoryview) -> bytes:
    """Encode a longstr with its 4-byte length prefix (``str`` as UTF-8).

    Args:
        value: the text or bytes.

    Returns:
        A ``long`` byte count, then the bytes.

    Raises:
        TypeError: not bytes-like or str (the method's encode turns it into a
            :class:`LocalProtocolError` naming the field).
    """
    if isinstance(value, str):
        raw = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    else:
        raise TypeError(f"longstr must be bytes or str, got {type(value).__name__}")
    return _I.pack(len(raw)) + raw


# --------------------------------------------------------------------------- frames


def method_frame(channel: int, method: Method) -> bytes:
    """Build one method frame: class id and method id (two shorts), then the arguments.

    Args:
        channel: the channel number (0 for connection methods).
        method: the method to send.

    Returns:
        The whole frame, frame-end included.

    Raises:
        LocalProtocolError: an argument cannot be encoded; nothing was produced.
    """
    payload = method.PREFIX + method.encode()
    return _FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


# basic.ack as a whole frame: type, channel, size 13, class 60 method 80, tag, bits, end.
_ACK_FRAME = struct.Struct(">BHIHHQBB")


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Build one basic.ack method frame directly (the consumer's hot path).

    Args:
        channel: the channel the delivery came on.
        delivery_tag: the delivery's tag (channel-scoped, 64-bit).
        multiple: also acknowledge every earlier unacknowledged delivery of the channel.

    Returns:
        The 21-byte frame.

    Raises:
        LocalProtocolError: the delivery tag is not an unsigned 64-bit integer.
    """
    try:
        return _ACK_FRAME.pack(
            FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0, FRAME_END
        )
    except (struct.error, TypeError) as exc:
        raise LocalProtocolError(
            f"basic.ack.delivery_tag: must be an integer from 0 to 2**64-1, got {delivery_tag!r}"
        ) from exc


def content_frames(
    channel: int, class_id: int, properties: bytes, body: bytes, frame_max: int
) -> list[bytes]:
    """Build the header frame and the body frames for one message.

    Args:
        channel: channel number.
        class_id: 60 (basic).
        properties: the encoded property flags and values.
        body: the message body.
        frame_max: the negotiated maximum frame size, overhead included (0 = no limit).

    Returns:
        The frames as a list of byte strings, ready for ``writelines``. A body split
        over several frames is not copied: its pieces are ``memoryview`` slices of
        ``body`` (which is immutable bytes), so framing a large message costs no
        second copy of it.
    """
    size = len(body)
    # Content header payload (§4.2.6.1): class id, weight (always 0), body size, properties.
    header = _HHQ.pack(class_id, 0, size) + properties
    out = [_FRAME_HEAD.pack(FRAME_HEADER, channel, len(header)), header, b"\xce"]
    if not size:
        return out
    # frame_max counts the whole frame, so a body frame carries 8 bytes less than it.
    chunk = (frame_max - FRAME_OVERHEAD) if frame_max else size
    if size <= chunk:
        out += (_FRAME_HEAD.pack(FRAME_BODY, channel, size), body, b"\xce")
        return out
    view = memoryview(body)
    for start in range(0, size, chunk):
        part = view[start : start + chunk]
        # A view where bytes are declared: every consumer of frames takes any buffer.
        out += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(part)), part, b"\xce")  # type: ignore[arg-type]
    return out


class FrameReader:
    """Split a byte stream into frames.

    ``feed`` returns complete frames as ``(frame_type, channel, payload)`` tuples and
    keeps any partial frame for the next call.

    Args:
        frame_max: the largest frame accepted, overhead included. Until tune, the spec's
            minimum (4096) applies; ``0`` means no limit is negotiated yet.
    """

    __slots__ = ("_buffer", "_need", "frame_max")

    def __init__(self, frame_max: int = FRAME_MIN_SIZE) -> None:
        self._buffer = bytearray()
        self._need = FRAME_OVERHEAD - 1
        self.frame_max = frame_max

    @property
    def buffered(self) -> int:
        """Bytes held back as an incomplete frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """Add bytes; return the frames they complete.

        Args:
            data: the next bytes of the stream, any length.

        Returns:
            ``(frame_type, channel, payload)`` of each complete frame, in stream order.

        Raises:
            RemoteProtocolError: a frame is larger than ``frame_max`` or lacks its
                frame-end octet (reply code 501). The reader is unusable afterwards.
        """
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._need:
                return []
            data = bytes(buffer)
            buffer.clear()
        frames: list[tuple[int, int, bytes]] = []
        total = len(data)
        offset = 0
        limit = self.frame_max - FRAME_OVERHEAD if self.frame_max else 0xFFFFFFFF
        unpack = _FRAME_HEAD.unpack_from
        while total - offset >= 7:
            kind, channel, size = unpack(data, offset)
            if size > limit:  # a peer must not exceed the negotiated frame_max
                raise RemoteProtocolError(
                    f"frame of {size + FRAME_OVERHEAD} bytes exceeds frame_max {self.frame_max}",
                    501,
                )
            end = offset + 7 + size
            if end >= total:
                self._need = end + 1 - offset
                break
            if data[end] != FRAME_END:
                raise RemoteProtocolError(
                    f"frame-end octet is 0x{data[end]:02x}, expected 0xce", 501
                )
            frames.append((kind, channel, data[offset + 7 : end]))
            offset = end + 1
        else:
            self._need = FRAME_OVERHEAD - 1
        if offset < total:
            buffer += data[offset:] if offset else data
        return frames


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
