"""Fuzz target: hostile bytes into an open ``ConnectionProtocol``.

The property, for any byte string the "broker" sends after a completed handshake with
channel 1 open, fed in chunks of any size:

* ``receive_data`` never raises (the receive path's contract);
* the connection is OPEN, CLOSING or CLOSED afterwards, and when it failed, the reason is a
  :class:`RemoteProtocolError` whose reply code is one of :data:`ALLOWED_CODES`, and the
  ``connection.close`` it queued carries that code;
* the reader holds back less than ``frame_max`` bytes (memory is bounded).

``check(data, chunk)`` is the property; :func:`frames` and :func:`field_tables` are
hypothesis strategies that build plausible traffic (real method prefixes, content headers
with random field tables, bodies, heartbeats, bit flips and truncations). The unit suite
runs them briefly (``test_fuzz_protocol.py``); long runs go through this module::

    # hypothesis, extended run (N examples, or until S seconds have passed)
    .venv/bin/python -m tests.security.fuzz_frames hypothesis --examples 200000 --seconds 3600

    # atheris (coverage-guided; pip install atheris), libFuzzer options after the name
    .venv/bin/python -m tests.security.fuzz_frames atheris -max_total_time=3600

docs/security.md records how long each ran clean.
"""

from __future__ import annotations

import struct
import sys
import time
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from rabbitry.exceptions import RemoteProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol.connection import ConnectionProtocol, ConnectionState
from rabbitry.protocol.frames import (
    FRAME_METHOD,
    FrameReader,
    encode_table,
    method_frame,
)

#: Reply codes the client may close with when the broker breaks the protocol.
ALLOWED_CODES = frozenset({501, 502, 503, 504, 505, 530, 540})
FRAME_MAX = 131072
_HEAD = struct.Struct(">BHI")

_STATES = (ConnectionState.OPEN, ConnectionState.CLOSING, ConnectionState.CLOSED)


def opened_protocol() -> ConnectionProtocol:
    """A client protocol after start / tune / open-ok, with channel 1 open."""
    proto = ConnectionProtocol(heartbeat=0, max_message_size=1 << 20)
    proto.data_to_send()
    proto.receive_data(
        method_frame(
            0,
            spec.ConnectionStart(
                server_properties={"product": "fuzz"}, mechanisms=b"PLAIN", locales=b"en_US"
            ),
        )
    )
    proto.receive_data(
        method_frame(0, spec.ConnectionTune(channel_max=16, frame_max=FRAME_MAX, heartbeat=0))
    )
    proto.receive_data(method_frame(0, spec.ConnectionOpenOk()))
    proto.open_channel(1)
    proto.receive_data(method_frame(1, spec.ChannelOpenOk()))
    proto.data_to_send()
    proto.events_received()
    assert proto.state is ConnectionState.OPEN and 1 in proto.channels
    return proto


def _sent_closes(data: bytes) -> list[int]:
    codes = []
    for kind, channel, payload in FrameReader(0).feed(data):
        if kind == FRAME_METHOD and channel == 0:
            method = spec.decode_method(payload)
            if type(method) is spec.ConnectionClose:
                codes.append(method.reply_code)
    return codes


def check(data: bytes, chunk: int = 0) -> None:
    """The property (see the module docstring); raises AssertionError on a violation."""
    proto = opened_protocol()
    if chunk <= 0:
        proto.receive_data(data)
    else:
        for start in range(0, len(data), chunk):
            proto.receive_data(data[start : start + chunk])
    out = proto.data_to_send()
    proto.events_received()
    assert proto.state in _STATES, proto.state
    assert proto._reader.buffered < FRAME_MAX, proto._reader.buffered
    if proto.state is not ConnectionState.OPEN:
        exc = proto.close_exc
        assert isinstance(exc, RemoteProtocolError), repr(exc)
        assert exc.reply_code in ALLOWED_CODES, repr(exc)
        assert _sent_closes(out) == [exc.reply_code], (_sent_closes(out), exc)
    else:
        assert _sent_closes(out) == []


# --------------------------------------------------------------------------- strategies

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ).map(lambda d: d.replace(microsecond=0)),
    st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=0, max_value=1000),
)


def _table_values() -> st.SearchStrategy[Any]:
    return st.recursive(
        _scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )


