"""Field-table codec: every type letter, byte for byte, as RabbitMQ reads it.

The expected bytes below are computed by hand from RabbitMQ's reading of the type
letters (``rabbit_binary_parser`` and the "AMQP 0-9-1 errata" page), which differs from
the 0-9-1 spec text: ``s`` is a signed 16-bit integer (not a short string), ``l`` a
signed 64-bit integer, ``D`` is ``scale:octet`` followed by an *unsigned* 32-bit value,
and ``x`` is a byte array.
"""

from __future__ import annotations

import struct
import time
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rabbitry.exceptions import LocalProtocolError, RemoteProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol.frames import (
    MAX_NESTING,
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

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def one_entry(key: bytes, value: bytes) -> bytes:
    """A whole length-prefixed table holding one entry ``key`` -> encoded ``value``."""
    body = bytes([len(key)]) + key + value
    return struct.pack(">I", len(body)) + body


def decode_one(value: bytes) -> object:
    table, end = decode_table(one_entry(b"k", value), 0)
    assert end == 4 + 2 + len(value)
    assert list(table) == ["k"]
    return table["k"]


# --------------------------------------------------------------------------- exact bytes

EXACT = [
    # (value, encoded field value: type letter + payload)
    pytest.param(True, b"t\x01", id="t-true"),
    pytest.param(False, b"t\x00", id="t-false"),
    pytest.param(Int8(-2), b"b\xfe", id="b"),
    pytest.param(Int8(127), b"b\x7f", id="b-max"),
    pytest.param(UInt8(255), b"B\xff", id="B"),
    pytest.param(Int16(-2), b"s\xff\xfe", id="s"),
    pytest.param(Int16(0x1234), b"s\x12\x34", id="s-positive"),
    pytest.param(UInt16(65535), b"u\xff\xff", id="u"),
    pytest.param(Int32(-2), b"I\xff\xff\xff\xfe", id="I-typed"),
    pytest.param(-2, b"I\xff\xff\xff\xfe", id="I-plain"),
    pytest.param(0x12345678, b"I\x12\x34\x56\x78", id="I-plain-positive"),
    pytest.param(UInt32(0xFFFFFFFF), b"i\xff\xff\xff\xff", id="i"),
    pytest.param(Int64(-2), b"l" + b"\xff" * 7 + b"\xfe", id="l-typed"),
    pytest.param(2**31, b"l\x00\x00\x00\x00\x80\x00\x00\x00", id="l-plain"),
    pytest.param(Float32(1.5), b"f\x3f\xc0\x00\x00", id="f"),
    pytest.param(1.5, b"d\x3f\xf8\x00\x00\x00\x00\x00\x00", id="d"),
    pytest.param(-0.0, b"d\x80\x00\x00\x00\x00\x00\x00\x00", id="d-negative-zero"),
    pytest.param(Decimal("1.23"), b"D\x02\x00\x00\x00\x7b", id="D"),
    pytest.param(Decimal("4294967295"), b"D\x00\xff\xff\xff\xff", id="D-uint32-max"),
    pytest.param("é", b"S\x00\x00\x00\x02\xc3\xa9", id="S"),
    pytest.param("", b"S\x00\x00\x00\x00", id="S-empty"),
    pytest.param(
        [1, "a"], b"A\x00\x00\x00\x0b" + b"I\x00\x00\x00\x01" + b"S\x00\x00\x00\x01a", id="A"
    ),
    pytest.param([], b"A\x00\x00\x00\x00", id="A-empty"),
    pytest.param(
        datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), b"T\x00\x00\x00\x00\x00\x00\x00\x01", id="T"
    ),
    pytest.param({"k": None}, b"F\x00\x00\x00\x03\x01kV", id="F"),
    pytest.param({}, b"F\x00\x00\x00\x00", id="F-empty"),
    pytest.param(None, b"V", id="V"),
    pytest.param(b"\x00\xff", b"x\x00\x00\x00\x02\x00\xff", id="x-bytes"),
    pytest.param(bytearray(b"\x01"), b"x\x00\x00\x00\x01\x01", id="x-bytearray"),
    pytest.param(memoryview(b"\x02"), b"x\x00\x00\x00\x01\x02", id="x-memoryview"),
]


