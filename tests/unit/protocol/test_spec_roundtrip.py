"""Every generated AMQP method and the basic properties: round trips, a cross-check
against pamqp in both directions, frame building and splitting, and encode-time errors.

pamqp and RabbitMQ disagree on some field-table type letters, so tables exchanged with
pamqp only hold values both sides encode and read the same way:

* pamqp *encodes* a Python ``int`` with the smallest of ``b s u I i l``, a ``float`` as
  ``f`` (single precision, so only values exact in float32 survive), only ``bytearray``
  (not ``bytes``) as ``x``, a ``Decimal`` with a *signed* 32-bit value, truncates keys
  to 128 bytes and sorts the keys;
* pamqp *decodes* ``D`` with a signed 32-bit value (its ``Struct.uint`` is ``>i``),
  divides a ``T`` above 2**32 by 1000 (guessing milliseconds), accepts ``L`` and
  ``\\x00``, and decodes method ``longlong`` arguments (delivery tags) as *signed*;
* pamqp silently omits empty-string properties, refuses a non-empty ``cluster_id`` and
  validates names (``ticket`` 0, exchange/queue names ``^[a-zA-Z0-9-_.:@#,/+ ]*$``).

RabbitMQ reads ``s`` as signed 16-bit, ``l`` as signed 64-bit, ``D`` as scale octet +
unsigned 32-bit and ``x`` as bytes; the letters where the two differ (and every letter
rabbitry can send) are checked against the broker itself in the integration suite
(publish every type, read it back, match on it through a headers exchange), and byte for
byte against RabbitMQ's reading in ``test_codec_tables.py``.
"""

from __future__ import annotations

import inspect
import itertools
import math
import random
import struct
import warnings
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as pcommands
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

from rabbitry.exceptions import LocalProtocolError, RemoteProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
    HEARTBEAT_FRAME,
    MAX_NESTING,
    Float32,
    FrameReader,
    Int8,
    Int16,
    Int32,
    Int64,
    Method,
    UInt8,
    UInt16,
    UInt32,
    content_frames,
    method_frame,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

ALL_METHODS = sorted(spec.METHODS.values(), key=lambda cls: cls.INDEX)
PAMQP_METHODS = [cls for cls in ALL_METHODS if cls.INDEX in pcommands.INDEX_MAPPING]


def method_id(cls: type[Method]) -> str:
    return cls.NAME


# --------------------------------------------------------------------------- samples

MAXIMUM = {
    "octet": 0xFF,
    "short": 0xFFFF,
    "long": 0xFFFFFFFF,
    "longlong": 0xFFFFFFFFFFFFFFFF,
}
ZERO: dict[str, Any] = {
    "octet": 0,
    "short": 0,
    "long": 0,
    "longlong": 0,
    "shortstr": "",
    "longstr": b"",
    "bit": False,
    "table": {},
}
NON_ASCII = "ünïcødé ✓ 🐇"

#: Every type letter rabbitry can send, with edge values.
RICH_TABLE: dict[str, Any] = {
    "str": "välue ✓",
    "true": True,
    "false": False,
    "i32max": 2**31 - 1,
    "i32min": -(2**31),
    "i64max": 2**63 - 1,
    "i64min": -(2**63),
    "float": 1.0 / 3.0,
    "huge": -1e300,
    "none": None,
    "bytes": b"\x00\xff\xce",
    "decimal": Decimal("12.345"),
    "ts": datetime(2024, 2, 29, 12, 34, 56, tzinfo=UTC),
    "nested": {"deeper": {"list": [1, "two", [3.5, None]]}},
    "array": [True, "x", 70000, {"k": "v"}, [], {}],
    "i8": Int8(-128),
    "u8": UInt8(255),
    "i16": Int16(-32768),
    "u16": UInt16(65535),
    "i32": Int32(-1),
    "u32": UInt32(2**32 - 1),
    "i64": Int64(-(2**63)),
    "f32": Float32(0.5),
    "ключ": "non-ASCII key",
    "": "empty key",
}

