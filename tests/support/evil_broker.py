"""A malicious AMQP 0-9-1 "broker": a scripted handshake, then one attack.

A client must survive a hostile peer. :class:`EvilBroker` listens on
``127.0.0.1:0`` with its own event loop in a daemon thread (like ``proxy.py`` and
``tests/unit/fake_broker.py``), speaks just enough AMQP for a real
:class:`rabbitry.AsyncConnection` or :class:`rabbitry.Connection` to connect (and, if the
scenario asks for it, open channel 1), then writes the attack bytes of its
:class:`Scenario` and only *listens*: every frame the client sends is decoded and
recorded, so a test can assert the reply code of the ``connection.close`` the client
sent. By default the broker answers that close with ``close-ok`` (so the client ends
promptly); ``answer_close=False`` leaves it hanging, to prove the client's own deadline.

The attacks are plain bytes built by the helpers below (``frame``, ``nested_tables``,
...), never through rabbitry's encoder, so a bug in the encoder cannot hide one.

Usage::

    with EvilBroker(Scenario("bad-frame-end", attack=frame(1, 0, b"...", end=0))) as evil:
        conn = rabbitry.AsyncConnection(evil.url)
        ...
        close = evil.wait_client_close()   # the connection.close the client sent
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rabbitry.protocol import spec
from rabbitry.protocol.frames import FRAME_METHOD, PROTOCOL_HEADER, FrameReader, Method

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "EvilBroker",
    "Scenario",
    "content_header",
    "frame",
    "method_payload",
    "nested_arrays",
    "nested_tables",
]

FRAME_END = 0xCE
_HEAD = struct.Struct(">BHI")


# --------------------------------------------------------------------------- raw bytes


def frame(kind: int, channel: int, payload: bytes, *, end: int = FRAME_END) -> bytes:
    """One frame, with any frame-end octet (and no check of anything)."""
    return _HEAD.pack(kind, channel, len(payload)) + payload + bytes([end])


def method_payload(class_id: int, method_id: int, args: bytes = b"") -> bytes:
    """A method frame payload from raw ids and argument bytes."""
    return struct.pack(">HH", class_id, method_id) + args


def shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


def deliver(channel: int = 1, delivery_tag: int = 1) -> bytes:
    """basic.deliver (60, 60), hand-encoded: consumer-tag, tag, redelivered, exchange, key."""
    args = shortstr("ctag") + struct.pack(">QB", delivery_tag, 0) + shortstr("") + shortstr("q")
    return frame(1, channel, method_payload(60, 60, args))


def content_header(
    channel: int, body_size: int, *, headers_table: bytes | None = None, class_id: int = 60
) -> bytes:
    """A content header frame; ``headers_table`` is the raw ``headers`` field (length
    prefix included) or ``None`` for no properties."""
    flags = 0x2000 if headers_table is not None else 0
    payload = struct.pack(">HHQH", class_id, 0, body_size, flags) + (headers_table or b"")
    return frame(2, channel, payload)


def nested_tables(depth: int) -> bytes:
    """A field table (length prefix included) nesting ``depth`` tables: {"k": {"k": ...}}.

    Built in linear time: each level is ``\\x01 k F <len>`` and level ``d``'s body is
    ``7 * (depth - d)`` bytes long.
    """
    parts = [struct.pack(">I", 7 * depth)]
    parts.extend(b"\x01kF" + struct.pack(">I", 7 * (depth - d - 1)) for d in range(depth))
    return b"".join(parts)


def nested_arrays(depth: int) -> bytes:
    """A field table {"k": [[[...]]]} with ``depth`` nested arrays (``A <len>`` = 5 bytes)."""
    inner = [b"A" + struct.pack(">I", 5 * (depth - d - 1)) for d in range(depth)]
    body = b"\x01k" + b"".join(inner)
    return struct.pack(">I", len(body)) + body


# --------------------------------------------------------------------------- the broker


@dataclass
class Scenario:
    """One attack.

    Attributes:
        name: for test ids and messages.
        attack: bytes written after the handshake (and channel.open-ok when
            ``open_channel``).
        open_channel: wait for the client's channel.open on channel 1 and answer it first.
        heartbeat, frame_max, channel_max: what connection.tune proposes.
        answer_close: reply close-ok to the client's connection.close.
        wait_for_go: hold the attack until the test calls :meth:`EvilBroker.go` (so
            that it cannot share a TCP segment with the handshake's last frame).
    """

    name: str
    attack: bytes = b""
    open_channel: bool = True
    heartbeat: int = 0
    frame_max: int = 131072
    channel_max: int = 2047
    answer_close: bool = True
    wait_for_go: bool = True


async def _new_event() -> asyncio.Event:
    return asyncio.Event()


@dataclass
class _Record:
    frames: list[tuple[int, int, Any]] = field(default_factory=list)
    eof: bool = False


class EvilBroker:
    """A hostile peer; see the module docstring. Use as a context manager."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.connections = 0
        self.attack_sent = threading.Event()
        self._go: asyncio.Event | None = None
        self._record = _Record()
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"evil-broker-{scenario.name}", daemon=True
        )
        self.port = 0
        self.errors: list[BaseException] = []

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> EvilBroker:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._go = self._run(_new_event())
        return self

    def go(self) -> None:
        """Send the attack now (for scenarios with ``wait_for_go``)."""
        assert self._go is not None
        self._loop.call_soon_threadsafe(self._go.set)

    def __exit__(self, *exc_info: object) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            if self._go is not None:
                self._go.set()
            for writer in self._writers:
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            _, stuck = await asyncio.wait(tasks, timeout=5) if tasks else (set(), set())
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)

        self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # ------------------------------------------------------------------ what the client sent

    @property
    def received(self) -> list[tuple[int, int, Any]]:
        """Frames the client sent: ``(type, channel, Method or payload bytes)``."""
        with self._changed:
            return list(self._record.frames)

    def methods(self, cls: type[Method]) -> list[Any]:
        return [m for kind, _, m in self.received if kind == FRAME_METHOD and type(m) is cls]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{self.scenario.name}: the evil broker did not see what was expected; "
                        f"it received {self._record.frames!r}"
                    )
                self._changed.wait(left)

    def wait_client_close(self, timeout: float = 10.0) -> spec.ConnectionClose:
        """The connection.close the client sent (waits for it)."""
        self.wait_for(lambda: bool(self.methods(spec.ConnectionClose)), timeout)
        close: spec.ConnectionClose = self.methods(spec.ConnectionClose)[0]
        return close

    def wait_eof(self, timeout: float = 10.0) -> None:
        """Wait until the client closed its socket."""
        self.wait_for(lambda: self._record.eof, timeout)

    # ------------------------------------------------------------------ the script

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        scenario = self.scenario
        frames = FrameReader(0)  # the client is trusted to send sane frames
        pending: list[tuple[int, int, Any]] = []

        async def next_frame() -> tuple[int, int, Any]:
            while not pending:
                data = await reader.read(65536)
                if not data:
                    raise EOFError
                for kind, channel, payload in frames.feed(data):
                    item: tuple[int, int, Any] = (
                        kind,
                        channel,
                        spec.decode_method(payload) if kind == FRAME_METHOD else payload,
                    )
                    with self._changed:
                        self._record.frames.append(item)
                        self._changed.notify_all()
                    pending.append(item)
            return pending.pop(0)

        async def expect(cls: type[Method], channel: int = 0) -> None:
            while True:
                kind, ch, method = await next_frame()
                if kind == FRAME_METHOD and ch == channel and type(method) is cls:
                    return

        def send(channel: int, method: Method) -> None:
            payload = struct.pack(">HH", method.CLASS_ID, method.METHOD_ID) + method.encode()
            writer.write(frame(1, channel, payload))

        try:
            header = await reader.readexactly(8)
            if header != PROTOCOL_HEADER:
                writer.close()
                return
            send(
                0,
                spec.ConnectionStart(
                    version_major=0,
                    version_minor=9,
                    server_properties={"product": "evil", "capabilities": {}},
                    mechanisms=b"PLAIN AMQPLAIN",
                    locales=b"en_US",
                ),
            )
            await expect(spec.ConnectionStartOk)
            send(
                0,
                spec.ConnectionTune(
                    channel_max=scenario.channel_max,
                    frame_max=scenario.frame_max,
                    heartbeat=scenario.heartbeat,
                ),
            )
            await expect(spec.ConnectionTuneOk)
            await expect(spec.ConnectionOpen)
            send(0, spec.ConnectionOpenOk())
            if scenario.open_channel:
                await expect(spec.ChannelOpen, 1)
                send(1, spec.ChannelOpenOk())
            await writer.drain()
            if scenario.wait_for_go:
                assert self._go is not None
                await self._go.wait()
            if scenario.attack:
                writer.write(scenario.attack)
                await writer.drain()
            self.attack_sent.set()
            while True:  # listen, and answer the client's close if the scenario says so
                _, channel, method = await next_frame()
                if channel == 0 and type(method) is spec.ConnectionClose and scenario.answer_close:
                    send(0, spec.ConnectionCloseOk())
                    await writer.drain()
        except (EOFError, asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return  # shutdown; asyncio's stream callback must not see a cancelled task
        except BaseException as exc:  # a bug in the script: make the test see it
            self.errors.append(exc)
        finally:
            with self._changed:
                self._record.eof = True
                self._changed.notify_all()
            writer.transport.abort()
