"""A malicious broker cannot crash, hang or bloat the client.

Each scenario lets a real client (``AsyncConnection`` and the threaded ``Connection``)
complete the handshake with :class:`~tests.support.evil_broker.EvilBroker`, open channel
1, then receive one attack. In every case:

* the client sends ``connection.close`` with the reply code the spec asks for (the evil
  broker records it) and the connection ends with a :class:`RemoteProtocolError`
  carrying that code (or, for silence, a :class:`HeartbeatTimeout` within its bound);
* it ends within a deadline, and the Python heap grew by less than ``MEMORY_BOUND``
  while the attack was handled (a 4 GiB length prefix allocates nothing);
* no exception escaped into the event loop, a thread or the log, and no task or thread
  is left behind after ``close()``.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import tracemalloc
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from tests.support.evil_broker import (
    EvilBroker,
    Scenario,
    content_header,
    deliver,
    frame,
    method_payload,
    nested_arrays,
    nested_tables,
)

import rabbitry
from rabbitry.exceptions import (
    ConnectError,
    HeartbeatTimeout,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from rabbitry.protocol import spec

if TYPE_CHECKING:
    import logging

#: A generous deadline that turns a hang into a failure (docs/testing.md, timing policy).
WAIT = 10.0
#: Heap growth allowed while one attack is handled (the largest attack is ~70 KB).
MEMORY_BOUND = 8 * 1024 * 1024
HEARTBEAT = 1
SCHEDULING_MARGIN = 0.5
HEARTBEAT_BOUND = 2 * HEARTBEAT + 1 + SCHEDULING_MARGIN
#: After a framing error the byte stream cannot be trusted, so the broker's close-ok may
#: be lost in the rest of a bad frame: the client then ends the connection by its own
#: close deadline (``CLOSE_TIMEOUT``, 10 s). Every attack must end within this bound;
#: measured 10.01-10.02 s on 2 shared cores with tracemalloc on, hence 2 s of allowance.
CLOSE_BOUND = 10.0 + 4 * SCHEDULING_MARGIN

FRAME_MAX = 131072
_ACK = method_payload(60, 80, struct.pack(">QB", 1, 0))  # basic.ack, hand-encoded


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    reply_code: int  # what the client must send in connection.close

    @property
    def id(self) -> str:
        return self.scenario.name


CASES = [
    Case(
        Scenario("frame-over-frame_max", frame(1, 1, b"\0" * (FRAME_MAX - 8 + 1))),
        501,
    ),
    Case(Scenario("frame-length-4GiB", struct.pack(">BHI", 3, 1, 0xFFFFFFFF) + b"x" * 64), 501),
    Case(Scenario("wrong-frame-end", frame(1, 1, _ACK, end=0x00)), 501),
    Case(Scenario("unknown-frame-type-on-channel", frame(9, 1, b"")), 501),
    Case(Scenario("unknown-frame-type-on-channel-0", frame(9, 0, b"")), 503),
    Case(Scenario("unknown-class-and-method", frame(1, 1, method_payload(9999, 77))), 540),
    Case(Scenario("unknown-method-on-channel-0", frame(1, 0, method_payload(10, 99))), 540),
    Case(Scenario("method-frame-shorter-than-ids", frame(1, 1, b"\x00\x3c")), 502),
    Case(Scenario("method-on-unopened-channel", frame(1, 7, _ACK)), 504),
    Case(Scenario("content-on-unopened-channel", content_header(9, 1)), 504),
    Case(Scenario("content-on-channel-0", content_header(0, 1)), 503),
    Case(
        Scenario(
            "unexpected-method-on-channel-0", frame(1, 0, spec.ConnectionOpenOk.PREFIX + b"\0")
        ),
        503,
    ),
    Case(
        Scenario(
            "unexpected-method-on-channel", frame(1, 1, spec.ChannelOpenOk.PREFIX + b"\0\0\0\0")
        ),
        503,
    ),
    Case(
        Scenario(
            "body-longer-than-header",
            deliver() + content_header(1, 5) + frame(3, 1, b"x" * 10),
        ),
        501,
    ),
    Case(
        Scenario(
            "body-shorter-than-header",
            deliver() + content_header(1, 10) + frame(3, 1, b"x" * 5) + frame(1, 1, _ACK),
        ),
        505,
    ),
    Case(Scenario("body-without-header", deliver() + frame(3, 1, b"x")), 505),
    Case(Scenario("header-without-method", content_header(1, 1)), 505),
    Case(Scenario("header-of-wrong-class", deliver() + content_header(1, 1, class_id=50)), 505),
    Case(
        Scenario(
            "body-size-4GiB-in-header",  # refused before any allocation (max_message_size)
            deliver() + content_header(1, 4 * 1024**3),
        ),
        501,
    ),
    Case(
        Scenario(
            "table-length-4GiB",
            deliver() + content_header(1, 0, headers_table=struct.pack(">I", 0xFFFFFFFF)),
        ),
        502,
    ),
    Case(
        Scenario(
            "tables-nested-10000-deep",
            deliver() + content_header(1, 0, headers_table=nested_tables(10_000)),
        ),
        502,
    ),
    Case(
        Scenario(
            "arrays-nested-10000-deep",
            deliver() + content_header(1, 0, headers_table=nested_arrays(10_000)),
        ),
        502,
    ),
    Case(Scenario("heartbeat-on-channel-1", frame(8, 1, b"")), 501),
]


# --------------------------------------------------------------------------- guards


def _asyncio_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Log records that mean an exception escaped somewhere (asyncio's handler, a
    callback, a thread)."""
    return [r for r in caplog.records if r.exc_info or r.name == "asyncio"]