#: Values whose letters pamqp and RabbitMQ both encode and read the same way: str S,
#: bool t, int in the I range (pamqp picks I there), nested F and A, None V, and a float
#: exact in single precision (rabbitry sends d, pamqp sends f; both read either).
COMMON_TABLE: dict[str, Any] = {
    "str": "välue ✓",
    "true": True,
    "false": False,
    "int": 2**31 - 1,
    "negative": -(2**31),
    "float": 0.5,
    "none": None,
    "nested": {"inner": "x", "count": 70000, "list": ["a", True, None]},
    "array": ["a", 100000, {"k": "v"}, [False]],
}
#: pamqp only encodes bytearray as x; rabbitry reads it back as bytes (equal).
COMMON_TABLE_PAMQP = {**COMMON_TABLE, "bytes": bytearray(b"\x00\xff")}
COMMON_TABLE_OURS = {**COMMON_TABLE, "bytes": b"\x00\xff"}

#: Letters rabbitry sends that pamqp's *decoder* reads exactly as RabbitMQ does (pamqp's
#: encoder would choose other letters, so these only go one way).
PAMQP_DECODABLE_TABLE: dict[str, Any] = {
    **COMMON_TABLE_OURS,
    "i8": Int8(-128),
    "u8": UInt8(255),
    "i16": Int16(-32768),
    "u16": UInt16(65535),
    "u32": UInt32(2**32 - 1),
    "i64": Int64(-(2**63)),
    "double": 1.0 / 3.0,
    "f32": Float32(0.25),
    "decimal": Decimal("12.345"),
    "ts": datetime(2024, 2, 29, 12, 34, 56, tzinfo=UTC),
}


def sample_value(kind: str, name: str, position: int, variant: int) -> Any:
    """A non-default value; distinct per field so that swapped fields are caught."""
    if kind in MAXIMUM:
        return MAXIMUM[kind] - position
    if kind == "shortstr":
        return f"{name}:{NON_ASCII}"
    if kind == "longstr":
        return f"{name}:".encode() + b"\x00\xff\xce binary"
    if kind == "bit":
        # alternate bits, and flip the pattern in the other variant: every bit is seen
        # both set and clear, and a swapped bit order fails
        return (position + variant) % 2 == 0
    if kind == "table":
        return RICH_TABLE
    raise AssertionError(kind)


def sample_method(cls: type[Method], variant: int = 0) -> Method:
    kwargs = {
        name: sample_value(kind, name, i, variant)
        for i, (name, kind) in enumerate(zip(cls.FIELDS, cls.FIELD_TYPES, strict=True))
    }
    return cls(**kwargs)


def zero_method(cls: type[Method]) -> Method:
    return cls(**{name: ZERO[kind] for name, kind in zip(cls.FIELDS, cls.FIELD_TYPES, strict=True)})


def default_method(cls: type[Method]) -> Method:
    """The constructor's defaults, with zero values for the required arguments only."""
    params = inspect.signature(cls.__init__).parameters
    kinds = dict(zip(cls.FIELDS, cls.FIELD_TYPES, strict=True))
    return cls(
        **{
            name: ZERO[kinds[name]]
            for name, param in params.items()
            if name in kinds and param.default is inspect.Parameter.empty
        }
    )


def roundtrip(method: Method) -> Method:
    return spec.decode_method(method.PREFIX + method.encode())


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("cls", ALL_METHODS, ids=method_id)
def test_method_round_trip_with_sample_values(cls: type[Method], variant: int) -> None:
    method = sample_method(cls, variant)
    decoded = roundtrip(method)
    assert type(decoded) is cls
    assert decoded == method
    for name in cls.FIELDS:
        assert getattr(decoded, name) == getattr(method, name), name


@pytest.mark.parametrize("cls", ALL_METHODS, ids=method_id)
def test_method_round_trip_with_zero_values(cls: type[Method]) -> None:
    method = zero_method(cls)
    assert roundtrip(method) == method


@pytest.mark.parametrize("cls", ALL_METHODS, ids=method_id)
def test_method_with_constructor_defaults_encodes_and_decodes(cls: type[Method]) -> None:
    method = default_method(cls)
    decoded = roundtrip(method)
    for name, kind in zip(cls.FIELDS, cls.FIELD_TYPES, strict=True):
        expected = getattr(method, name)
        if kind == "table" and expected is None:
            expected = {}  # None and {} are the same on the wire
        assert getattr(decoded, name) == expected, name


TABLE_METHODS = [cls for cls in ALL_METHODS if "table" in cls.FIELD_TYPES]


@pytest.mark.parametrize("cls", TABLE_METHODS, ids=method_id)
def test_method_with_default_table_equals_its_decoded_self(cls: type[Method]) -> None:
    method = default_method(cls)
    assert roundtrip(method) == method


