"""Field-table types against RabbitMQ itself and against another client (pika).

rabbitry follows RabbitMQ's reading of the type letters (``s`` int16, ``l`` int64,
``x`` byte array...). These tests check that reading three ways: rabbitry reads its own
headers back exactly; pika, an independent decoder, reads what rabbitry sent (and the
reverse); and RabbitMQ's headers exchange matches typed values against plain ones,
which only works if the broker decoded our letters as we meant them. The type RabbitMQ
parsed for each letter is checked directly as well, through ``rabbitmqctl``.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pika
import pika.data
import pika.exceptions
import pytest
from tests.support.broker_ctl import rabbitmqctl

from rabbitry import (
    AsyncChannel,
    AsyncConnection,
    Float32,
    Int8,
    Int16,
    Int32,
    Int64,
    Properties,
    UInt8,
    UInt16,
    UInt32,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(30)

WAIT = 5.0

#: One header per RabbitMQ type letter, keyed by the letter.
SENT: dict[str, Any] = {
    "t": True,
    "b": Int8(-5),
    "B": UInt8(200),
    "s": Int16(-300),
    "u": UInt16(60000),
    "I": Int32(-70000),
    "i": UInt32(4000000000),
    "l": Int64(-(2**40)),
    "f": Float32(1.5),
    "d": 2.25,
    "D": Decimal("12.34"),
    "S": "text é",
    "A": [1, "a", [2]],
    "T": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
    "F": {"n": {"m": 1}},
    "V": None,
    "x": b"\x00\xff bytes",
}

#: The Python type rabbitry decodes each letter to.
DECODED_TYPE: dict[str, type] = {
    "t": bool,
    "b": int,
    "B": int,
    "s": int,
    "u": int,
    "I": int,
    "i": int,
    "l": int,
    "f": float,
    "d": float,
    "D": Decimal,
    "S": str,
    "A": list,
    "T": datetime,
    "F": dict,
    "V": type(None),
    "x": bytes,
}

#: What RabbitMQ 3.x calls each letter once parsed (rabbit_binary_parser).
RABBIT_TYPE: dict[str, str] = {
    "t": "bool",
    "b": "byte",
    "B": "unsignedbyte",
    "s": "short",
    "u": "unsignedshort",
    "I": "signedint",
    "i": "unsignedint",
    "l": "long",
    "f": "float",
    "d": "double",
    "D": "decimal",
    "S": "longstr",
    "A": "array",
    "T": "timestamp",
    "F": "table",
    "V": "void",
    "x": "binary",
}

#: Where pika 1.4.4 reads a value differently from RabbitMQ (and rabbitry).
#: pika/data.py decodes ``f`` and ``d`` with ``long(struct.unpack_from(...))``, i.e. it
#: truncates every float and double to an int; RabbitMQ parses them as float/double
#: (see the binding types checked below). Everything else pika reads as we do,
#: including ``s`` as signed 16-bit, ``u``/``i`` as unsigned and ``x`` as bytes.
PIKA_READS_DIFFERENTLY: dict[str, Any] = {"f": 1, "d": 2}


def _pika_call(url: str, work: Callable[[Any], Any]) -> Any:
    """Run ``work(channel)`` on a fresh pika BlockingConnection (in this thread)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return work(connection.channel())
    finally:
        connection.close()


async def pika_call(url: str, work: Callable[[Any], Any]) -> Any:
    """Run blocking pika code off the event loop."""
    return await asyncio.to_thread(_pika_call, url, work)


async def wait_ready(ch: AsyncChannel, queue: str, expected: int) -> None:
    """Poll a passive declare until ``queue`` holds ``expected`` ready messages."""
    count = None
    async with asyncio.timeout(WAIT):
        while (count := (await ch.queue_declare(queue, passive=True)).message_count) != expected:
            await asyncio.sleep(0.01)
    assert count == expected


# --------------------------------------------------------------------------- rabbitry -> *


async def test_rabbitry_headers_read_back_by_rabbitry_and_pika(
    url: str, channel: AsyncChannel, names: Names, broker_version: tuple[int, ...]
) -> None:
    """Version-specific: RabbitMQ 3.x passes the headers table through as sent; 4.x
    re-encodes it with the keys sorted (bytewise). Values and types are the same."""
    queue = names.queue()
    await channel.queue_declare(queue)
    await channel.confirm_select()
    for body in (b"for-rabbitry", b"for-pika"):
        future = await channel.basic_publish("", queue, body, properties=Properties(headers=SENT))
        assert future is not None
        async with asyncio.timeout(WAIT):
            await future

    # rabbitry reading its own message: exactly what was sent, in the decoded types.
    mine = await channel.basic_get(queue, no_ack=True)
    assert mine is not None
    assert mine.body == b"for-rabbitry"
    got = mine.headers
    assert list(got) == (sorted(SENT) if broker_version >= (4,) else list(SENT))
    for letter, value in SENT.items():
        assert got[letter] == value, letter
        assert type(got[letter]) is DECODED_TYPE[letter], letter
    assert got == SENT
    assert got["T"].utcoffset() == timedelta(0)
    assert got["A"] == [1, "a", [2]]
    assert got["F"] == {"n": {"m": 1}}

    # pika reading the same headers (the broker passes the content header through).
    def pika_get(ch: Any) -> tuple[bytes, dict[str, Any]]:
        method, properties, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None, "pika found the queue empty"
        return body, properties.headers

    body, theirs = await pika_call(url, pika_get)
    assert body == b"for-pika"
    assert set(theirs) == set(SENT)
    for letter, value in SENT.items():
        expected = PIKA_READS_DIFFERENTLY.get(letter, value)
        assert theirs[letter] == expected, letter
    assert type(theirs["x"]) is bytes
    assert theirs["T"] == SENT["T"]