def _wait_threads(before: set[threading.Thread]) -> set[threading.Thread]:
    deadline = time.monotonic() + WAIT
    while True:
        extra = {t for t in threading.enumerate() if t not in before and t.is_alive()}
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.02)


def _check_result(case: Case, evil: EvilBroker, exc: BaseException, peak: int) -> None:
    assert not evil.errors, evil.errors
    close = evil.wait_client_close()
    assert close.reply_code == case.reply_code, (case.id, close)
    assert isinstance(exc, RemoteProtocolError), (case.id, exc)
    assert isinstance(exc, ProtocolError)
    assert exc.reply_code == case.reply_code, (case.id, exc)
    assert close.reply_text == str(exc)[:255]
    assert peak < MEMORY_BOUND, f"{case.id}: heap grew by {peak} bytes"


# --------------------------------------------------------------------------- asyncio


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_async_client_closes_with_reply_code(
    case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    escaped: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: escaped.append(context))
    tasks_before = asyncio.all_tasks()
    with EvilBroker(case.scenario) as evil:
        threads_before = set(threading.enumerate())
        conn = rabbitry.AsyncConnection(evil.url, recovery=None)
        await conn.connect(timeout=WAIT)
        tracemalloc.start()
        try:
            await conn.channel(timeout=WAIT)
            evil.go()
            started = time.monotonic()
            exc = await conn.wait_closed(CLOSE_BOUND + WAIT)
            elapsed = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await conn.close(timeout=WAIT)
        _check_result(case, evil, exc, peak)
        assert elapsed < CLOSE_BOUND, f"{case.id}: took {elapsed:.1f} s"
        assert not conn.is_open and conn.is_closed
        evil.wait_eof()  # the client closed its socket
        assert _wait_threads(threads_before) == set()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - tasks_before == set()
    assert escaped == []
    assert _asyncio_errors(caplog) == []


async def test_async_truncated_frame_then_silence_ends_by_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Half a frame and then nothing: the heartbeat deadline ends it; no close is sent
    (the peer is presumed dead) and nothing is buffered past the partial frame."""
    scenario = Scenario("truncated-then-silence", frame(1, 1, _ACK)[:5], heartbeat=HEARTBEAT)
    tasks_before = asyncio.all_tasks()
    with EvilBroker(scenario) as evil:
        threads_before = set(threading.enumerate())
        conn = rabbitry.AsyncConnection(evil.url, recovery=None, heartbeat=HEARTBEAT)
        await conn.connect(timeout=WAIT)
        await conn.channel(timeout=WAIT)
        evil.go()
        assert evil.attack_sent.wait(WAIT)
        started = time.monotonic()
        exc = await conn.wait_closed(WAIT)
        elapsed = time.monotonic() - started
        assert isinstance(exc, HeartbeatTimeout), exc
        assert elapsed < HEARTBEAT_BOUND, elapsed
        await conn.close(timeout=WAIT)
        evil.wait_eof()
        assert evil.methods(spec.ConnectionClose) == []
        assert not evil.errors
        assert _wait_threads(threads_before) == set()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - tasks_before == set()
    assert _asyncio_errors(caplog) == []


async def test_async_close_ok_never_comes_is_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker breaks the protocol and then ignores our connection.close: the
    client's own close deadline (10 s) ends the connection anyway."""
    scenario = Scenario("no-close-ok", frame(1, 1, _ACK, end=0x00), answer_close=False)
    with EvilBroker(scenario) as evil:
        conn = rabbitry.AsyncConnection(evil.url, recovery=None)
        await conn.connect(timeout=WAIT)
        await conn.channel(timeout=WAIT)
        evil.go()
        exc = await conn.wait_closed(CLOSE_BOUND + WAIT)
        assert isinstance(exc, RemoteProtocolError) and exc.reply_code == 501
        assert evil.wait_client_close().reply_code == 501
        await conn.close(timeout=WAIT)
        evil.wait_eof()
    assert _asyncio_errors(caplog) == []