def field_tables() -> st.SearchStrategy[bytes]:
    """Encoded field tables (length prefix included), valid or with a random tail cut."""

    valid = st.dictionaries(st.text(max_size=8), _table_values(), max_size=6).map(encode_table)
    return st.one_of(
        valid,
        st.tuples(valid, st.integers(0, 64)).map(lambda t: t[0][: max(0, len(t[0]) - t[1])]),
        st.binary(max_size=64).map(lambda b: struct.pack(">I", len(b)) + b),
        st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">I", n)),
    )


_PREFIXES = [cls.PREFIX for cls in spec.METHODS.values()]


def _frame(kind: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return _HEAD.pack(kind, channel, len(payload)) + payload + bytes([end])


def frames() -> st.SearchStrategy[bytes]:
    """One plausible-but-hostile frame."""
    channels = st.sampled_from([0, 1, 1, 1, 2, 65535])
    method = st.tuples(channels, st.sampled_from(_PREFIXES), st.binary(max_size=40)).map(
        lambda t: _frame(1, t[0], t[1] + t[2])
    )
    header = st.tuples(
        channels, st.integers(0, 2**64 - 1) | st.integers(0, 64), field_tables()
    ).map(lambda t: _frame(2, t[0], struct.pack(">HHQH", 60, 0, t[1], 0x2000) + t[2]))
    body = st.tuples(channels, st.binary(max_size=64)).map(lambda t: _frame(3, *t))
    heartbeat = channels.map(lambda ch: _frame(8, ch, b""))
    deliver = st.just(
        _frame(
            1,
            1,
            spec.BasicDeliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q").PREFIX
            + spec.BasicDeliver(
                consumer_tag="c", delivery_tag=1, exchange="", routing_key="q"
            ).encode(),
        )
    )
    raw = st.tuples(
        st.integers(0, 255), channels, st.binary(max_size=40), st.sampled_from([0xCE, 0xCE, 0])
    ).map(lambda t: _frame(*t))
    huge = st.tuples(st.integers(0, 255), channels, st.integers(FRAME_MAX - 7, 2**32 - 1)).map(
        lambda t: _HEAD.pack(*t)
    )
    return st.one_of(method, header, body, heartbeat, deliver, raw, huge)


def streams() -> st.SearchStrategy[tuple[bytes, int]]:
    """(bytes, chunk size): a few frames, maybe bit-flipped or truncated."""

    def mutate(t: tuple[list[bytes], int, int, int]) -> bytes:
        parts, flip_at, flip_bits, cut = t
        data = bytearray(b"".join(parts))
        if data and flip_bits:
            data[flip_at % len(data)] ^= flip_bits
        return bytes(data[: len(data) - cut] if cut < len(data) else data)

    data = st.tuples(
        st.lists(frames(), min_size=1, max_size=6),
        st.integers(0, 10_000),
        st.integers(0, 255),
        st.integers(0, 8),
    ).map(mutate)
    return st.tuples(data, st.sampled_from([0, 0, 1, 7, 8, 100]))


# --------------------------------------------------------------------------- runners


def _run_hypothesis(examples: int, seconds: float) -> int:
    """Batches of fresh random examples until ``examples`` ran or ``seconds`` passed
    (a deadline checked between batches: stopping a hypothesis run from inside the test
    would look like a failure to it)."""
    from hypothesis import HealthCheck, given, settings

    count = 0
    batches = 0
    batch = min(examples, 2000)
    started = time.monotonic()

    @settings(
        max_examples=batch,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(streams())
    def run(case: tuple[bytes, int]) -> None:
        nonlocal count
        check(*case)
        count += 1

    while count < examples and time.monotonic() - started < seconds:
        run()  # raises (with the shrunk input) on a violation
        batches += 1
    elapsed = time.monotonic() - started
    print(f"hypothesis: {count} inputs in {batches} batches clean in {elapsed:.0f} s")
    return 0


def _run_atheris(argv: list[str]) -> int:
    import atheris  # type: ignore[import-not-found]

    def one_input(data: bytes) -> None:
        chunk = data[0] if data else 0
        check(data[1:], chunk)

    atheris.instrument_all()  # coverage feedback from every loaded module (rabbitry too)
    atheris.Setup([sys.argv[0], *argv], one_input)
    atheris.Fuzz()
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("hypothesis", "atheris"):
        print(__doc__)
        return 2
    if argv[0] == "atheris":
        return _run_atheris(argv[1:])
    examples, seconds = 100_000, 600.0
    rest = argv[1:]
    while rest:
        flag, value, *rest = rest
        if flag == "--examples":
            examples = int(value)
        elif flag == "--seconds":
            seconds = float(value)
        else:
            print(f"unknown option {flag}")
            return 2
    return _run_hypothesis(examples, seconds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