@pytest.mark.parametrize(("value", "encoded"), EXACT)
def test_encode_exact_bytes(value: object, encoded: bytes) -> None:
    assert encode_table({"k": value}) == one_entry(b"k", encoded)
    assert encode_table_body({"k": value}) == b"\x01k" + encoded


def test_letter_sequence_covers_every_rabbitmq_letter() -> None:
    letters = {param.values[1][:1] for param in EXACT}
    assert letters == {bytes([c]) for c in b"tbBsuIilfdDSATFVx"}


def test_tuple_encodes_as_array() -> None:
    assert encode_table({"k": (1, "a")}) == encode_table({"k": [1, "a"]})


def test_entries_keep_insertion_order() -> None:
    assert encode_table_body({"b": None, "a": None}) == b"\x01bV\x01aV"


def test_empty_and_none_tables_are_four_zero_bytes() -> None:
    assert encode_table(None) == b"\x00\x00\x00\x00"
    assert encode_table({}) == b"\x00\x00\x00\x00"
    assert decode_table(b"\x00\x00\x00\x00", 0) == ({}, 4)


def test_non_ascii_key_is_utf8() -> None:
    assert encode_table_body({"ключ": True}) == b"\x08" + "ключ".encode() + b"t\x01"


# --------------------------------------------------------------------------- decode

DECODE = [
    pytest.param(b"t\x01", True, id="t"),
    pytest.param(b"t\x00", False, id="t-false"),
    pytest.param(b"t\x02", True, id="t-nonzero-is-true"),
    pytest.param(b"b\x80", -128, id="b-signed"),
    pytest.param(b"B\x80", 128, id="B-unsigned"),
    pytest.param(b"s\x80\x00", -32768, id="s-signed-16"),
    pytest.param(b"u\x80\x00", 32768, id="u-unsigned-16"),
    pytest.param(b"I\x80\x00\x00\x00", -(2**31), id="I-signed-32"),
    pytest.param(b"i\x80\x00\x00\x00", 2**31, id="i-unsigned-32"),
    pytest.param(b"l\x80" + b"\x00" * 7, -(2**63), id="l-signed-64"),
    pytest.param(b"l" + b"\xff" * 8, -1, id="l-minus-one"),
    pytest.param(b"f\x3f\xc0\x00\x00", 1.5, id="f"),
    pytest.param(b"d\xbf\xf8\x00\x00\x00\x00\x00\x00", -1.5, id="d"),
    pytest.param(b"D\x02\x00\x00\x00\x7b", Decimal("1.23"), id="D"),
    pytest.param(b"D\x00\xff\xff\xff\xff", Decimal(4294967295), id="D-unsigned"),
    pytest.param(b"S\x00\x00\x00\x03abc", "abc", id="S"),
    pytest.param(b"S\x00\x00\x00\x02\xc3\xa9", "é", id="S-utf8"),
    pytest.param(b"A\x00\x00\x00\x03t\x01V", [True, None], id="A"),
    pytest.param(
        b"T\x00\x00\x00\x00\x65\x92\x00\x80",
        datetime(2024, 1, 1, tzinfo=UTC),
        id="T",
    ),
    pytest.param(b"F\x00\x00\x00\x04\x01at\x01", {"a": True}, id="F"),
    pytest.param(b"V", None, id="V"),
    pytest.param(b"x\x00\x00\x00\x02\xce\x00", b"\xce\x00", id="x"),
]


@pytest.mark.parametrize(("encoded", "expected"), DECODE)
def test_decode_each_letter(encoded: bytes, expected: object) -> None:
    value = decode_one(encoded)
    assert value == expected
    assert type(value) is type(expected)


