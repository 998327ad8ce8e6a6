"""The collaborators of the asyncio engine's connection, each on its own.

:class:`SocketIO` (corked writes) with its :class:`ReadFlow` (read back-pressure), the
:class:`EventDispatcher` (held deliveries while reading is paused) and the
:class:`ConnectionLifecycle` (which endings recovery heals), driven with stand-ins for
the protocol object, the transport and the channels.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from rabbitry.aio._connection_state import ConnectionLifecycle
from rabbitry.aio._dispatch import EventDispatcher
from rabbitry.aio._socket import SocketIO
from rabbitry.aio._timers import Timers
from rabbitry.exceptions import ConnectionClosedByBroker, ConnectionClosedByClient, ConnectionLost
from rabbitry.protocol.connection import ConnectionState
from rabbitry.protocol.events import ConnectionTerminated, Delivery, Event
from rabbitry.recovery import DEFAULT_RECOVERY, State


class FakeProto:
    """The members of ConnectionProtocol that the socket side uses."""

    def __init__(self) -> None:
        self.send_queue: list[bytes] = []
        self.rx_paused = False
        self.state = ConnectionState.OPEN

    def buffers_to_send(self) -> list[bytes]:
        out, self.send_queue = self.send_queue, []
        return out


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class FakeHooks:
    def __init__(self) -> None:
        self.waiting = False
        self.delivered: list[object] = []

    def awaits_reply(self) -> bool:
        return self.waiting

    def on_delivery(self, message: object) -> None:
        self.delivered.append(message)


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def handle(self, events: list[Event]) -> None:
        self.events.extend(events)

    def protocol_closing(self) -> None:
        raise AssertionError("not closing")


def _socket(channels: dict[int, Any]) -> tuple[SocketIO, FakeProto, FakeTransport]:
    io = SocketIO(channels)
    io.loop = asyncio.get_running_loop()
    io.sink = Sink()
    proto, transport = FakeProto(), FakeTransport()
    io.proto = cast("Any", proto)
    io.transport = cast("Any", transport)
    return io, proto, transport


async def test_the_first_frames_of_a_pass_leave_at_once_the_rest_in_one_write() -> None:
    io, proto, transport = _socket({})
    proto.send_queue.append(b"a")
    io.kick()
    assert transport.written == [b"a"]
    proto.send_queue.extend([b"b", b"c"])
    io.kick()
    io.kick()
    assert transport.written == [b"a"]  # corked until the scheduled flush
    await asyncio.sleep(0)
    assert transport.written == [b"a", b"bc"]


async def test_a_batch_writes_once_at_its_end() -> None:
    io, proto, transport = _socket({})
    io.begin_batch()
    for piece in (b"x", b"y"):
        proto.send_queue.append(piece)
        io.kick()
    assert transport.written == []
    io.end_batch()
    assert transport.written == [b"xy"]


async def test_read_pauses_are_counted_and_a_reply_awaited_is_read() -> None:
    hooks = FakeHooks()
    io, proto, transport = _socket({1: hooks})
    flow = io.flow
    flow.pause()
    flow.pause()
    assert not transport.reading and proto.rx_paused
    flow.resume()
    assert not transport.reading  # one pause still held
    hooks.waiting = True
    flow.recheck()
    assert transport.reading  # a channel waits for a reply: read on
    hooks.waiting = False
    flow.recheck()
    assert not transport.reading
    flow.resume()
    assert transport.reading and not proto.rx_paused
    flow.resume()  # more releases than pauses: ignored
    assert flow.pauses == 0


async def test_deliveries_after_a_full_queue_wait_for_the_release() -> None:
    hooks = FakeHooks()
    channels: dict[int, Any] = {1: hooks}
    io, _proto, _transport = _socket(channels)
    dispatch = EventDispatcher(io, Timers(io), channels)
    io.sink = dispatch
    events: list[Event] = [Delivery(1, cast("Any", f"m{number}")) for number in range(3)]
    io.flow.pause()
    dispatch.handle(events)
    assert hooks.delivered == ["m0"]
    assert io.flow.held == events[1:]
    io.flow.resume()
    await asyncio.sleep(0)
    assert hooks.delivered == ["m0", "m1", "m2"]
    assert io.flow.held == []


class Owner:
    def __init__(self) -> None:
        self.params: Any = None
        self.close_exc: Any = None
        self.recovery: Any = DEFAULT_RECOVERY


@pytest.mark.parametrize(
    ("state", "exc", "recovered"),
    [
        (State.OPEN, ConnectionLost("gone"), True),
        (State.OPEN, ConnectionClosedByClient(200, "bye"), False),
        (State.RECOVERING, ConnectionClosedByBroker(320, "forced"), True),
        (State.CONNECTING, ConnectionLost("gone"), False),
    ],
)
async def test_the_lifecycle_recovers_only_a_recoverable_end_of_an_open_connection(
    state: State, exc: Any, recovered: bool
) -> None:
    io, _proto, _transport = _socket({})
    timers = Timers(io)
    dispatch = EventDispatcher(io, timers, {})
    owner = Owner()
    life = ConnectionLifecycle(owner, io, timers, dispatch)
    life.state = state
    events: list[Event] = [ConnectionTerminated(exc)]
    assert (life.dropped_cause(events) is exc) is recovered
    life.closing = True
    assert life.dropped_cause(events) is None
    owner.recovery = None
    life.closing = False
    assert life.dropped_cause(events) is None