async def test_rabbitry_float_headers_keep_their_precision(
    channel: AsyncChannel, names: Names
) -> None:
    """Float32 rounds to single precision; a plain float is sent as a double."""
    queue = names.queue()
    await channel.queue_declare(queue)
    headers = {"f": Float32(0.1), "d": 0.1, "big": 2**63 - 1, "small": -(2**63)}
    await channel.basic_publish("", queue, b"", properties=Properties(headers=headers))
    await wait_ready(channel, queue, 1)
    message = await channel.basic_get(queue, no_ack=True)
    assert message is not None
    got = message.headers
    assert got["d"] == 0.1
    assert got["f"] != 0.1
    assert got["f"] == pytest.approx(0.1, rel=1e-7)
    assert (got["big"], got["small"]) == (2**63 - 1, -(2**63))


# --------------------------------------------------------------------------- pika -> *

#: Every kind of value pika 1.4.4 can encode. pika cannot encode floats at all
#: (UnsupportedAMQPFieldException, asserted below) and sends every int as ``l``.
#: It packs a Decimal's unscaled value as *signed* 32-bit while RabbitMQ and the spec
#: read it as unsigned, so only non-negative decimals mean the same to both.
PIKA_SENT: dict[str, Any] = {
    "true": True,
    "false": False,
    "small": 7,
    "negative": -5,
    "large": 2**40,
    "decimal": Decimal("3.14"),
    "decimal_whole": Decimal(100),
    "str": "héllo wörld",
    "empty": "",
    "bytes": b"\x00\x01\xff",
    "list": [1, "x", [True, None], {"k": "v"}],
    "dict": {"a": {"b": 2}, "c": []},
    "timestamp": datetime(2023, 6, 7, 8, 9, 10, tzinfo=UTC),
    "none": None,
}


def test_pika_cannot_encode_floats() -> None:
    """Why PIKA_SENT has no float: documents the pika limitation the test relies on."""
    with pytest.raises(pika.exceptions.UnsupportedAMQPFieldException):
        pika.data.encode_table([], {"f": 1.5})


async def test_pika_headers_read_by_rabbitry_as_pika_reads_them(
    url: str, channel: AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)

    def publish_twice_then_get_one(ch: Any) -> dict[str, Any]:
        ch.confirm_delivery()
        for body in (b"one", b"two"):
            ch.basic_publish("", queue, body, pika.BasicProperties(headers=PIKA_SENT))
        method, properties, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None
        assert body == b"one"
        headers: dict[str, Any] = properties.headers
        return headers

    pika_reading = await pika_call(url, publish_twice_then_get_one)
    message = await channel.basic_get(queue, no_ack=True)
    assert message is not None
    assert message.body == b"two"
    ours = message.headers
    assert set(ours) == set(pika_reading)
    for key, value in pika_reading.items():
        assert ours[key] == value, key
        # pika returns its own int subclass (pika.compat.long) for type l.
        expected_type = int if type(value).__name__ == "long" else type(value)
        assert type(ours[key]) is expected_type, key
    # And both equal what pika was given.
    assert ours == PIKA_SENT
    assert type(ours["bytes"]) is bytes
    assert ours["timestamp"].utcoffset() == timedelta(0)


# --------------------------------------------------------------------------- the broker

#: (typed value as sent by rabbitry, the same value in another encoding or None,
#:  a different value of the same type)
MATCH_CASES: dict[str, tuple[Any, Any, Any]] = {
    "b": (Int8(-5), -5, Int8(-6)),
    "B": (UInt8(200), 200, UInt8(201)),
    "s": (Int16(-300), -300, Int16(300)),
    "u": (UInt16(60000), 60000, UInt16(60001)),
    "I": (Int32(-70000), Int64(-70000), Int32(-70001)),
    "i": (UInt32(4000000000), 4000000000, UInt32(4000000001)),
    "l": (Int64(-(2**40)), -(2**40), Int64(-(2**40) + 1)),  # a plain int is sent as l too
    "f": (Float32(1.5), 1.5, Float32(2.5)),
    "d": (2.25, Float32(2.25), 2.5),
    "D": (Decimal("12.34"), None, Decimal("12.35")),
    "S": ("text é", None, "text e"),
    "t": (True, None, False),
    "x": (b"\x00\xff", None, b"\x00\xfe"),
    "T": (
        datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        1704164645,  # RabbitMQ puts timestamps in the integer type class
        datetime(2024, 1, 2, 3, 4, 6, tzinfo=UTC),
    ),
}