def test_decoded_integers_are_plain_ints() -> None:
    body = b"".join(
        bytes([1, ord(k)]) + v
        for k, v in [
            ("b", b"b\x01"),
            ("B", b"B\x01"),
            ("s", b"s\x00\x01"),
            ("u", b"u\x00\x01"),
            ("I", b"I\x00\x00\x00\x01"),
            ("i", b"i\x00\x00\x00\x01"),
            ("l", b"l" + b"\x00" * 7 + b"\x01"),
        ]
    )
    table, _ = decode_table(struct.pack(">I", len(body)) + body, 0)
    assert table == dict.fromkeys("bBsuIil", 1)
    assert all(type(v) is int for v in table.values())


def test_decoded_timestamp_is_aware_utc() -> None:
    value = decode_one(b"T" + struct.pack(">Q", 1_700_000_000))
    assert isinstance(value, datetime)
    assert value.tzinfo is not None
    assert value.utcoffset() == timedelta(0)
    assert value == datetime.fromtimestamp(1_700_000_000, tz=UTC)


def test_decimal_keeps_its_scale() -> None:
    value = decode_one(b"D\x02\x00\x00\x00\x96")
    assert str(value) == "1.50"


def test_decode_at_offset_returns_end() -> None:
    table = encode_table({"a": 1})
    buf = b"junk" + table + b"tail"
    assert decode_table(buf, 4) == ({"a": 1}, 4 + len(table))


def test_non_utf8_longstr_decodes_to_bytes() -> None:
    value = decode_one(b"S\x00\x00\x00\x03\xff\xfeA")
    assert value == b"\xff\xfeA"
    assert type(value) is bytes


def test_non_utf8_key_survives_via_surrogateescape() -> None:
    body = b"\x01\xffV"
    table, _ = decode_table(struct.pack(">I", len(body)) + body, 0)
    assert table == {"\udcff": None}
    # ... and encodes back to the very same bytes.
    assert encode_table(table) == struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("letter", [b"Z", b"\x00", b"c", b"U", b"?"])
