"""Hostile input: whatever bytes arrive, the codec may only fail with a protocol error.

A broker (or anything pretending to be one) must never be able to make the reader raise
``struct.error``, ``IndexError``, ``UnicodeError``, ``RecursionError`` or anything else
unplanned out of ``FrameReader.feed`` or ``decode_method``: those become a connection
close with a reply code, not a crash.

``BasicProperties.decode`` and ``decode_table`` are lower-level: they document that
``struct.error``/``IndexError`` (and, for properties, ``ValueError``) may escape on
truncated input, and the connection layer wraps them.
"""

from __future__ import annotations

import itertools
import struct
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rabbitry.exceptions import ProtocolError, RemoteProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol.frames import (
    FRAME_HEADER,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    FrameReader,
    Method,
    content_frames,
    decode_table,
    encode_table,
    method_frame,
)

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
FRAME_MAX = 131072

#: What BasicProperties.decode may raise on malformed input (see module docstring).
PROPERTIES_ALLOWED = (RemoteProtocolError, struct.error, IndexError, ValueError)
#: What decode_table may raise on malformed input (documented in frames.decode_table).
TABLE_ALLOWED = (RemoteProtocolError, struct.error, IndexError)

ALL_METHODS = sorted(spec.METHODS.values(), key=lambda cls: cls.INDEX)

TABLE: dict[str, Any] = {
    "s": "välue",
    "i": -5,
    "l": 2**40,
    "t": True,
    "d": 1.5,
    "D": Decimal("1.25"),
    "T": datetime(2024, 1, 1, tzinfo=UTC),
    "x": b"\x00\xff",
    "V": None,
    "F": {"nested": [1, "two", {"three": None}]},
}


def sample(kind: str) -> Any:
    return {
        "octet": 0xFE,
        "short": 0xFFFE,
        "long": 0xFFFFFFFE,
        "longlong": 0xFFFFFFFFFFFFFFFE,
        "shortstr": "ünï",
        "longstr": b"\x00\xffbin",
        "bit": True,
        "table": TABLE,
    }[kind]


def sample_method(cls: type[Method]) -> Method:
    return cls(**{n: sample(k) for n, k in zip(cls.FIELDS, cls.FIELD_TYPES, strict=True)})


PROPERTIES = spec.BasicProperties(
    content_type="text/plain",
    headers=TABLE,
    delivery_mode=2,
    priority=5,
    correlation_id="c",
    expiration="1000",
    timestamp=datetime(2024, 1, 1, tzinfo=UTC),
    type="t",
    cluster_id="x",
).encode()

METHOD_PAYLOADS = [cls.PREFIX + sample_method(cls).encode() for cls in ALL_METHODS]
HEADER_PAYLOAD = struct.pack(">HHQ", 60, 0, 10) + PROPERTIES
VALID_FRAMES = [method_frame(1, sample_method(cls)) for cls in ALL_METHODS] + [
    b"".join(content_frames(1, 60, PROPERTIES, b"0123456789", 4096)),
    HEARTBEAT_FRAME,
]


# --------------------------------------------------------------------------- checks


def check_properties(payload: bytes, offset: int) -> None:
    try:
        spec.BasicProperties.decode(payload, offset)
    except PROPERTIES_ALLOWED:
        pass


def check_frame(kind: int, payload: bytes) -> None:
    if kind == FRAME_METHOD:
        try:
            spec.decode_method(payload)
        except ProtocolError as exc:
            assert exc.reply_code in (502, 540)
    elif kind == FRAME_HEADER and len(payload) >= 14:
        check_properties(payload, 12)


def feed_all(data: bytes, cuts: list[int]) -> None:
    """Feed ``data`` split at ``cuts`` and decode every complete frame."""
    reader = FrameReader(frame_max=FRAME_MAX)
    points = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for start, end in itertools.pairwise(points):
        try:
            frames = reader.feed(data[start:end])
        except RemoteProtocolError as exc:
            assert exc.reply_code == 501
            return  # the reader is unusable afterwards, by contract
        for kind, _channel, payload in frames:
            check_frame(kind, payload)


# --------------------------------------------------------------------------- strategies