def test_longstr_given_as_str_decodes_to_utf8_bytes() -> None:
    method = spec.ConnectionSecureOk(response="pässword")
    assert roundtrip(method).response == "pässword".encode()  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", ALL_METHODS, ids=method_id)
def test_decode_refuses_trailing_and_missing_bytes(cls: type[Method]) -> None:
    payload = cls.PREFIX + sample_method(cls).encode()
    with pytest.raises(RemoteProtocolError) as info:
        spec.decode_method(payload + b"\x00")
    assert info.value.reply_code == 502
    if len(payload) > 4:
        with pytest.raises(RemoteProtocolError) as info:
            spec.decode_method(payload[:-1])
        assert info.value.reply_code == 502


def test_decode_method_unknown_and_short() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        spec.decode_method(b"\x00\x3c\x03\xe7")
    assert info.value.reply_code == 540
    with pytest.raises(RemoteProtocolError) as info:
        spec.decode_method(b"\x00\x3c")
    assert info.value.reply_code == 502


def test_bits_pack_into_one_octet_in_order() -> None:
    method = spec.QueueDeclare(
        queue="q", passive=True, durable=False, exclusive=True, auto_delete=False, nowait=True
    )
    assert method.encode() == b"\x00\x00\x01q\x15\x00\x00\x00\x00"


# --------------------------------------------------------------------------- pamqp

#: rabbitry field name -> pamqp attribute name, where they differ.
PAMQP_NAMES = {("exchange.declare", "type"): "exchange_type"}


def pamqp_name(cls: type[Method], name: str) -> str:
    return PAMQP_NAMES.get((cls.NAME, name), name)


@contextmanager
def quiet_pamqp() -> Iterator[None]:
    # pamqp warns DeprecationWarning whenever Basic.RecoverAsync is constructed, which
    # includes unmarshaling one; the suite turns warnings into errors.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def test_pamqp_knows_a_subset_of_our_methods() -> None:
    ours = {cls.INDEX for cls in ALL_METHODS}
    assert set(pcommands.INDEX_MAPPING) <= ours
    # pamqp 4 has no access.request/-ok (RabbitMQ still accepts them)
    assert {cls.NAME for cls in ALL_METHODS if cls.INDEX not in pcommands.INDEX_MAPPING} == {
        "access.request",
        "access.request-ok",
    }


@pytest.mark.parametrize("cls", PAMQP_METHODS, ids=method_id)
def test_field_names_and_types_match_pamqp(cls: type[Method]) -> None:
    pcls = pcommands.INDEX_MAPPING[cls.INDEX]
    assert [pamqp_name(cls, n) for n in cls.FIELDS] == list(pcls.__slots__)
    assert list(cls.FIELD_TYPES) == [pcls.amqp_type(a) for a in pcls.__slots__]


def as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def assert_same_fields(cls: type[Method], ours: Method, theirs: Any) -> None:
    for name, kind in zip(cls.FIELDS, cls.FIELD_TYPES, strict=True):
        mine = getattr(ours, name)
        other = getattr(theirs, pamqp_name(cls, name))
        if kind == "longstr":
            # pamqp decodes a longstr to str when it is valid UTF-8; we keep bytes
            assert as_bytes(mine) == as_bytes(other), name
        elif kind == "table":
            assert (mine or {}) == (other or {}), name
        else:
            assert mine == other, name


def pamqp_ready_method(cls: type[Method]) -> Method:
    """Sample values for rabbitry -> pamqp, decodable by pamqp the way RabbitMQ reads them.

    pamqp only validates on construction and marshal, not when unmarshaling, so names
    need not match its patterns here; longlong arguments must fit int64 because pamqp
    decodes them signed.
    """
    method = sample_method(cls)
    for name, kind in zip(cls.FIELDS, cls.FIELD_TYPES, strict=True):
        if kind == "longlong":
            setattr(method, name, 2**63 - 1)
        elif kind == "table":
            setattr(method, name, PAMQP_DECODABLE_TABLE)
    return method


@pytest.mark.parametrize("cls", PAMQP_METHODS, ids=method_id)
def test_rabbitry_encodes_pamqp_decodes(cls: type[Method]) -> None:
    method = pamqp_ready_method(cls)
    data = method_frame(513, method)
    with quiet_pamqp():
        consumed, channel, theirs = pframe.unmarshal(data)
    assert (consumed, channel) == (len(data), 513)
    assert type(theirs) is pcommands.INDEX_MAPPING[cls.INDEX]
    assert_same_fields(cls, method, theirs)