def test_unknown_letter_is_remote_protocol_error_502(letter: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_one(letter + b"\x00" * 8)
    assert info.value.reply_code == 502


def test_capital_l_is_read_like_l_as_rabbitmq_does() -> None:
    assert decode_one(b"L" + b"\xff" * 8) == -1


@pytest.mark.parametrize(
    "buf",
    [
        pytest.param(b"\x00\x00\x00\x10\x01kV", id="table-longer-than-buffer"),
        pytest.param(one_entry(b"k", b"S\x00\x00\x00\x09abc"), id="S-longer-than-table"),
        pytest.param(one_entry(b"k", b"x\x00\x00\x00\x09abc"), id="x-longer-than-table"),
        pytest.param(one_entry(b"k", b"F\x00\x00\x00\x09abc"), id="F-longer-than-table"),
        pytest.param(one_entry(b"k", b"A\x00\x00\x00\x09abc"), id="A-longer-than-table"),
        pytest.param(one_entry(b"k", b"A\x00\x00\x00\x01I\x00\x00\x00\x01"), id="A-items-overrun"),
        pytest.param(b"\x00\x00\x00\x05\x01kt\x01\x00" + b"V", id="entries-do-not-fill-table"),
        pytest.param(b"\x00\x00\x00\x03\x05kk", id="key-past-end-of-buffer"),
        pytest.param(b"\x00\x00\x00\x03\x05kkkkkV", id="key-past-end-of-table"),
        pytest.param(one_entry(b"k", b"T" + b"\xff" * 8), id="T-out-of-range"),
    ],
)
def test_malformed_tables_are_remote_protocol_errors(buf: bytes) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_table(buf, 0)
    assert info.value.reply_code == 502


# --------------------------------------------------------------------------- typed values


@pytest.mark.parametrize(
    ("wrapper", "letter", "low", "high"),
    [
        (Int8, b"b", -(2**7), 2**7 - 1),
        (UInt8, b"B", 0, 2**8 - 1),
        (Int16, b"s", -(2**15), 2**15 - 1),
        (UInt16, b"u", 0, 2**16 - 1),
        (Int32, b"I", -(2**31), 2**31 - 1),
        (UInt32, b"i", 0, 2**32 - 1),
        (Int64, b"l", -(2**63), 2**63 - 1),
    ],
)
def test_typed_ints_choose_their_letter_and_range(
    wrapper: type[int], letter: bytes, low: int, high: int
) -> None:
    for value in (low, high, 0 if low == 0 else -1):
        encoded = encode_table_body({"k": wrapper(value)})
        assert encoded[2:3] == letter
        assert wrapper(value) == value
        assert decode_table(encode_table({"k": wrapper(value)}), 0)[0] == {"k": value}
    for bad in (low - 1, high + 1):
        with pytest.raises(LocalProtocolError) as info:
            encode_table({"k": wrapper(bad)}, "basic.properties.headers")
        message = str(info.value)
        assert "basic.properties.headers['k']" in message
        assert wrapper.__name__ in message
        assert repr(letter.decode()) in message


def test_float32_letter_and_value() -> None:
    assert encode_table_body({"k": Float32(0.1)})[2:3] == b"f"
    decoded = decode_table(encode_table({"k": Float32(0.1)}), 0)[0]["k"]
    assert decoded == struct.unpack(">f", struct.pack(">f", 0.1))[0]
    assert Float32(0.5) == 0.5


def test_float32_out_of_range_is_local_protocol_error() -> None:
    with pytest.raises(LocalProtocolError, match=r"headers\['k'\]"):
        encode_table({"k": Float32(1e300)}, "headers")


@pytest.mark.parametrize(
    ("value", "letter"),
    [
        (0, b"I"),
        (-(2**31), b"I"),
        (2**31 - 1, b"I"),
        (2**31, b"l"),
        (-(2**31) - 1, b"l"),
        (2**63 - 1, b"l"),
        (-(2**63), b"l"),
    ],
)
def test_plain_int_picks_I_or_l_by_range(value: int, letter: bytes) -> None:
    assert encode_table_body({"k": value})[2:3] == letter
    assert decode_table(encode_table({"k": value}), 0)[0] == {"k": value}


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_plain_int_beyond_int64_is_refused(value: int) -> None:
    with pytest.raises(LocalProtocolError, match=r"t\['k'\].*64-bit"):
        encode_table({"k": value}, "t")


def test_int_and_str_subclasses_encode_as_their_base() -> None:
    import enum

    class Colour(enum.IntEnum):
        RED = 7

    class Name(str):
        pass

    assert encode_table({"c": Colour.RED, "n": Name("x")}) == encode_table({"c": 7, "n": "x"})


# --------------------------------------------------------------------------- decimals


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (Decimal("0"), b"D\x00\x00\x00\x00\x00"),
        (Decimal("0.000"), b"D\x03\x00\x00\x00\x00"),
        (Decimal("1E+3"), b"D\x00\x00\x00\x03\xe8"),
        (Decimal("1E-255"), b"D\xff\x00\x00\x00\x01"),
        (Decimal("42949.67295"), b"D\x05\xff\xff\xff\xff"),
        (Decimal("2147483648"), b"D\x00\x80\x00\x00\x00"),
    ],
)
def test_decimal_edges(value: Decimal, encoded: bytes) -> None:
    assert encode_table_body({"k": value}) == b"\x01k" + encoded
    decoded = decode_one(encoded)
    assert decoded == value


@pytest.mark.parametrize(
    "value",
    [
        Decimal("-1"),
        Decimal("-0.5"),
        Decimal("4294967296"),
        Decimal("0.4294967296"),
        Decimal("1E-256"),
        Decimal("NaN"),
        Decimal("sNaN"),
        Decimal("Infinity"),
        Decimal("-Infinity"),
    ],
)
def test_decimal_out_of_range_is_refused(value: Decimal) -> None:
    with pytest.raises(LocalProtocolError, match=r"headers\['k'\]: decimal"):
        encode_table({"k": value}, "headers")


