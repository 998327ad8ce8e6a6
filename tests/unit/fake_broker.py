"""A scripted AMQP 0-9-1 broker on a loopback socket, for publisher and pool unit tests.

It speaks just enough of the protocol for a real :class:`rabbitry.AsyncConnection` (or
the sync ``Connection``) to connect, open channels, select confirms and publish. It
never confirms by itself unless ``auto_ack`` is set: a test decides what the broker
answers (``ack``, ``nack``, ``return_message``, ``close_channel``, ``block``, ``drop``),
which makes the orderings that are rare on a real broker (a return followed by a
multiple ack, a nack, a confirm that never comes) deterministic.

The broker runs its own event loop in a daemon thread (like ``tests/support/proxy.py``),
so asyncio tests and threaded tests use it the same way; every control method runs on
that loop and returns once the bytes are written.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rabbitry.protocol import spec
from rabbitry.protocol.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    FrameReader,
    Method,
    content_frames,
    method_frame,
)

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["FakeBroker", "Published"]

_HHQ = struct.Struct(">HHQ")


@dataclass
class Published:
    """One basic.publish the broker received."""

    channel: int
    seq: int  # 0 when the channel is not in confirm mode
    exchange: str
    routing_key: str
    mandatory: bool
    properties: spec.BasicProperties
    body: bytes


@dataclass
class _Channel:
    confirm: bool = False
    seq: int = 0
    closing: bool = False


@dataclass
class _Conn:
    writer: asyncio.StreamWriter
    channels: dict[int, _Channel] = field(default_factory=dict)
    methods: list[tuple[int, Method]] = field(default_factory=list)


class FakeBroker:
    """A scripted broker. Use as a context manager; ``url`` is where it listens.

    Args:
        auto_ack: ack every publish on a confirm channel as soon as it arrives.

    ``hold_confirm_select``: while True, confirm.select puts the channel in confirm mode
    but gets no answer; a test sends ``ConfirmSelectOk`` itself when it wants.
    ``hold_channel_open``: while True, channel.open opens the channel but gets no answer.
    """

    def __init__(self, *, auto_ack: bool = False) -> None:
        self.auto_ack = auto_ack
        #: Answer connection.close with close-ok (False: a peer that never does).
        self.answer_close = True
        self.hold_confirm_select = False
        self.hold_channel_open = False
        self.published: list[Published] = []
        self.methods: list[tuple[int, Method]] = []
        self.connections = 0
        self._conn: _Conn | None = None
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._changed = threading.Condition()
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeBroker:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            if self._conn is not None:
                self._conn.writer.transport.abort()
            await asyncio.sleep(0)

        self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()

        return self._run(run())

    # ------------------------------------------------------------------ waiting

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Block until ``predicate()`` holds (checked after every received frame)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("the fake broker did not see what was expected")
                self._changed.wait(left)

    def wait_published(self, count: int, timeout: float = 5.0) -> list[Published]:
        self.wait_for(lambda: len(self.published) >= count, timeout)
        return list(self.published)

    def sent(self, method_class: type[Method]) -> list[tuple[int, Method]]:
        """Methods of that class received so far, with their channel."""
        return [(ch, m) for ch, m in self.methods if type(m) is method_class]

    # ------------------------------------------------------------------ scripted answers

    def send(self, channel: int, method: Method) -> None:
        self._call(lambda: self._write(method_frame(channel, method)))

    def ack(self, seq: int, *, multiple: bool = False, channel: int | None = None) -> None:
        self.send(self._channel(channel), spec.BasicAck(delivery_tag=seq, multiple=multiple))

    def nack(self, seq: int, *, multiple: bool = False, channel: int | None = None) -> None:
        method = spec.BasicNack(delivery_tag=seq, multiple=multiple, requeue=False)
        self.send(self._channel(channel), method)

    def return_message(self, published: Published, code: int = 312, text: str = "NO_ROUTE") -> None:
        """basic.return of a publish, with its properties and body."""
        method = spec.BasicReturn(
            reply_code=code,
            reply_text=text,
            exchange=published.exchange,
            routing_key=published.routing_key,
        )
        frames = content_frames(
            published.channel, 60, published.properties.encode(), published.body, 131072
        )
        data = method_frame(published.channel, method) + b"".join(frames)
        self._call(lambda: self._write(data))

    def return_then_ack(self, published: Published, *, multiple: bool = False) -> None:
        """A return and the ack that follows it, in one write (as RabbitMQ does)."""
        method = spec.BasicReturn(
            reply_code=312,
            reply_text="NO_ROUTE",
            exchange=published.exchange,
            routing_key=published.routing_key,
        )
        frames = content_frames(
            published.channel, 60, published.properties.encode(), published.body, 131072
        )
        ack = spec.BasicAck(delivery_tag=published.seq, multiple=multiple)
        data = (
            method_frame(published.channel, method)
            + b"".join(frames)
            + method_frame(published.channel, ack)
        )
        self._call(lambda: self._write(data))

    def close_channel(
        self, channel: int, code: int = 404, text: str = "NOT_FOUND - no exchange 'x'"
    ) -> None:
        method = spec.ChannelClose(reply_code=code, reply_text=text, class_id=60, method_id=40)

        def run() -> None:
            assert self._conn is not None
            self._conn.channels.setdefault(channel, _Channel()).closing = True
            self._write(method_frame(channel, method))

        self._call(run)

    def get_ok(
        self,
        channel: int,
        delivery_tag: int,
        body: bytes,
        *,
        then_close: tuple[int, str] | None = None,
    ) -> None:
        """basic.get-ok with ``body``; with ``then_close`` (code, text), a connection.close
        follows in the same write, so the client reads both at once."""
        method = spec.BasicGetOk(
            delivery_tag=delivery_tag,
            redelivered=False,
            exchange="",
            routing_key="q",
            message_count=0,
        )
        frames = content_frames(channel, 60, spec.BasicProperties().encode(), body, 131072)
        data = method_frame(channel, method) + b"".join(frames)
        if then_close is not None:
            code, text = then_close
            close = spec.ConnectionClose(reply_code=code, reply_text=text, class_id=0, method_id=0)
            data += method_frame(0, close)
        self._call(lambda: self._write(data))

    def block(self, reason: str = "low on memory") -> None:
        self.send(0, spec.ConnectionBlocked(reason=reason))

    def unblock(self) -> None:
        self.send(0, spec.ConnectionUnblocked())

    def drop(self) -> None:
        """Cut the connection without a close (the client sees a lost connection)."""

        def run() -> None:
            if self._conn is not None:
                self._conn.writer.transport.abort()

        self._call(run)

    def _channel(self, channel: int | None) -> int:
        if channel is not None:
            return channel
        assert self.published, "no publish yet: give the channel"
        return self.published[-1].channel

    def _write(self, data: bytes) -> None:
        assert self._conn is not None, "no client connected"
        self._conn.writer.write(data)

    # ------------------------------------------------------------------ serving

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer)
        self._conn = conn
        self.connections += 1
        try:
            header = await reader.readexactly(len(PROTOCOL_HEADER))
            assert header == PROTOCOL_HEADER
            writer.write(
                method_frame(
                    0,
                    spec.ConnectionStart(
                        version_major=0,
                        version_minor=9,
                        server_properties={
                            "product": "FakeBroker",
                            "capabilities": {
                                "publisher_confirms": True,
                                "connection.blocked": True,
                                "basic.nack": True,
                            },
                        },
                        mechanisms=b"PLAIN AMQPLAIN",
                        locales=b"en_US",
                    ),
                )
            )
            frames = FrameReader(frame_max=0)
            content: dict[int, list[Any]] = {}
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                for kind, channel, payload in frames.feed(data):
                    self._frame(conn, content, kind, channel, bytes(payload))
                with self._changed:
                    self._changed.notify_all()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    def _frame(
        self, conn: _Conn, content: dict[int, list[Any]], kind: int, channel: int, payload: bytes
    ) -> None:
        if kind == FRAME_METHOD:
            method = spec.decode_method(payload)
            self.methods.append((channel, method))
            if method.CONTENT:
                content[channel] = [method, None, 0, []]
            else:
                self._method(conn, channel, method)
        elif kind == FRAME_HEADER:
            entry = content[channel]
            _class, _weight, size = _HHQ.unpack_from(payload, 0)
            entry[1], _end = spec.BasicProperties.decode(payload, 12)
            entry[2] = size
            if size == 0:
                self._publish(conn, channel, content.pop(channel))
        elif kind == FRAME_BODY:
            entry = content[channel]
            entry[3].append(payload)
            if sum(map(len, entry[3])) >= entry[2]:
                self._publish(conn, channel, content.pop(channel))

    def _method(self, conn: _Conn, channel: int, method: Method) -> None:
        write = conn.writer.write
        kind = type(method)
        if kind is spec.ConnectionStartOk:
            write(
                method_frame(
                    0, spec.ConnectionTune(channel_max=2047, frame_max=131072, heartbeat=0)
                )
            )
        elif kind is spec.ConnectionOpen:
            write(method_frame(0, spec.ConnectionOpenOk()))
        elif kind is spec.ConnectionClose:
            if self.answer_close:
                write(method_frame(0, spec.ConnectionCloseOk()))
        elif kind is spec.ChannelOpen:
            conn.channels[channel] = _Channel()
            if not self.hold_channel_open:
                write(method_frame(channel, spec.ChannelOpenOk()))
        elif kind is spec.ConfirmSelect:
            conn.channels[channel].confirm = True
            if not self.hold_confirm_select:
                write(method_frame(channel, spec.ConfirmSelectOk()))
        elif kind is spec.ChannelClose:
            conn.channels.pop(channel, None)
            write(method_frame(channel, spec.ChannelCloseOk()))
        elif kind is spec.ChannelCloseOk:
            conn.channels.pop(channel, None)
        elif kind is spec.QueueDeclare:
            assert isinstance(method, spec.QueueDeclare)
            write(
                method_frame(
                    channel,
                    spec.QueueDeclareOk(queue=method.queue, message_count=0, consumer_count=0),
                )
            )

    def _publish(self, conn: _Conn, channel: int, entry: list[Any]) -> None:
        method, properties, _size, parts = entry
        assert isinstance(method, spec.BasicPublish)
        state = conn.channels.get(channel)
        if state is None or state.closing:
            return  # after channel.close the broker discards what follows
        seq = 0
        if state.confirm:
            state.seq += 1
            seq = state.seq
        self.published.append(
            Published(
                channel,
                seq,
                method.exchange,
                method.routing_key,
                method.mandatory,
                properties,
                b"".join(parts),
            )
        )
        if self.auto_ack and seq:
            conn.writer.write(
                method_frame(channel, spec.BasicAck(delivery_tag=seq, multiple=False))
            )