#: Names pamqp validates against ``^[a-zA-Z0-9-_.:@#,/+ ]*$`` (and at most 127 chars).
PAMQP_NAME_FIELDS = {"exchange", "queue", "destination", "source"}
#: Deprecated arguments pamqp insists on.
PAMQP_FIXED = {
    ("connection.open", "capabilities"): "",
    ("connection.open", "insist"): False,
    ("connection.open-ok", "known_hosts"): "",
    ("channel.open", "out_of_band"): "0",
    ("channel.open-ok", "channel_id"): "0",
    ("basic.get-empty", "cluster_id"): "",
}


def pamqp_kwargs(cls: type[Method], variant: int, empty_tables: bool = False) -> dict[str, Any]:
    """Values pamqp accepts for marshaling, keyed by rabbitry's field names."""
    values: dict[str, Any] = {}
    for i, (name, kind) in enumerate(zip(cls.FIELDS, cls.FIELD_TYPES, strict=True)):
        value = sample_value(kind, name, i, variant)
        if (cls.NAME, name) in PAMQP_FIXED:
            value = PAMQP_FIXED[cls.NAME, name]
        elif name == "ticket":
            value = 0  # pamqp: "ticket must be 0"
        elif name in PAMQP_NAME_FIELDS:
            value = f"{name}.Name-1_x:@#,/+ y"
        elif kind == "longlong":
            value = 2**63 - 1 - i  # pamqp encodes longlong as signed int64
        elif kind == "longstr":
            value = f"{name}: lông-str ✓"  # pamqp encodes only str as longstr
        elif kind == "table":
            value = {} if empty_tables else COMMON_TABLE_PAMQP
        values[name] = value
    return values


def pamqp_method(cls: type[Method], values: dict[str, Any]) -> Any:
    pcls = pcommands.INDEX_MAPPING[cls.INDEX]
    with quiet_pamqp():
        return pcls(**{pamqp_name(cls, name): value for name, value in values.items()})


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("cls", PAMQP_METHODS, ids=method_id)
def test_pamqp_encodes_rabbitry_decodes(cls: type[Method], variant: int) -> None:
    values = pamqp_kwargs(cls, variant)
    data = pframe.marshal(pamqp_method(cls, values), 9)
    reader = FrameReader(frame_max=0)
    [(kind, channel, payload)] = reader.feed(data)
    assert (kind, channel, reader.buffered) == (FRAME_METHOD, 9, 0)
    decoded = spec.decode_method(payload)
    assert type(decoded) is cls
    for name, kind_ in zip(cls.FIELDS, cls.FIELD_TYPES, strict=True):
        expected = values[name]
        if kind_ == "longstr":
            expected = expected.encode()
        assert getattr(decoded, name) == expected, name


@pytest.mark.parametrize("cls", PAMQP_METHODS, ids=method_id)
def test_method_frame_bytes_equal_pamqp(cls: type[Method]) -> None:
    # With values both accept and empty tables (where letter choices cannot differ), the
    # two encoders must agree byte for byte.
    values = pamqp_kwargs(cls, variant=1, empty_tables=True)
    ours = cls(**values)
    assert method_frame(7, ours) == pframe.marshal(pamqp_method(cls, values), 7)


# --------------------------------------------------------------------------- properties

ALL_PROPERTIES: dict[str, Any] = {
    "content_type": "application/json; charset=ütf-8",
    "content_encoding": "gzip",
    "headers": RICH_TABLE,
    "delivery_mode": 2,
    "priority": 255,
    "correlation_id": f"corr:{NON_ASCII}",
    "reply_to": "amq.rabbitmq.reply-to.g1h2AA==",
    "expiration": "60000",
    "message_id": f"msg:{NON_ASCII}",
    "timestamp": datetime(2024, 2, 29, 12, 34, 56, tzinfo=UTC),
    "type": "örder.created",
    "user_id": "guest",
    "app_id": "rabbitry-tests",
    "cluster_id": "cluster-ü",
}
PROPERTY_NAMES = list(spec.BasicProperties.FIELDS)


def decode_properties(data: bytes) -> spec.BasicProperties:
    props, end = spec.BasicProperties.decode(data, 0)
    assert end == len(data)
    return props