def test_decimal_decode_of_max_scale_and_value() -> None:
    assert decode_one(b"D\xff\xff\xff\xff\xff") == Decimal(4294967295).scaleb(-255)


# --------------------------------------------------------------------------- timestamps


def test_naive_datetime_is_utc() -> None:
    naive = datetime(2024, 5, 6, 7, 8, 9)
    aware = naive.replace(tzinfo=UTC)
    assert encode_table({"k": naive}) == encode_table({"k": aware})
    assert decode_table(encode_table({"k": naive}), 0)[0]["k"] == aware


def test_aware_datetime_in_another_zone_is_converted() -> None:
    plus_two = datetime(2024, 5, 6, 9, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    assert encode_table({"k": plus_two}) == encode_table(
        {"k": datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)}
    )


def test_timestamp_drops_sub_second_precision() -> None:
    value = datetime(2024, 5, 6, 7, 8, 9, 999_999, tzinfo=UTC)
    assert decode_table(encode_table({"k": value}), 0)[0]["k"] == value.replace(microsecond=0)


def test_timestamp_before_epoch_is_refused() -> None:
    with pytest.raises(LocalProtocolError, match=r"h\['k'\]: timestamp"):
        encode_table({"k": datetime(1969, 12, 31, 23, 59, 58, tzinfo=UTC)}, "h")


# --------------------------------------------------------------------------- encode errors


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"k": {1, 2}}, "t['k']: cannot encode a value of type set"),
        ({"k": object()}, "t['k']: cannot encode a value of type object"),
        ({"k": [1, {"in": {1}}]}, "t['k'][1]['in']: cannot encode"),
        ({1: "v"}, "t: table keys must be str, got int"),
        ({b"k": "v"}, "t: table keys must be str, got bytes"),
        ({"k" * 256: 1}, "table key longer than 255 bytes"),
        ({"é" * 128: 1}, "table key longer than 255 bytes"),
    ],
)
def test_encode_errors_name_the_path(table: dict[object, object], fragment: str) -> None:
    with pytest.raises(LocalProtocolError) as info:
        encode_table(table, "t")  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert str(info.value).startswith("t")


def test_key_of_255_bytes_is_fine() -> None:
    key = "k" * 255
    assert decode_table(encode_table({key: 1}), 0)[0] == {key: 1}


def test_non_mapping_table_is_refused() -> None:
    with pytest.raises(LocalProtocolError, match="t: must be a mapping"):
        encode_table([("a", 1)], "t")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "table", [pytest.param({"k": "\ud800"}, id="value"), pytest.param({"\ud800": 1}, id="key")]
)
def test_lone_surrogate_is_local_protocol_error(table: dict[str, object]) -> None:
    with pytest.raises(LocalProtocolError):
        encode_table(table, "t")


# --------------------------------------------------------------------------- nesting


def nest(levels: int, kind: str = "F") -> dict[str, object]:
    inner: object = {} if kind == "F" else []
    for _ in range(levels - 1):
        inner = {"n": inner} if kind == "F" else [inner]
    return {"n": inner}


@pytest.mark.parametrize("kind", ["F", "A"])
def test_nesting_up_to_max_round_trips(kind: str) -> None:
    table = nest(MAX_NESTING, kind)
    assert decode_table(encode_table(table), 0)[0] == table


@pytest.mark.parametrize("kind", ["F", "A"])
def test_nesting_beyond_max_is_refused_on_encode(kind: str) -> None:
    with pytest.raises(LocalProtocolError, match=f"nest deeper than {MAX_NESTING}"):
        encode_table(nest(MAX_NESTING + 1, kind), "h")