async def test_async_frame_max_below_minimum_is_refused() -> None:
    """connection.tune with frame_max 1024 (< FRAME-MIN-SIZE 4096): connect fails with a
    ProtocolError and the socket is dropped."""
    with EvilBroker(
        Scenario("tiny-frame_max", frame_max=1024, open_channel=False, wait_for_go=False)
    ) as evil:
        conn = rabbitry.AsyncConnection(evil.url, recovery=None)
        with pytest.raises(ConnectError) as info:
            await conn.connect(timeout=WAIT)
        cause = info.value.__cause__
        assert isinstance(cause, RemoteProtocolError), cause
        assert "frame_max 1024" in str(cause)
        assert not evil.methods(spec.ConnectionTuneOk)
        evil.wait_eof()
        assert not conn.is_open


async def test_async_channel_max_is_respected() -> None:
    """The broker allows 2 channels: the client says 2 in tune-ok and refuses a third
    before sending anything."""
    with EvilBroker(
        Scenario("channel_max-2", channel_max=2, open_channel=False, wait_for_go=False)
    ) as evil:
        conn = rabbitry.AsyncConnection(evil.url, recovery=None)
        await conn.connect(timeout=WAIT)
        try:
            assert conn.channel_max == 2
            (tune_ok,) = evil.methods(spec.ConnectionTuneOk)
            assert tune_ok.channel_max == 2
            with pytest.raises(LocalProtocolError, match="channel_id"):
                await conn.channel(3, timeout=WAIT)
            sent_before = len(evil.received)
            for channel_id in (1, 2):
                conn._require_open().open_channel(channel_id)  # no broker answer needed
            conn._flush()
            with pytest.raises(LocalProtocolError, match="channel_max"):
                await conn.channel(timeout=WAIT)
            evil.wait_for(lambda: len(evil.methods(spec.ChannelOpen)) == 2)
            assert len(evil.received) == sent_before + 2
        finally:
            await conn.close(timeout=1)


async def test_async_max_message_size_enforced_before_allocating() -> None:
    """A header announcing more than max_message_size closes with 501 at once, before any
    body byte arrives."""
    scenario = Scenario("too-large-for-limit", deliver() + content_header(1, 2001))
    with EvilBroker(scenario) as evil:
        conn = rabbitry.AsyncConnection(evil.url, recovery=None, max_message_size=2000)
        await conn.connect(timeout=WAIT)
        await conn.channel(timeout=WAIT)
        evil.go()
        exc = await conn.wait_closed(WAIT)
        assert isinstance(exc, RemoteProtocolError) and exc.reply_code == 501
        assert "max_message_size 2000" in str(exc)
        assert evil.wait_client_close().reply_code == 501
        await conn.close(timeout=WAIT)


# --------------------------------------------------------------------------- threads


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sync_client_closes_with_reply_code(case: Case, caplog: pytest.LogCaptureFixture) -> None:
    with EvilBroker(case.scenario) as evil:
        threads_before = set(threading.enumerate())
        conn = rabbitry.Connection(evil.url, recovery=None)
        conn.connect(timeout=WAIT)
        tracemalloc.start()
        try:
            conn.channel(timeout=WAIT)
            evil.go()
            started = time.monotonic()
            exc = conn.wait_closed(CLOSE_BOUND + WAIT)
            elapsed = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            conn.close(timeout=WAIT)
        _check_result(case, evil, exc, peak)
        assert elapsed < CLOSE_BOUND, f"{case.id}: took {elapsed:.1f} s"
        assert conn.is_closed
        evil.wait_eof()
        assert _wait_threads(threads_before) == set(), "IO or callback thread left behind"
    assert _asyncio_errors(caplog) == []


def test_sync_truncated_frame_then_silence_ends_by_heartbeat() -> None:
    scenario = Scenario("truncated-then-silence", frame(1, 1, _ACK)[:5], heartbeat=HEARTBEAT)
    with EvilBroker(scenario) as evil:
        threads_before = set(threading.enumerate())
        conn = rabbitry.Connection(evil.url, recovery=None, heartbeat=HEARTBEAT)
        conn.connect(timeout=WAIT)
        try:
            conn.channel(timeout=WAIT)
            evil.go()
            assert evil.attack_sent.wait(WAIT)
            started = time.monotonic()
            exc = conn.wait_closed(WAIT)
            assert isinstance(exc, HeartbeatTimeout), exc
            assert time.monotonic() - started < HEARTBEAT_BOUND
        finally:
            conn.close(timeout=WAIT)
        evil.wait_eof()
        assert _wait_threads(threads_before) == set()


def test_sync_frame_max_below_minimum_is_refused() -> None:
    with EvilBroker(
        Scenario("tiny-frame_max", frame_max=1024, open_channel=False, wait_for_go=False)
    ) as evil:
        threads_before = set(threading.enumerate())
        conn = rabbitry.Connection(evil.url, recovery=None)
        with pytest.raises(ConnectError) as info:
            conn.connect(timeout=WAIT)
        assert isinstance(info.value.__cause__, RemoteProtocolError)
        conn.close()
        assert _wait_threads(threads_before) == set()