def test_properties_field_list() -> None:
    assert list(ALL_PROPERTIES) == PROPERTY_NAMES
    assert len(PROPERTY_NAMES) == 14


def test_all_properties_round_trip() -> None:
    props = spec.BasicProperties(**ALL_PROPERTIES)
    data = props.encode()
    assert data[:2] == b"\xff\xfc"  # 14 presence bits, continuation bit clear
    decoded = decode_properties(data)
    assert decoded == props
    for name in PROPERTY_NAMES:
        assert getattr(decoded, name) == ALL_PROPERTIES[name], name


def test_no_properties_is_two_zero_bytes() -> None:
    assert spec.BasicProperties().encode() == b"\x00\x00"
    assert decode_properties(b"\x00\x00") == spec.BasicProperties()


@pytest.mark.parametrize("name", PROPERTY_NAMES)
def test_each_property_alone(name: str) -> None:
    props = spec.BasicProperties(**{name: ALL_PROPERTIES[name]})
    data = props.encode()
    assert struct.unpack(">H", data[:2])[0] == 1 << (15 - PROPERTY_NAMES.index(name))
    decoded = decode_properties(data)
    assert decoded == props
    assert all(getattr(decoded, n) is None for n in PROPERTY_NAMES if n != name)


SHORTSTR_PROPERTIES = [
    name
    for name, kind in zip(PROPERTY_NAMES, spec.BasicProperties.FIELD_TYPES, strict=True)
    # RabbitMQ refuses an empty expiration (precondition-failed), and so does encode()
    if kind == "shortstr" and name != "expiration"
]


@pytest.mark.parametrize("name", SHORTSTR_PROPERTIES)
def test_empty_string_property_is_present(name: str) -> None:
    props = spec.BasicProperties(**{name: ""})
    assert decode_properties(props.encode()) == props


def test_timestamp_property_forms() -> None:
    aware = datetime(2024, 1, 1, tzinfo=UTC)
    for given_ in (aware, aware.replace(tzinfo=None), 1_704_067_200):
        data = spec.BasicProperties(timestamp=given_).encode()
        assert data == b"\x00\x40" + struct.pack(">Q", 1_704_067_200)
        assert decode_properties(data).timestamp == aware


def test_timestamp_property_from_other_zone() -> None:
    value = datetime(2024, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))
    assert decode_properties(spec.BasicProperties(timestamp=value).encode()).timestamp == (
        datetime(2024, 1, 1, tzinfo=UTC)
    )


def test_property_flag_continuation_is_refused() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        spec.BasicProperties.decode(b"\x00\x01\x00\x00", 0)
    assert info.value.reply_code == 502


def test_rabbitry_properties_pamqp_decodes() -> None:
    values = {**ALL_PROPERTIES, "headers": PAMQP_DECODABLE_TABLE}
    props = spec.BasicProperties(**values)
    data = b"".join(content_frames(3, 60, props.encode(), b"hello", 0))
    consumed, channel, header = pframe.unmarshal(data)
    assert channel == 3
    assert isinstance(header, pheader.ContentHeader)
    assert (header.class_id, header.weight, header.body_size) == (60, 0, 5)
    theirs = header.properties
    for name in PROPERTY_NAMES:
        other = getattr(theirs, "message_type" if name == "type" else name)
        assert other == values[name], name
    _, _, body = pframe.unmarshal(data[consumed:])
    assert body.value == b"hello"


PAMQP_PROPERTIES: dict[str, Any] = {
    **{n: v for n, v in ALL_PROPERTIES.items() if n not in ("type", "cluster_id")},
    "priority": 9,
    "headers": COMMON_TABLE_PAMQP,
    "message_type": "örder.created",
    # pamqp refuses a non-empty cluster_id and never sends an empty one
}


def test_pamqp_properties_rabbitry_decodes() -> None:
    theirs = pcommands.Basic.Properties(**PAMQP_PROPERTIES)
    data = pframe.marshal(pheader.ContentHeader(0, 1 << 40, theirs), 3)
    [(kind, channel, payload)] = FrameReader(frame_max=0).feed(data)
    assert (kind, channel) == (FRAME_HEADER, 3)
    assert struct.unpack_from(">HHQ", payload) == (60, 0, 1 << 40)
    props, end = spec.BasicProperties.decode(payload, 12)
    assert end == len(payload)
    for name in PROPERTY_NAMES:
        expected = PAMQP_PROPERTIES.get("message_type" if name == "type" else name)
        assert getattr(props, name) == expected, name