CUTS = st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=20)
PREFIXES = st.sampled_from([cls.PREFIX for cls in ALL_METHODS])
PAYLOADS = st.one_of(
    st.binary(max_size=300),
    st.builds(bytes.__add__, PREFIXES, st.binary(max_size=300)),
    st.builds(
        lambda size, flags, rest: struct.pack(">HHQH", 60, 0, size, flags) + rest,
        st.integers(0, 2**64 - 1),
        st.integers(0, 0xFFFF),
        st.binary(max_size=300),
    ),
)


@st.composite
def frame_bytes(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from([1, 2, 3, 8]) | st.integers(0, 255))
    payload = draw(PAYLOADS)
    end = draw(st.just(0xCE) | st.integers(0, 255))
    channel = draw(st.integers(0, 0xFFFF))
    size = draw(st.just(len(payload)) | st.integers(0, 2**32 - 1))
    return struct.pack(">BHI", kind, channel, size) + payload + bytes([end])


@st.composite
def mutated(draw: st.DrawFn, originals: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[position] = draw(
                st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0xCE]) | st.integers(0, 255)
            )
        elif op == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[position : position + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[position:]
    return bytes(data)


# --------------------------------------------------------------------------- (a) random


@FUZZ
@given(st.binary(max_size=2000), CUTS)
def test_random_bytes_into_reader(data: bytes, cuts: list[int]) -> None:
    feed_all(data, cuts)


@FUZZ
@given(st.lists(frame_bytes(), min_size=1, max_size=6), st.binary(max_size=20), CUTS)
def test_random_frames_into_reader(frames: list[bytes], tail: bytes, cuts: list[int]) -> None:
    feed_all(b"".join(frames) + tail, cuts)


@FUZZ
@given(PAYLOADS)
def test_random_method_payloads(payload: bytes) -> None:
    check_frame(FRAME_METHOD, payload)


@FUZZ
@given(st.binary(max_size=400))
def test_random_property_payloads(payload: bytes) -> None:
    if len(payload) >= 2:
        check_properties(payload, 0)


# --------------------------------------------------------------------------- (b) mutated


@FUZZ
@given(st.lists(mutated(VALID_FRAMES), min_size=1, max_size=3), CUTS)
def test_mutated_valid_frames_into_reader(frames: list[bytes], cuts: list[int]) -> None:
    feed_all(b"".join(frames), cuts)


@FUZZ
@given(mutated(METHOD_PAYLOADS))
def test_mutated_method_payloads(payload: bytes) -> None:
    # Straight into decode_method: the reader is bypassed so that a mutated size field
    # cannot hide the payload behind "wait for more data".
    check_frame(FRAME_METHOD, payload)


@FUZZ
@given(mutated([HEADER_PAYLOAD]))
def test_mutated_header_payloads(payload: bytes) -> None:
    check_frame(FRAME_HEADER, payload)


# --------------------------------------------------------------------------- (c) tables


def check_table(buf: bytes) -> None:
    try:
        table, end = decode_table(buf, 0)
    except TABLE_ALLOWED:
        return
    assert isinstance(table, dict)
    assert end == 4 + struct.unpack_from(">I", buf)[0] <= len(buf)


@FUZZ
@given(st.binary(max_size=500))
def test_random_bytes_into_decode_table(data: bytes) -> None:
    check_table(data)


@FUZZ
@given(st.binary(max_size=500))
def test_random_length_prefixed_bytes_into_decode_table(body: bytes) -> None:
    # with a matching length prefix the entries themselves get parsed
    check_table(struct.pack(">I", len(body)) + body)


@FUZZ
@given(mutated([encode_table(TABLE)]))
def test_mutated_table_into_decode_table(buf: bytes) -> None:
    check_table(buf)


# --------------------------------------------------------------------------- known bugs


@pytest.mark.parametrize("seconds", [2**56, 2**63, 2**64 - 1])
def test_properties_timestamp_out_of_range(seconds: int) -> None:
    with pytest.raises(PROPERTIES_ALLOWED):
        spec.BasicProperties.decode(b"\x00\x40" + struct.pack(">Q", seconds), 0)
