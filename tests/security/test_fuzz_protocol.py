"""Hypothesis over the whole receive path of an open connection.

The strategies and the property live in ``fuzz_frames.py`` (also the long-run target);
this is the short run that every ``make test`` does. ``tests/unit/protocol/
test_codec_fuzz.py`` fuzzes the codec functions one by one; this feeds whole hostile
streams (method/header/body/heartbeat frames, field tables, bit flips, truncations, 4 GiB
length prefixes) through ``ConnectionProtocol.receive_data`` in chunks of any size.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.security.fuzz_frames import check, field_tables, streams

from rabbitry.protocol import spec

FUZZ = settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(streams())
def test_hostile_streams_close_with_an_allowed_code(case: tuple[bytes, int]) -> None:
    check(*case)


@FUZZ
@given(field_tables(), st.sampled_from([0, 1, 13]))
def test_field_tables_in_a_content_header(table: bytes, chunk: int) -> None:
    deliver = spec.BasicDeliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    payload = deliver.PREFIX + deliver.encode()
    method = struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"
    header_payload = struct.pack(">HHQH", 60, 0, 0, 0x2000) + table
    header = struct.pack(">BHI", 2, 1, len(header_payload)) + header_payload + b"\xce"
    check(method + header, chunk)


@pytest.mark.parametrize("chunk", [0, 1, 3])
def test_known_hostile_inputs(chunk: int) -> None:
    for data in (
        b"",
        b"\xce" * 20,
        struct.pack(">BHI", 1, 0, 0xFFFFFFFF),
        struct.pack(">BHI", 8, 1, 0) + b"\xce",
        b"AMQP\x00\x00\x09\x01",
    ):
        check(data, chunk)