def test_properties_bytes_equal_pamqp_without_headers() -> None:
    values = {n: v for n, v in PAMQP_PROPERTIES.items() if n != "headers"}
    ours = spec.BasicProperties(
        **{("type" if n == "message_type" else n): v for n, v in values.items()}
    )
    assert ours.encode() == pcommands.Basic.Properties(**values).marshal()


# --------------------------------------------------------------------------- frames


def test_method_frame_exact_bytes() -> None:
    frame = method_frame(65535, spec.BasicAck(delivery_tag=2**64 - 1, multiple=True))
    assert frame == (
        b"\x01\xff\xff\x00\x00\x00\x0d"  # method, channel 65535, size 13
        + b"\x00\x3c\x00\x50"  # basic.ack
        + b"\xff" * 8  # delivery-tag
        + b"\x01"  # multiple
        + b"\xce"
    )


def test_heartbeat_frame() -> None:
    assert pheartbeat.Heartbeat().marshal() == HEARTBEAT_FRAME
    reader = FrameReader()
    assert reader.feed(HEARTBEAT_FRAME) == [(FRAME_HEARTBEAT, 0, b"")]
    assert reader.buffered == 0


def split_frames(data: bytes, frame_max: int) -> list[tuple[int, int, bytes]]:
    reader = FrameReader(frame_max=frame_max)
    frames = reader.feed(data)
    assert reader.buffered == 0
    return frames


BIG_BODY = random.Random(20240229).randbytes(1 << 20)


@pytest.mark.parametrize("frame_max", [4096, 131072, 0])
def test_content_frames_split_a_large_body(frame_max: int) -> None:
    properties = spec.BasicProperties(content_type="application/octet-stream").encode()
    parts = content_frames(5, 60, properties, BIG_BODY, frame_max)
    frames = split_frames(b"".join(parts), frame_max)
    kind, channel, header = frames[0]
    assert (kind, channel) == (FRAME_HEADER, 5)
    assert struct.unpack_from(">HHQ", header) == (60, 0, len(BIG_BODY))
    assert header[12:] == properties
    bodies = frames[1:]
    chunk = frame_max - FRAME_OVERHEAD if frame_max else len(BIG_BODY)
    assert len(bodies) == math.ceil(len(BIG_BODY) / chunk)
    assert all(k == FRAME_BODY and c == 5 for k, c, _ in bodies)
    assert all(len(p) <= chunk for _, _, p in bodies)
    assert all(len(p) == chunk for _, _, p in bodies[:-1])
    assert b"".join(p for _, _, p in bodies) == BIG_BODY


def test_content_frames_empty_body_is_header_only() -> None:
    properties = spec.BasicProperties(delivery_mode=2).encode()
    frames = split_frames(b"".join(content_frames(1, 60, properties, b"", 4096)), 4096)
    assert frames == [(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 0) + properties)]


@pytest.mark.parametrize(("extra", "count"), [(-1, 1), (0, 1), (1, 2)])
def test_content_frames_boundary(extra: int, count: int) -> None:
    body = b"x" * (4096 - FRAME_OVERHEAD + extra)
    frames = split_frames(b"".join(content_frames(1, 60, b"\x00\x00", body, 4096)), 4096)
    assert len(frames) == 1 + count
    assert b"".join(p for _, _, p in frames[1:]) == body


def stream_of_frames() -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """A few frames of every type, and what a reader must return for them."""
    methods = [sample_method(cls) for cls in ALL_METHODS[::7]]
    properties = spec.BasicProperties(**ALL_PROPERTIES).encode()
    body = bytes(range(256)) * 40
    data = b"".join(method_frame(i + 1, m) for i, m in enumerate(methods))
    data += b"".join(content_frames(2, 60, properties, body, 4096))
    data += HEARTBEAT_FRAME
    data += b"".join(content_frames(3, 60, b"\x00\x00", b"", 4096))
    expected = [(FRAME_METHOD, i + 1, m.PREFIX + m.encode()) for i, m in enumerate(methods)]
    expected.append((FRAME_HEADER, 2, struct.pack(">HHQ", 60, 0, len(body)) + properties))
    expected += [(FRAME_BODY, 2, body[i : i + 4088]) for i in range(0, len(body), 4088)]
    expected.append((FRAME_HEARTBEAT, 0, b""))
    expected.append((FRAME_HEADER, 3, struct.pack(">HHQ", 60, 0, 0) + b"\x00\x00"))
    return data, expected


