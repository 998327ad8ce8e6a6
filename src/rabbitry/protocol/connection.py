"""ConnectionProtocol: an AMQP 0-9-1 client connection, without I/O.

Contract (the engine's side)::

    proto = ConnectionProtocol(...)          # queues the protocol header
    transport.write(proto.data_to_send())
    ...on bytes:   proto.receive_data(data); write data_to_send(); handle events_received()
    ...on EOF:     proto.receive_eof();       handle events_received()
    ...on a timer: proto.tick(now);           write data_to_send(); handle events_received()

The receive path never raises. Bytes that break the protocol make the connection send
connection.close with the matching reply code (501 frame error, 502 syntax error, 503
command invalid, 504 channel error, 505 unexpected frame, 540 not implemented), move to
CLOSING and keep the exception in :attr:`close_exc`; :class:`ConnectionTerminated`
follows when the broker answers close-ok or the engine gives up on it.

Theory of operation
-------------------
States::

    AWAIT_START --start/start-ok--> AWAIT_TUNE --tune/tune-ok, open--> AWAIT_OPEN_OK
        --open-ok--> OPEN --close()/protocol error--> CLOSING --close-ok--> CLOSED
    (connection.close from the broker, EOF or a heartbeat timeout: straight to CLOSED)

Heartbeats (§4.2.7): the protocol has no clock. The engine calls :meth:`tick` with a
monotonic ``now`` at least every ``tick_interval`` seconds. A heartbeat frame is queued
when nothing was sent for half the interval, and the peer is declared dead when nothing
arrived for twice the interval; with ticks every ``min(heartbeat / 4, 1)`` seconds that
detects a dead peer within 2 × heartbeat + 1 s.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from ..broker import RABBITMQ_3_MAX_MESSAGE_SIZE, default_max_message_size, server_version
from ..exceptions import (
    AMQPError,
    AuthenticationError,
    ConnectionClosedByClient,
    ConnectionLost,
    HeartbeatTimeout,
    InvalidStateError,
    LocalProtocolError,
    NotAnAMQPServer,
    ProtocolError,
    RemoteProtocolError,
    connection_error_for,
)
from . import spec
from ._handshake import CLIENT_CAPABILITIES, Handshake
from ._handshake import VERSION as VERSION  # client-properties "version"
from ._heartbeat import HeartbeatClock
from .channel import ChannelProtocol
from .events import (
    ConnectionBlocked,
    ConnectionOpened,
    ConnectionTerminated,
    ConnectionUnblocked,
    Event,
    RpcReply,
)
from .frames import (
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameReader,
    Method,
    method_frame,
)
from .greeting import GREETING_SIZE, greeting_problem

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["CLIENT_CAPABILITIES", "ConnectionProtocol", "ConnectionState"]


class ConnectionState(enum.Enum):
    """Lifecycle of a connection (the transitions are drawn in the module docstring).

    Attributes:
        AWAIT_START: the protocol header is sent; connection.start is awaited.
        AWAIT_TUNE: start-ok is sent; connection.tune (or secure) is awaited.
        AWAIT_OPEN_OK: tune-ok and connection.open are sent; open-ok is awaited.
        OPEN: channels may be opened.
        CLOSING: connection.close is sent; everything but close-ok is discarded.
        CLOSED: finished; :class:`ConnectionTerminated` was emitted.
    """

    AWAIT_START = "await-start"
    AWAIT_TUNE = "await-tune"
    AWAIT_OPEN_OK = "await-open-ok"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


AWAIT_START = ConnectionState.AWAIT_START
AWAIT_TUNE = ConnectionState.AWAIT_TUNE
AWAIT_OPEN_OK = ConnectionState.AWAIT_OPEN_OK
OPEN = ConnectionState.OPEN
CLOSING = ConnectionState.CLOSING
CLOSED = ConnectionState.CLOSED

_HANDSHAKE = (AWAIT_START, AWAIT_TUNE, AWAIT_OPEN_OK)


class ConnectionProtocol:
    """The client side of one AMQP 0-9-1 connection.

    Args:
        username: SASL user name (PLAIN, AMQPLAIN).
        password: SASL password; never put into a repr or an exception.
        virtual_host: the vhost to open.
        heartbeat: the interval we ask for, in seconds; negotiated as the lower
            non-zero of ours and the broker's (0 takes the broker's).
        channel_max: highest channel number we want (negotiated the same way).
        frame_max: largest frame we want (negotiated the same way; >= 4096).
        auth_mechanism: PLAIN, AMQPLAIN or EXTERNAL.
        connection_name: shown in the management UI (client property).
        locale: the locale we ask for.
        client_properties: extra client-properties entries.
        max_message_size: refuse messages with larger bodies (both directions; 0 = no
            limit). ``None`` follows the broker: its default for the version it announces
            in ``connection.start`` (:func:`rabbitry.broker.default_max_message_size`:
            128 MiB on RabbitMQ 3.x, 16 MiB on 4.x); 128 MiB until then.

    Raises:
        LocalProtocolError: ``auth_mechanism`` is not one of PLAIN, AMQPLAIN, EXTERNAL.
    """

    def __init__(
        self,
        *,
        username: str = "guest",
        password: str = "guest",
        virtual_host: str = "/",
        heartbeat: int = 60,
        channel_max: int = 2047,
        frame_max: int = 131072,
        auth_mechanism: str = "PLAIN",
        connection_name: str | None = None,
        locale: str = "en_US",
        client_properties: Mapping[str, Any] | None = None,
        max_message_size: int | None = None,
    ) -> None:
        self._handshake = handshake = Handshake(
            username=username,
            password=password,
            heartbeat=heartbeat,
            channel_max=channel_max,
            frame_max=frame_max,
            auth_mechanism=auth_mechanism,
            connection_name=connection_name,
            locale=locale,
            client_properties=client_properties,
        )
        self.virtual_host = virtual_host
        self.auth_mechanism = handshake.auth_mechanism
        self.locale = locale
        self.client_properties = handshake.client_properties
        self._size_follows_broker = max_message_size is None
        self.max_message_size = (
            RABBITMQ_3_MAX_MESSAGE_SIZE if max_message_size is None else max_message_size
        )
        self.state = AWAIT_START
        self.close_exc: AMQPError | None = None
        self.server_properties: dict[str, Any] = {}
        #: The broker's version from ``connection.start`` (``()`` until then or unknown).
        self.server_version: tuple[int, ...] = ()
        self.channel_max = channel_max
        self.frame_max = FRAME_MIN_SIZE
        self.heartbeat = 0
        self.blocked_reason: str | None = None

        #: The first bytes received (up to 11), while they are judged (see greeting.py).
        self.greeting = b""
        self._greeting_judged = False
        self._reader = FrameReader(FRAME_MIN_SIZE)
        #: Frames queued for the socket, oldest first, until :meth:`data_to_send` or
        #: :meth:`buffers_to_send` takes them (a new list then). The channels append to it
        #: and may replace its last frame (ack coalescing); an engine only reads its length.
        self.send_queue: list[bytes] = [PROTOCOL_HEADER]
        #: Events not yet taken by :meth:`events_received` (a new list then); the
        #: channels append theirs to it.
        self.event_queue: list[Event] = []
        self.channels: dict[int, ChannelProtocol] = {}
        self._next_channel = 1
        self._connection_rpc = False
        self._terminated = False
        self._clock = HeartbeatClock()  # traffic flags, turned into times by tick()
        #: The engine stopped reading the socket on purpose (back-pressure): silence is
        #: then ours, not the broker's, so it does not count towards the timeout.
        self.rx_paused = False

    def __repr__(self) -> str:
        return (
            f"<ConnectionProtocol {self.state.value} vhost={self.virtual_host!r} "
            f"user={self._handshake.username!r} channels={len(self.channels)}>"
        )

    # ------------------------------------------------------------------ engine side

    def data_to_send(self) -> bytes:
        """Everything queued for the socket since the last call.

        Returns:
            The queued frames joined (empty when nothing is queued); the engine writes
            them in this order.
        """
        out = self.send_queue
        if not out:
            return b""
        self.send_queue = []
        self._clock.tx_seen = True
        return out[0] if len(out) == 1 else b"".join(out)

    def buffers_to_send(self) -> list[bytes | memoryview]:
        """Like :meth:`data_to_send`, but the queued pieces as they are, not joined.

        A large message's body frames are views of the caller's body: an engine that
        writes them one by one (or with a zero-copy ``writelines``) sends the body
        without copying it here.

        Returns:
            The queued pieces, oldest first (empty when nothing is queued).
        """
        out = self.send_queue
        if out:
            self.send_queue = []
            self._clock.tx_seen = True
        return out  # type: ignore[return-value]

    def events_received(self) -> list[Event]:
        """Events since the last call.

        Returns:
            The events in the order their frames arrived, oldest first.
        """
        events = self.event_queue
        if events:
            self.event_queue = []
        return events

    @property
    def is_open(self) -> bool:
        """The handshake finished and no close has started."""
        return self.state is OPEN

    @property
    def tick_interval(self) -> float | None:
        """How often the engine must call :meth:`tick`, or ``None`` when not needed."""
        if not self.heartbeat:
            return None
        return min(self.heartbeat / 4, 1.0)

    def receive_data(self, data: bytes) -> None:
        """Feed bytes from the socket. Never raises.

        The first bytes are judged as a greeting first (:mod:`.greeting`): a peer that is
        not an AMQP 0-9-1 server ends the connection with :class:`NotAnAMQPServer`. A
        protocol violation makes the connection close itself with the violation's reply
        code (see the module docstring).

        Args:
            data: the bytes just read, any length; a frame may span calls.

        Raises:
            RemoteProtocolError: never escapes: raised for a frame that breaks the
                protocol and caught here, where it starts the close.
        """
        if self.state is CLOSED:
            return
        self._clock.rx_seen = True
        if self.state is AWAIT_START and not self._greeting_judged:
            head = (self.greeting + data)[:64]  # 64 bytes to describe a refusal
            self.greeting = head[:GREETING_SIZE]
            self._greeting_judged = len(self.greeting) == GREETING_SIZE
            problem = greeting_problem(head)
            if problem is not None:
                self._terminate(NotAnAMQPServer(problem, head))
                return
        try:
            frames = self._reader.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        for kind, channel, payload in frames:
            try:
                if kind == FRAME_HEARTBEAT:
                    if channel:  # §4.2.7: heartbeats belong to channel 0 only
                        raise RemoteProtocolError("heartbeat frame on a non-zero channel", 501)
                    continue
                if channel:
                    if self.state is CLOSING:
                        # connection.close (§1.4.2.5): after sending close, discard
                        # everything but close and close-ok.
                        continue
                    chan = self.channels.get(channel)
                    if chan is None:
                        raise RemoteProtocolError(f"frame on unopened channel {channel}", 504)
                    chan.receive_frame(kind, payload)
                elif kind == FRAME_METHOD:
                    self._receive_method(spec.decode_method(payload))
                else:  # header or body frames on channel 0: 503 command invalid
                    raise RemoteProtocolError(f"frame type {kind} on channel 0", 503)
            except ProtocolError as exc:
                self._fail(exc)
                return
            if self.state is CLOSED:
                return

    def receive_eof(self) -> None:
        """The socket reached EOF or failed. Never raises.

        Ends the connection (:class:`ConnectionTerminated`) with the pending close's
        reason while closing, :class:`AuthenticationError` right after start-ok (a broker
        that refuses a login without ``authentication_failure_close`` just drops the
        socket), else :class:`ConnectionLost`.
        """
        if self.state is CLOSED:
            return
        if self.state is CLOSING and self.close_exc is not None:
            exc: AMQPError = self.close_exc
        elif self.state is AWAIT_TUNE:
            # RabbitMQ without authentication_failure_close drops the socket here.
            exc = AuthenticationError(
                "the broker closed the connection after start-ok: the credentials or the "
                f"{self.auth_mechanism} mechanism were probably refused"
            )
        else:
            exc = ConnectionLost("the connection to the broker was lost")
        self._terminate(exc)

    def tick(self, now: float) -> None:
        """Heartbeat bookkeeping. Never raises.

        Queues a heartbeat frame when nothing was sent for half the interval, and ends
        the connection with :class:`HeartbeatTimeout` when nothing arrived for twice the
        interval (§4.2.7: two silent intervals mean a dead peer). Silence while
        :attr:`rx_paused` does not count.

        Args:
            now: a monotonic time in seconds; call at least every :attr:`tick_interval`.
        """
        if not self.heartbeat or self.state is CLOSED:
            return
        rx_silence, tx_silence = self._clock.silence(now, self.rx_paused)
        if rx_silence > 2 * self.heartbeat:
            self._terminate(
                HeartbeatTimeout(
                    f"no data from the broker for {rx_silence:.1f} s (heartbeat {self.heartbeat} s)"
                )
            )
            return
        if tx_silence >= self.heartbeat / 2 and not self.send_queue:
            self.send_queue.append(HEARTBEAT_FRAME)

    def abort(self, exc: AMQPError) -> None:
        """The engine gives up on the connection (e.g. close-ok never came).

        Args:
            exc: the reason :class:`ConnectionTerminated` carries (if not already ended).
        """
        self._terminate(exc)

    # ------------------------------------------------------------------ application side

    def open_channel(self, channel_id: int | None = None) -> ChannelProtocol:
        """Allocate a channel and queue channel.open; answered by an :class:`RpcReply`.

        Args:
            channel_id: the channel number (1 to the negotiated ``channel_max``);
                ``None`` takes the next free one, going round after the highest.

        Returns:
            The channel's protocol object, in the connection's :attr:`channels`.

        Raises:
            InvalidStateError: the connection is not open.
            LocalProtocolError: no free channel number, or ``channel_id`` is taken or
                out of range.
        """
        self._check_open("open a channel")
        if channel_id is None:
            channel_id = self._free_channel_id()
        elif not 1 <= channel_id <= self.channel_max:
            raise LocalProtocolError(
                f"channel_id: must be in 1..{self.channel_max}, got {channel_id}"
            )
        elif channel_id in self.channels:
            raise LocalProtocolError(f"channel_id: channel {channel_id} is already open")
        channel = ChannelProtocol(
            self, channel_id, self._write, self._write_many, self._channel_finished
        )
        self.channels[channel_id] = channel
        channel.send_method(spec.ChannelOpen())
        return channel

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        """Start a clean close: connection.close goes out, close-ok is awaited.

        During the handshake nothing is sent: the connection simply ends. A second call,
        or one after the end, does nothing.

        Args:
            reply_code: the code the close carries (200: a normal shutdown).
            reply_text: the text it carries (at most 255 bytes).
        """
        if self.state is CLOSED or self.state is CLOSING:
            return
        if self.state in _HANDSHAKE:
            # Nothing to say to the broker yet: just drop the connection.
            self._terminate(ConnectionClosedByClient(reply_code, reply_text))
            return
        self.state = CLOSING
        self.close_exc = ConnectionClosedByClient(reply_code, reply_text)
        self._write(
            method_frame(
                0,
                spec.ConnectionClose(
                    reply_code=reply_code, reply_text=reply_text, class_id=0, method_id=0
                ),
            )
        )

    def update_secret(self, new_secret: bytes | str, reason: str) -> None:
        """Queue connection.update-secret; answered by an :class:`RpcReply` on channel 0.

        RabbitMQ's extension for renewing an expiring credential (an OAuth 2 token) on an
        open connection; the broker checks it and answers update-secret-ok.

        Args:
            new_secret: the new credential.
            reason: why, as the broker logs it.

        Raises:
            InvalidStateError: not open, or an update is already waiting for its answer.
        """
        self._check_open("update the secret")
        if self._connection_rpc:
            raise InvalidStateError("an update-secret is already waiting for its answer")
        self._connection_rpc = True
        self._write(
            method_frame(0, spec.ConnectionUpdateSecret(new_secret=new_secret, reason=reason))
        )

    # ------------------------------------------------------------------ internals

    def _check_open(self, what: str) -> None:
        if self.state is not OPEN:
            exc = InvalidStateError(f"cannot {what}: the connection is {self.state.value}")
            raise exc from self.close_exc

    def _write(self, frame: bytes) -> None:
        self.send_queue.append(frame)

    def _write_many(self, frames: list[bytes]) -> None:
        self.send_queue.extend(frames)

    def _free_channel_id(self) -> int:
        limit = self.channel_max
        candidate = self._next_channel
        for _ in range(limit):
            if candidate > limit:
                candidate = 1
            if candidate not in self.channels:
                self._next_channel = candidate + 1
                return candidate
            candidate += 1
        raise LocalProtocolError(f"all {limit} channels are in use (channel_max)")

    def _channel_finished(self, channel_id: int) -> None:
        self.channels.pop(channel_id, None)

    def _receive_method(self, method: Method) -> None:
        cls = type(method)
        state = self.state
        if state is CLOSING:
            if cls is spec.ConnectionCloseOk:
                assert self.close_exc is not None
                self._terminate(self.close_exc)
            elif cls is spec.ConnectionClose:
                self._write(method_frame(0, spec.ConnectionCloseOk()))
                assert self.close_exc is not None
                self._terminate(self.close_exc)
            return
        if cls is spec.ConnectionClose:
            assert isinstance(method, spec.ConnectionClose)
            self._write(method_frame(0, spec.ConnectionCloseOk()))
            exc: AMQPError = connection_error_for(
                method.reply_code, method.reply_text, method.class_id, method.method_id
            )
            if state is AWAIT_TUNE and method.reply_code == 403:  # ACCESS_REFUSED
                # After start-ok: RabbitMQ's authentication_failure_close. A 403 later
                # (answering connection.open) is about the vhost, not the credentials.
                auth = AuthenticationError(f"({method.reply_code}) {method.reply_text}")
                auth.__cause__ = exc
                exc = auth
            self._terminate(exc)
        elif state is OPEN:
            if cls is spec.ConnectionBlocked:
                assert isinstance(method, spec.ConnectionBlocked)
                self.blocked_reason = method.reason
                self.event_queue.append(ConnectionBlocked(method.reason))
            elif cls is spec.ConnectionUnblocked:
                self.blocked_reason = None
                self.event_queue.append(ConnectionUnblocked())
            elif cls is spec.ConnectionUpdateSecretOk and self._connection_rpc:
                self._connection_rpc = False
                self.event_queue.append(RpcReply(0, method))
            else:
                raise RemoteProtocolError(f"unexpected {method.NAME} on channel 0", 503)
        elif state is AWAIT_START and cls is spec.ConnectionStart:
            assert isinstance(method, spec.ConnectionStart)
            self._on_start(method)
        elif state is AWAIT_TUNE and cls is spec.ConnectionSecure:
            # PLAIN/AMQPLAIN/EXTERNAL complete in start-ok; answer a challenge with the
            # same response, as the mechanisms have nothing else to say.
            self._write(
                method_frame(0, spec.ConnectionSecureOk(response=self._handshake.sasl_response()))
            )
        elif state is AWAIT_TUNE and cls is spec.ConnectionTune:
            assert isinstance(method, spec.ConnectionTune)
            self._on_tune(method)
        elif state is AWAIT_OPEN_OK and cls is spec.ConnectionOpenOk:
            self.state = OPEN
            self.event_queue.append(
                ConnectionOpened(
                    self.server_properties, self.channel_max, self.frame_max, self.heartbeat
                )
            )
        else:
            raise RemoteProtocolError(
                f"unexpected {method.NAME} while {state.value} on channel 0", 503
            )

    def _on_start(self, start: spec.ConnectionStart) -> None:
        handshake = self._handshake
        refusal = handshake.refusal(start)
        self.server_properties = start.server_properties or {}
        self.server_version = server_version(self.server_properties)
        if self._size_follows_broker:
            self.max_message_size = default_max_message_size(self.server_version)
        if refusal is not None:
            self._terminate(refusal)
            return
        self._write(method_frame(0, handshake.start_ok()))
        self.state = AWAIT_TUNE

    def _on_tune(self, tune: spec.ConnectionTune) -> None:
        tune_ok = self._handshake.tune_ok(tune)
        self.channel_max = tune_ok.channel_max
        self.frame_max = self._reader.frame_max = tune_ok.frame_max
        self.heartbeat = tune_ok.heartbeat
        self._write(method_frame(0, tune_ok))
        # tune-ok and open go out together: the client need not wait between them.
        self._write(method_frame(0, spec.ConnectionOpen(virtual_host=self.virtual_host)))
        self.state = AWAIT_OPEN_OK

    def _fail(self, exc: ProtocolError) -> None:
        """A protocol violation by the broker: close with its reply code, keep ``exc``."""
        if self.state is CLOSED:
            return
        if self.state is CLOSING:
            # Already waiting for close-ok: the first error is the one to report. The
            # stream may be out of step now, so start reading afresh; if close-ok never
            # comes the engine's deadline ends the connection.
            self._reader = FrameReader(self.frame_max)
            return
        if self.state in _HANDSHAKE:
            self._terminate(exc)
            return
        self.state = CLOSING
        self.close_exc = exc
        for channel in self.channels.values():
            channel.connection_failed(exc)
        self._write(
            method_frame(
                0,
                spec.ConnectionClose(
                    reply_code=exc.reply_code, reply_text=str(exc)[:255], class_id=0, method_id=0
                ),
            )
        )

    def _terminate(self, exc: AMQPError) -> None:
        if self._terminated:
            return
        self._terminated = True
        self.state = CLOSED
        self.close_exc = exc  # always the reason the event carries
        for channel in list(self.channels.values()):
            channel.finish(exc)
        self.channels.clear()
        self.event_queue.append(ConnectionTerminated(exc))