def deep_bytes(levels: int, kind: bytes = b"F") -> bytes:
    """``levels`` nested tables (or arrays) under one key, built directly as bytes."""
    if kind == b"F":
        # each level: key length, key "n", "F", length of everything inside it
        parts = [b"\x01nF" + struct.pack(">I", 7 * (levels - 1 - d)) for d in range(levels)]
        body = b"".join(parts)
    else:
        # one entry whose value is levels nested arrays: "A" + length of what is inside
        parts = [b"A" + struct.pack(">I", 5 * (levels - 1 - d)) for d in range(levels)]
        body = b"\x01n" + b"".join(parts)
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("kind", [b"F", b"A"])
def test_deep_bytes_helper_matches_the_encoder(kind: bytes) -> None:
    assert deep_bytes(5, kind) == encode_table(nest(5, kind.decode()))


@pytest.mark.parametrize("kind", [b"F", b"A"])
def test_decode_depth_limit_matches_encode_limit(kind: bytes) -> None:
    assert decode_table(deep_bytes(MAX_NESTING, kind), 0)[0] == nest(MAX_NESTING, kind.decode())
    with pytest.raises(RemoteProtocolError) as info:
        decode_table(deep_bytes(MAX_NESTING + 1, kind), 0)
    assert info.value.reply_code == 502


@pytest.mark.parametrize("kind", [b"F", b"A"])
def test_ten_thousand_levels_fail_fast_without_recursion_error(kind: bytes) -> None:
    buf = deep_bytes(10_000, kind)
    started = time.perf_counter()
    with pytest.raises(RemoteProtocolError) as info:
        decode_table(buf, 0)
    assert time.perf_counter() - started < 1.0
    assert info.value.reply_code == 502
    assert str(MAX_NESTING) in str(info.value)


def test_deep_nesting_through_decode_method_and_properties() -> None:
    deep = deep_bytes(10_000)
    payload = spec.QueueDeclare.PREFIX + b"\x00\x00" + b"\x01q" + b"\x00" + deep
    with pytest.raises(RemoteProtocolError) as info:
        spec.decode_method(payload)
    assert info.value.reply_code == 502
    with pytest.raises(RemoteProtocolError):
        spec.BasicProperties.decode(b"\x20\x00" + deep, 0)


# --------------------------------------------------------------------------- properties

KEYS = st.text(max_size=12)
LEAVES = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.none(),
    st.binary(max_size=20),
)


def values(depth: int) -> st.SearchStrategy[object]:
    if depth == 0:
        return LEAVES
    child = values(depth - 1)
    return st.one_of(
        LEAVES,
        st.lists(child, max_size=3),
        st.dictionaries(KEYS, child, max_size=3),
    )


@SETTINGS
@given(st.dictionaries(KEYS, values(4), max_size=5))
def test_plain_values_round_trip(table: dict[str, object]) -> None:
    encoded = encode_table(table)
    decoded, end = decode_table(encoded, 0)
    assert end == len(encoded)
    assert decoded == table
    # and the encoding is canonical: decoding then encoding gives the same bytes
    assert encode_table(decoded) == encoded


TYPED = st.one_of(
    st.integers(-(2**7), 2**7 - 1).map(Int8),
    st.integers(0, 2**8 - 1).map(UInt8),
    st.integers(-(2**15), 2**15 - 1).map(Int16),
    st.integers(0, 2**16 - 1).map(UInt16),
    st.integers(-(2**31), 2**31 - 1).map(Int32),
    st.integers(0, 2**32 - 1).map(UInt32),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(width=32, allow_nan=False).map(Float32),
    st.decimals(min_value=0, max_value=2**32 - 1, places=0, allow_nan=False),
    st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)
    ).map(lambda d: d.replace(microsecond=0)),
)


@SETTINGS
@given(st.lists(TYPED, max_size=8))
def test_typed_values_round_trip_in_arrays(items: list[object]) -> None:
    table = {"a": items}
    assert decode_table(encode_table(table), 0)[0] == table
