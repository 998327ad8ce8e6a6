"""The hot codec: frames, field tables and the base of the generated method classes.

Everything that runs once per message lives here, so that a compiled helper can replace
this one module later without touching the state machines.

Theory of operation
-------------------
A frame is ``type:octet channel:short size:long payload:size*octet frame-end:octet``
(AMQP 0-9-1 §4.2.3). :class:`FrameReader` keeps at most one partial frame between calls;
when the buffer is empty and the new chunk holds whole frames, they are sliced straight
out of that chunk, so the common case copies each payload exactly once.

Field tables (the typed values, their encoder and decoder) live in
:mod:`rabbitry.protocol._tables`; this module re-exports them, so that the codec keeps
one public face.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from datetime import datetime
from typing import ClassVar

from ..exceptions import LocalProtocolError, RemoteProtocolError
from ._tables import (
    MAX_NESTING,
    FieldTable,
    FieldValue,
    Float32,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    decode_table,
    encode_table,
    encode_table_body,
)
from ._tables import decode_timestamp as decode_timestamp  # spec.py imports it from here
from ._tables import split_timestamp as split_timestamp

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

_FRAME_HEAD = struct.Struct(">BHI")
_I = struct.Struct(">I")
_HHQ = struct.Struct(">HHQ")


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