STREAM, STREAM_FRAMES = stream_of_frames()


def feed_chunks(chunks: list[bytes]) -> tuple[list[tuple[int, int, bytes]], FrameReader]:
    reader = FrameReader(frame_max=4096)
    out: list[tuple[int, int, bytes]] = []
    for chunk in chunks:
        out += reader.feed(chunk)
    return out, reader


def test_reader_whole_stream_at_once() -> None:
    frames, reader = feed_chunks([STREAM])
    assert frames == STREAM_FRAMES
    assert reader.buffered == 0


def test_reader_one_byte_at_a_time() -> None:
    frames, reader = feed_chunks([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert frames == STREAM_FRAMES
    assert reader.buffered == 0


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=60))
def test_reader_any_chunking(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    frames, reader = feed_chunks(chunks)
    assert frames == STREAM_FRAMES
    assert reader.buffered == 0


def test_reader_keeps_a_partial_frame() -> None:
    reader = FrameReader()
    assert reader.feed(HEARTBEAT_FRAME[:5]) == []
    assert reader.buffered == 5
    assert reader.feed(HEARTBEAT_FRAME[5:] + HEARTBEAT_FRAME[:1]) == [(FRAME_HEARTBEAT, 0, b"")]
    assert reader.buffered == 1


def test_reader_frame_max_is_inclusive_of_overhead() -> None:
    ok = struct.pack(">BHI", FRAME_BODY, 1, 4096 - FRAME_OVERHEAD) + b"x" * 4088 + b"\xce"
    assert FrameReader(4096).feed(ok) == [(FRAME_BODY, 1, b"x" * 4088)]
    too_big = struct.pack(">BHI", FRAME_BODY, 1, 4096 - FRAME_OVERHEAD + 1)
    with pytest.raises(RemoteProtocolError) as info:
        FrameReader(4096).feed(too_big)  # refused from the header alone
    assert info.value.reply_code == 501


def test_reader_refuses_a_bad_frame_end() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        FrameReader().feed(HEARTBEAT_FRAME[:-1] + b"\x00")
    assert info.value.reply_code == 501


# --------------------------------------------------------------------------- encode errors


def nest(levels: int) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for _ in range(levels):
        table = {"n": table}
    return table


ENCODE_ERRORS = [
    pytest.param(
        lambda: spec.QueueDeclare(queue="q" * 256), "queue.declare.queue", id="shortstr-256"
    ),
    pytest.param(
        lambda: spec.QueueDeclare(queue="é" * 128), "queue.declare.queue", id="shortstr-256-utf8"
    ),
    pytest.param(
        lambda: spec.ConnectionClose(reply_code=65536, class_id=0, method_id=0),
        "connection.close.reply_code",
        id="short-65536",
    ),
    pytest.param(
        lambda: spec.ConnectionStart(version_major=-1),
        "connection.start.version_major",
        id="negative-octet",
    ),
    pytest.param(
        lambda: spec.BasicAck(delivery_tag=2**64), "basic.ack.delivery_tag", id="longlong-2**64"
    ),
    pytest.param(
        lambda: spec.BasicQos(prefetch_size=-1), "basic.qos.prefetch_size", id="negative-long"
    ),
    pytest.param(lambda: spec.QueueDeclare(queue=5), "queue.declare.queue", id="int-for-str"),
    pytest.param(
        lambda: spec.BasicPublish(routing_key=None),
        "basic.publish.routing_key",
        id="none-for-str",
    ),
    pytest.param(
        lambda: spec.ConnectionTune(frame_max="4096"),
        "connection.tune.frame_max",
        id="str-for-int",
    ),
    pytest.param(
        lambda: spec.ConnectionSecureOk(response=None),
        "connection.secure-ok.response",
        id="none-for-longstr",
    ),
    pytest.param(
        lambda: spec.QueueDeclare(queue="q", arguments={"x-set": {1, 2}}),
        "queue.declare.arguments['x-set']",
        id="table-set-value",
    ),
    pytest.param(
        lambda: spec.ExchangeDeclare(exchange="x", arguments={"k" * 256: 1}),
        "exchange.declare.arguments[",
        id="table-key-256",
    ),
    pytest.param(
        lambda: spec.QueueBind(exchange="x", arguments={1: "one"}),
        "queue.bind.arguments",
        id="table-int-key",
    ),
    pytest.param(
        lambda: spec.BasicConsume(arguments=nest(MAX_NESTING + 1)),
        "basic.consume.arguments['n']['n']",
        id="table-too-deep",
    ),
    pytest.param(
        lambda: spec.BasicProperties(expiration="10s"),
        "basic.properties.expiration",
        id="expiration-10s",
    ),
    pytest.param(
        lambda: spec.BasicProperties(expiration=""),
        "basic.properties.expiration",
        id="expiration-empty",
    ),
    pytest.param(
        lambda: spec.BasicProperties(expiration="-5"),
        "basic.properties.expiration",
        id="expiration-negative",
    ),
    pytest.param(
        lambda: spec.BasicProperties(expiration="１２"),
        "basic.properties.expiration",
        id="expiration-fullwidth-digits",
    ),
    pytest.param(
        lambda: spec.BasicProperties(expiration=10),
        "basic.properties.expiration",
        id="expiration-int",
    ),
    pytest.param(
        lambda: spec.BasicProperties(priority=256), "basic.properties.priority", id="priority-256"
    ),
    pytest.param(
        lambda: spec.BasicProperties(delivery_mode=-1),
        "basic.properties.delivery_mode",
        id="delivery-mode-negative",
    ),
    pytest.param(
        lambda: spec.BasicProperties(message_id="m" * 256),
        "basic.properties.message_id",
        id="property-shortstr-256",
    ),
    pytest.param(
        lambda: spec.BasicProperties(headers={"h": object()}),
        "basic.properties.headers['h']",
        id="headers-object",
    ),
    pytest.param(
        lambda: spec.BasicProperties(headers={"h": nest(MAX_NESTING + 1)}),
        "basic.properties.headers['h']['n']",
        id="headers-too-deep",
    ),
    pytest.param(
        lambda: spec.BasicProperties(timestamp=datetime(1969, 1, 1, tzinfo=UTC)),
        "basic.properties.timestamp",
        id="timestamp-before-epoch",
    ),
    pytest.param(
        lambda: spec.BasicProperties(timestamp=-1),
        "basic.properties.timestamp",
        id="timestamp-negative-int",
    ),
    pytest.param(
        lambda: spec.BasicProperties(timestamp="now"),
        "basic.properties.timestamp",
        id="timestamp-str",
    ),
]


@pytest.mark.parametrize(("build", "fragment"), ENCODE_ERRORS)
def test_encode_errors_name_the_field(build: Any, fragment: str) -> None:
    value = build()
    with pytest.raises(LocalProtocolError) as info:
        value.encode()
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)
    if isinstance(value, Method):
        with pytest.raises(LocalProtocolError, match=r"\w"):
            method_frame(1, value)


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(
            lambda: spec.QueueDeclare(queue="q", arguments={"a": Float32(1e300)}),
            id="method-float32",
        ),
        pytest.param(
            lambda: spec.QueueDeclare(queue="q", arguments={"a": "\ud800"}), id="method-surrogate"
        ),
        pytest.param(
            lambda: spec.BasicProperties(headers={"a": Float32(1e300)}), id="props-float32"
        ),
        pytest.param(lambda: spec.BasicProperties(headers={"a": "\ud800"}), id="props-surrogate"),
    ],
)
def test_unencodable_table_values_are_local_protocol_errors(build: Any) -> None:
    with pytest.raises(LocalProtocolError, match=r"\['a'\]"):
        build().encode()


@pytest.mark.parametrize("response", [12, [1, 2], -1])
def test_non_bytes_longstr_is_local_protocol_error(response: Any) -> None:
    with pytest.raises(LocalProtocolError, match=r"connection\.secure-ok\.response"):
        spec.ConnectionSecureOk(response=response).encode()


def test_longstr_with_lone_surrogate_is_local_protocol_error() -> None:
    with pytest.raises(LocalProtocolError, match=r"^connection\.start"):
        spec.ConnectionStart(mechanisms="\ud800").encode()


def test_longstr_with_lone_surrogate_names_the_field() -> None:
    with pytest.raises(LocalProtocolError, match=r"connection\.start\.mechanisms"):
        spec.ConnectionStart(mechanisms="\ud800").encode()