@pytest.mark.parametrize("letter", list(MATCH_CASES))
async def test_headers_exchange_matches_typed_values(
    conn: AsyncConnection, names: Names, letter: str, broker_version: tuple[int, ...]
) -> None:
    """RabbitMQ compares header values by type class (all integers and timestamps
    alike, both float sizes alike) and value, so a typed binding matching a message
    with the value in another encoding proves the broker decoded our letter to the
    same number.

    Version-specific for ``T``: RabbitMQ 4.x turns a message's timestamp header into
    milliseconds before matching but keeps the binding's in seconds, so a timestamp no
    longer matches the same timestamp; the integer seconds still match the binding.
    """
    typed, other_encoding, different = MATCH_CASES[letter]
    ch = await conn.channel()
    await ch.confirm_select()
    exchange = names.exchange()
    queue = names.queue()
    await ch.exchange_declare(exchange, "headers")
    await ch.queue_declare(queue)
    await ch.queue_bind(queue, exchange, arguments={"x-match": "all", "k": typed})

    outcomes: list[tuple[bytes, dict[str, Any], bool]] = [
        (b"same-typed", {"k": typed}, True),
        (b"different", {"k": different}, False),
        (b"missing", {"other": typed}, False),
    ]
    if other_encoding is not None:
        outcomes.append((b"other-encoding", {"k": other_encoding}, True))
    for body, headers, _ in outcomes:
        future = await ch.basic_publish(exchange, "", body, properties=Properties(headers=headers))
        assert future is not None
        async with asyncio.timeout(WAIT):
            await future

    routed = []
    while (message := await ch.basic_get(queue, no_ack=True)) is not None:
        routed.append(message.body)
    expected = [body for body, _, matches in outcomes if matches]
    if letter == "T" and broker_version >= (4,):
        expected = [b"other-encoding"]
    assert routed == expected


async def test_headers_exchange_any_and_void(conn: AsyncConnection, names: Names) -> None:
    ch = await conn.channel()
    await ch.confirm_select()
    exchange = names.exchange()
    queue = names.queue()
    await ch.exchange_declare(exchange, "headers")
    await ch.queue_declare(queue)
    # A void binding value means "present, with any value".
    await ch.queue_bind(
        queue, exchange, arguments={"x-match": "any", "a": Int16(7), "present": None}
    )
    cases = [
        (b"a-matches", {"a": 7}, True),
        (b"present-only", {"present": "whatever"}, True),
        (b"neither", {"a": 8, "absent": None}, False),
    ]
    for body, headers, _ in cases:
        future = await ch.basic_publish(exchange, "", body, properties=Properties(headers=headers))
        assert future is not None
        async with asyncio.timeout(WAIT):
            await future
    routed = []
    while (message := await ch.basic_get(queue, no_ack=True)) is not None:
        routed.append(message.body)
    assert routed == [body for body, _, matches in cases if matches]


def _rabbitmqctl_binding_arguments(url: str, exchange: str) -> str:
    """RabbitMQ's own view of the bindings of ``exchange`` (Erlang terms)."""
    expression = (
        f'rabbit_binding:list_for_source({{resource, <<"/">>, exchange, <<"{exchange}">>}}).'
    )
    text = rabbitmqctl(url, "eval", expression)
    assert exchange in text, text
    return text


async def test_broker_parses_each_letter_as_the_intended_type(
    url: str, channel: AsyncChannel, names: Names
) -> None:
    """Ask RabbitMQ which type it parsed for each binding argument (needs rabbitmqctl
    on this machine, talking to the broker at RABBITMQ_URL; fails without it)."""
    exchange = names.exchange()
    queue = names.queue()
    await channel.exchange_declare(exchange, "headers")
    await channel.queue_declare(queue)
    await channel.queue_bind(queue, exchange, arguments={"x-match": "all", **SENT})
    text = await asyncio.to_thread(_rabbitmqctl_binding_arguments, url, exchange)
    parsed = {
        key: kind
        for key, kind in re.findall(r'\{<<"(\w)">>,(\w+),', text)
        if key in RABBIT_TYPE  # not the keys nested inside "F"
    }
    assert parsed == RABBIT_TYPE
    # A few values as the broker holds them (Erlang terms).
    for letter, term in {
        "b": "-5",
        "B": "200",
        "s": "-300",
        "u": "60000",
        "I": "-70000",
        "i": "4000000000",
        "l": str(-(2**40)),
        "f": "1.5",
        "d": "2.25",
        "D": "{2,1234}",
        "T": "1704164645",
        "t": "true",
    }.items():
        assert re.search(rf'\{{<<"{letter}">>,\w+,{re.escape(term)}\}}', text), letter
