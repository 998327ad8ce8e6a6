"""A scripted fake broker for the sans-IO protocol tests (no sockets, no event loop).

In the spirit of h11's ``ConnectionPair``: :class:`BrokerPeer` parses what the client
wrote (protocol header, method frames, content header and body frames, heartbeats) and
builds the bytes a broker would send; :class:`Pair` wires a
:class:`~rabbitry.protocol.ConnectionProtocol` to one and moves bytes both ways on
request, so a test reads as a transcript::

    pair = Pair()
    pair.handshake(heartbeat=10)
    channel = pair.open_channel()
    channel.send_method(spec.QueueDeclare(queue="q"))
    pair.assert_sent(spec.QueueDeclare, channel=1, queue="q")
    events = pair.broker_to_client(
        BrokerPeer.send_method(1, spec.QueueDeclareOk(queue="q", message_count=0,
                                                     consumer_count=0))
    )

The peer's own frame reader has no frame size limit (``FrameReader(frame_max=0)``), so
a client that writes frames larger than it negotiated is caught by an explicit check
(:attr:`BrokerPeer.frame_max`) rather than by the reader.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rabbitry.protocol import spec
from rabbitry.protocol.connection import ConnectionProtocol
from rabbitry.protocol.events import ConnectionOpened, RpcReply
from rabbitry.protocol.frames import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameReader,
    Method,
    content_frames,
    method_frame,
)

if TYPE_CHECKING:
    from rabbitry.protocol.channel import ChannelProtocol
    from rabbitry.protocol.events import Event

__all__ = ["BrokerPeer", "Content", "Pair", "ReceivedFrame"]

_FRAME_HEAD = struct.Struct(">BHI")
_HHQ = struct.Struct(">HHQ")


@dataclass
class ReceivedFrame:
    """One frame the client wrote, as the peer parsed it."""

    kind: int
    channel: int
    payload: bytes
    #: The decoded method, for method frames.
    method: Method | None = None


@dataclass
class Content:
    """A content-bearing method the client wrote (basic.publish), reassembled."""

    channel: int
    method: Method
    properties: spec.BasicProperties
    body_size: int
    body: bytes = b""
    #: The payload size of every body frame, in order.
    body_frame_sizes: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.body) == self.body_size


class PeerError(AssertionError):
    """The client wrote something a broker would refuse (a test failure, not a case)."""


class BrokerPeer:
    """Parses client bytes and builds broker frames.

    Attributes:
        frames: every frame received, in order.
        contents: every complete publish received (method + header + bodies).
        heartbeats: how many heartbeat frames arrived.
        raw_received: every byte received, as one buffer.
        frame_max: when non-zero, a frame larger than this (overhead included) fails
            the test: the client broke the size it negotiated.
    """

    def __init__(self) -> None:
        self._reader = FrameReader(frame_max=0)
        self.header_received = False
        self._header_buffer = b""
        self.frames: list[ReceivedFrame] = []
        self.contents: list[Content] = []
        self.heartbeats = 0
        self.raw_received = bytearray()
        self.frame_max = 0
        self._assembling: dict[int, Content] = {}
        self._content_method: dict[int, Method] = {}
        #: (channel, method) pairs not yet looked at by a test.
        self.unchecked: deque[tuple[int, Method]] = deque()

    # ------------------------------------------------------------------ parsing

    def feed(self, data: bytes) -> list[ReceivedFrame]:
        """Parse bytes from the client; returns the frames they complete."""
        self.raw_received += data
        if not self.header_received:
            self._header_buffer += data
            if len(self._header_buffer) < len(PROTOCOL_HEADER):
                return []
            head = self._header_buffer[: len(PROTOCOL_HEADER)]
            if head != PROTOCOL_HEADER:
                raise PeerError(f"the client did not start with the protocol header: {head!r}")
            self.header_received = True
            data = self._header_buffer[len(PROTOCOL_HEADER) :]
            self._header_buffer = b""
        new: list[ReceivedFrame] = []
        for kind, channel, payload in self._reader.feed(data):
            payload = bytes(payload)
            if self.frame_max and len(payload) + 8 > self.frame_max:
                raise PeerError(
                    f"the client wrote a frame of {len(payload) + 8} bytes, "
                    f"above frame_max {self.frame_max}"
                )
            frame = ReceivedFrame(kind, channel, payload)
            self._handle(frame)
            self.frames.append(frame)
            new.append(frame)
        return new

    def _handle(self, frame: ReceivedFrame) -> None:
        channel = frame.channel
        if frame.kind == FRAME_METHOD:
            if channel in self._content_method or channel in self._assembling:
                raise PeerError(f"method frame on channel {channel} in the middle of content")
            method = spec.decode_method(frame.payload)
            frame.method = method
            self.unchecked.append((channel, method))
            if method.CONTENT:
                self._content_method[channel] = method
        elif frame.kind == FRAME_HEADER:
            method = self._content_method.pop(channel, None)
            if method is None:
                raise PeerError(f"content header on channel {channel} without a method")
            class_id, _weight, size = _HHQ.unpack_from(frame.payload, 0)
            if class_id != method.CLASS_ID:
                raise PeerError(f"content header class {class_id} for {method.NAME}")
            props, end = spec.BasicProperties.decode(frame.payload, 12)
            if end != len(frame.payload):
                raise PeerError("content header with trailing bytes")
            content = Content(channel, method, props, size)
            if size:
                self._assembling[channel] = content
            else:
                self.contents.append(content)
        elif frame.kind == FRAME_BODY:
            content = self._assembling.get(channel)
            if content is None:
                raise PeerError(f"body frame on channel {channel} without a header")
            content.body += frame.payload
            content.body_frame_sizes.append(len(frame.payload))
            if len(content.body) > content.body_size:
                raise PeerError("body longer than its header announced")
            if content.complete:
                del self._assembling[channel]
                self.contents.append(content)
        elif frame.kind == FRAME_HEARTBEAT:
            if channel:
                raise PeerError(f"heartbeat on channel {channel}")
            self.heartbeats += 1
        else:
            raise PeerError(f"unknown frame type {frame.kind}")

    @property
    def methods(self) -> list[tuple[int, Method]]:
        """Every (channel, method) received, in order."""
        return [(f.channel, f.method) for f in self.frames if f.method is not None]

    # ------------------------------------------------------------------ building

    @staticmethod
    def send_method(channel: int, method: Method) -> bytes:
        """One method frame."""
        return method_frame(channel, method)

    @staticmethod
    def send_content(
        channel: int,
        method: Method,
        body: bytes,
        properties: spec.BasicProperties | None = None,
        frame_max: int = 131072,
    ) -> bytes:
        """A content method, its header and body frames split for ``frame_max``."""
        props = (properties or spec.BasicProperties()).encode()
        frames = content_frames(channel, method.CLASS_ID, props, body, frame_max)
        return method_frame(channel, method) + b"".join(frames)

    @staticmethod
    def send_header(
        channel: int, body_size: int, properties: spec.BasicProperties | None = None
    ) -> bytes:
        """A lone content header frame (class basic)."""
        payload = _HHQ.pack(60, 0, body_size) + (properties or spec.BasicProperties()).encode()
        return BrokerPeer.frame(FRAME_HEADER, channel, payload)

    @staticmethod
    def send_body(channel: int, body: bytes) -> bytes:
        """A lone content body frame."""
        return BrokerPeer.frame(FRAME_BODY, channel, body)

    @staticmethod
    def send_heartbeat(channel: int = 0) -> bytes:
        """A heartbeat frame (on channel 0 unless told otherwise)."""
        if channel == 0:
            return HEARTBEAT_FRAME
        return BrokerPeer.frame(FRAME_HEARTBEAT, channel, b"")

    @staticmethod
    def frame(kind: int, channel: int, payload: bytes, frame_end: int = FRAME_END) -> bytes:
        """Any frame, including malformed ones (a wrong ``frame_end``)."""
        return _FRAME_HEAD.pack(kind, channel, len(payload)) + payload + bytes([frame_end])

    @staticmethod
    def raw(data: bytes) -> bytes:
        """Bytes sent as they are."""
        return bytes(data)


class Pair:
    """A :class:`ConnectionProtocol` wired to a :class:`BrokerPeer`.

    Keyword arguments go to :class:`ConnectionProtocol`.
    """

    def __init__(self, **client_kwargs: Any) -> None:
        self.client = ConnectionProtocol(**client_kwargs)
        self.broker = BrokerPeer()

    # ------------------------------------------------------------------ moving bytes

    def flush(self) -> bytes:
        """Move the client's pending output into the peer; returns the raw bytes."""
        data = self.client.data_to_send()
        if data:
            self.broker.feed(data)
        return data

    def client_to_broker(self) -> list[tuple[int, Method]]:
        """Move the client's output to the peer; return (and mark checked) the new
        ``(channel, method)`` pairs, oldest first."""
        self.flush()
        out = list(self.broker.unchecked)
        self.broker.unchecked.clear()
        return out

    def broker_to_client(self, *frames: bytes) -> list[Event]:
        """Feed the client the frames (one ``receive_data`` call); return its events."""
        self.client.receive_data(b"".join(frames))
        return self.client.events_received()

    def broker_method(self, channel: int, method: Method) -> list[Event]:
        """Shortcut: one method frame from the broker."""
        return self.broker_to_client(BrokerPeer.send_method(channel, method))

    # ------------------------------------------------------------------ assertions

    def assert_sent(
        self, method_class: type[Method], channel: int | None = None, **fields: Any
    ) -> Method:
        """The next method the client wrote (not yet checked) is a ``method_class``
        on ``channel`` (when given) with these field values; returns it."""
        self.flush()
        assert self.broker.unchecked, f"expected {method_class.NAME}, the client sent nothing"
        got_channel, method = self.broker.unchecked.popleft()
        assert type(method) is method_class, f"expected {method_class.NAME}, got {method!r}"
        if channel is not None:
            assert got_channel == channel, (
                f"{method.NAME} on channel {got_channel}, expected {channel}"
            )
        for name, value in fields.items():
            actual = getattr(method, name)
            assert actual == value, f"{method.NAME}.{name} = {actual!r}, expected {value!r}"
        return method

    def assert_nothing_sent(self) -> None:
        """The client has no unchecked method and no pending bytes."""
        data = self.client.data_to_send()
        assert data == b"", f"the client sent {data!r}"
        assert not self.broker.unchecked, f"unchecked methods: {list(self.broker.unchecked)}"

    # ------------------------------------------------------------------ scripts

    def handshake(
        self,
        *,
        heartbeat: int = 0,
        frame_max: int = 131072,
        channel_max: int = 2047,
        server_properties: dict[str, Any] | None = None,
        mechanisms: str = "PLAIN AMQPLAIN EXTERNAL",
    ) -> ConnectionOpened:
        """start / start-ok / tune / tune-ok + open / open-ok; returns ConnectionOpened.

        The keyword arguments are the broker's side of the tune negotiation.
        """
        self.flush()
        assert self.broker.header_received, "the client did not send the protocol header"
        if server_properties is None:
            server_properties = {"product": "RabbitMQ", "capabilities": {"publisher_confirms": 1}}
        events = self.broker_method(
            0,
            spec.ConnectionStart(
                version_major=0,
                version_minor=9,
                server_properties=server_properties,
                mechanisms=mechanisms.encode(),
                locales=b"en_US",
            ),
        )
        assert events == [], events
        self.assert_sent(spec.ConnectionStartOk, channel=0)
        events = self.broker_method(
            0,
            spec.ConnectionTune(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat),
        )
        assert events == [], events
        tune_ok = self.assert_sent(spec.ConnectionTuneOk, channel=0)
        assert isinstance(tune_ok, spec.ConnectionTuneOk)
        self.broker.frame_max = tune_ok.frame_max
        self.assert_sent(spec.ConnectionOpen, channel=0, virtual_host=self.client.virtual_host)
        events = self.broker_method(0, spec.ConnectionOpenOk())
        assert len(events) == 1 and isinstance(events[0], ConnectionOpened), events
        self.assert_nothing_sent()
        return events[0]

    def open_channel(self, channel_id: int | None = None) -> ChannelProtocol:
        """channel.open / open-ok; returns the open ChannelProtocol."""
        channel = self.client.open_channel(channel_id)
        self.assert_sent(spec.ChannelOpen, channel=channel.channel_id)
        events = self.broker_method(channel.channel_id, spec.ChannelOpenOk())
        assert events == [RpcReply(channel.channel_id, spec.ChannelOpenOk())], events
        return channel
