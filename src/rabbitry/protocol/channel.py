"""ChannelProtocol: one AMQP channel, without I/O.

Theory of operation
-------------------
States::

    OPENING --channel.open-ok--> OPEN --close()--> CLOSING --close-ok--> CLOSED
       \\________________ channel.close from the broker ______________/

Synchronous requests (every method with ``SYNCHRONOUS``) are sent one at a time
(AMQP 0-9-1 §2.3.5.2: a peer may not send a new synchronous request before the answer to
the previous one). Later requests wait in ``_pending``; so do asynchronous frames
(publishes, acks) issued after a waiting request, so that frames leave in exactly the
order the application asked for them — ``confirm_select(); publish()`` must never reach
the broker as publish-then-select. Replies are matched by order, which is what makes a
FIFO of futures in the engine correct.

Content arrives as method → header → body frames (§4.2.6). While a message is being
assembled no other frame may arrive on the channel; one that does is
505 UNEXPECTED_FRAME.

Every decision is here; the engine only turns events into futures and callbacks.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import (
    AMQPError,
    ChannelClosedByClient,
    InvalidStateError,
    LocalProtocolError,
    RemoteProtocolError,
    channel_error_for,
)
from . import spec
from ._content import ContentAssembler
from .events import (
    ChannelClosedEvent,
    ConsumerCancelledByBroker,
    FlowChanged,
    PublishConfirmed,
    RpcReply,
)
from .frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    Method,
    ack_frame,
    method_frame,
)
from .publish import PublishEncoder

if TYPE_CHECKING:
    from collections.abc import Callable

    from .events import Event
    from .publish import ConfirmTracker

__all__ = ["ChannelProtocol", "ChannelState"]


class _Connection(Protocol):
    """What a channel uses of its :class:`~rabbitry.protocol.connection.ConnectionProtocol`.

    The connection creates its channels and imports this module; a channel knows it
    only through these members.
    """

    frame_max: int
    max_message_size: int
    send_queue: list[bytes]
    event_queue: list[Event]


class ChannelState(enum.Enum):
    """Lifecycle of a channel."""

    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


OPENING = ChannelState.OPENING
OPEN = ChannelState.OPEN
CLOSING = ChannelState.CLOSING
CLOSED = ChannelState.CLOSED

# Tags settled out of order that are remembered so the ack floor can catch up; past
# this many (e.g. a no-ack consumer shares the channel, whose tags are never settled)
# they are forgotten and acks on this channel simply stop being merged.
_SETTLED_ABOVE_LIMIT = 65536


class ChannelProtocol:
    """The state of one channel.

    Created by :meth:`ConnectionProtocol.open_channel`; do not construct directly.

    Attributes:
        channel_id: the channel number.
        state: a :class:`ChannelState`.
        confirm_mode: confirm.select was requested; publishes are numbered from 1.
        next_publish_seq: the sequence number the next publish will get in confirm mode.
        transactional: tx.select was requested.
        flow_active: the broker's channel.flow says publishing may go on.
        close_exc: why the channel closed, once it has.
    """

    def __init__(
        self,
        connection: _Connection,
        channel_id: int,
        write: Callable[[bytes], None],
        write_many: Callable[[list[bytes]], None],
        finished: Callable[[int], None],
    ) -> None:
        self._conn = connection
        # From the connection: queue one frame, queue frames, forget this channel.
        self._write = write
        self._write_many = write_many
        self._finished = finished
        self.channel_id = channel_id
        self.state = OPENING
        self.confirm_mode = False
        self.next_publish_seq = 1
        self.transactional = False
        self.flow_active = True
        self.close_exc: AMQPError | None = None
        # The connection found a protocol violation and is closing: nothing may be sent.
        self._connection_failed: AMQPError | None = None
        self._rpc_outstanding = False
        self._rpc_responses: tuple[type[Method], ...] = ()
        # Items waiting behind an outstanding request: a request (its answers and its
        # encoded frame) to send when its turn comes, or a list of encoded frames.
        self._pending: deque[tuple[tuple[type[Method], ...], bytes] | list[bytes]] = deque()
        self._encoder = PublishEncoder(
            channel_id, connection.frame_max, connection.max_message_size
        )
        self._content = ContentAssembler(connection, channel_id)
        # Ack coalescing: every delivery tag <= _ack_floor has been settled by a frame
        # already queued; _ack_frame is the last basic.ack frame we queued.
        self._ack_floor = 0
        self._ack_frame: bytes | None = None
        self._settled_above: set[int] = set()
        # Confirm mode: the table that send_publish registers waiters in.
        self._confirms: ConfirmTracker[Any] | None = None

    # ------------------------------------------------------------------ sending

    def send_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        """Queue basic.ack; contiguous acks queued before the next flush merge into one.

        A single ack of the tag right after the settled ones (``_ack_floor + 1``) whose
        previous ack frame is still the last unsent frame of the connection replaces that
        frame with one ``multiple=True`` ack of the new tag. Every earlier tag is already
        settled, so the broker settles exactly the same deliveries as with the separate
        acks; an ack of any other tag goes out as given.

        Args:
            delivery_tag: the broker's tag of the delivery.
            multiple: and every earlier unsettled delivery of the channel.

        Raises:
            InvalidStateError: the channel is closing or closed.
            LocalProtocolError: the tag is not an unsigned 64-bit integer.
        """
        self._check_usable("basic.ack")
        floor = self._ack_floor
        if not multiple and delivery_tag == floor + 1:
            out = self._conn.send_queue
            previous = self._ack_frame
            if previous is not None and out and out[-1] is previous:
                frame = out[-1] = ack_frame(self.channel_id, delivery_tag, True)
            else:
                frame = ack_frame(self.channel_id, delivery_tag, False)
                self._send_frames([frame])
            self._ack_frame = frame
            self._ack_floor = delivery_tag
            if self._settled_above:
                self._raise_floor()
            return
        frame = ack_frame(self.channel_id, delivery_tag, multiple)
        self._send_frames([frame])
        self.settled(delivery_tag, multiple)
        # A multiple ack settles everything up to its tag, so the next contiguous ack
        # may replace it; after a lone ack out of order the next one must not.
        self._ack_frame = frame if multiple and self._ack_floor == delivery_tag else None

    def send_nack(self, delivery_tag: int, multiple: bool = False, requeue: bool = True) -> None:
        """Queue basic.nack and record the settlement (see :meth:`settled`).

        Args:
            delivery_tag: the broker's tag of the delivery (0 with ``multiple``: every
                delivery so far).
            multiple: and every earlier unsettled delivery of the channel.
            requeue: put them back in the queue; ``False`` dead-letters or drops them.

        Raises:
            InvalidStateError: the channel is closing or closed.
            LocalProtocolError: the tag is not an unsigned 64-bit integer.
        """
        self.send_method(
            spec.BasicNack(delivery_tag=delivery_tag, multiple=multiple, requeue=requeue)
        )
        self.settled(delivery_tag, multiple)

    def send_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        """Queue basic.reject and record the settlement (see :meth:`settled`).

        Args:
            delivery_tag: the broker's tag of the delivery.
            requeue: put it back in the queue; ``False`` dead-letters or drops it.

        Raises:
            InvalidStateError: the channel is closing or closed.
            LocalProtocolError: the tag is not an unsigned 64-bit integer.
        """
        self.send_method(spec.BasicReject(delivery_tag=delivery_tag, requeue=requeue))
        self.settled(delivery_tag, False)

    def settled(self, delivery_tag: int, multiple: bool) -> None:
        """Record that an ack, nack or reject of ``delivery_tag`` was queued.

        Args:
            delivery_tag: the tag the ack, nack or reject carried.
            multiple: it settled every earlier delivery of the channel too.
        """
        self._ack_frame = None
        if multiple:
            if delivery_tag > self._ack_floor:
                self._ack_floor = delivery_tag
        elif delivery_tag == self._ack_floor + 1:
            self._ack_floor = delivery_tag
        elif delivery_tag > self._ack_floor:
            if len(self._settled_above) >= _SETTLED_ABOVE_LIMIT:
                self._settled_above.clear()
            self._settled_above.add(delivery_tag)
            return
        if self._settled_above:
            self._raise_floor()

    def _raise_floor(self) -> None:
        above = self._settled_above
        floor = self._ack_floor
        while floor + 1 in above:
            floor += 1
            above.discard(floor)
        self._ack_floor = floor
        if above and min(above) <= floor:
            self._settled_above = {tag for tag in above if tag > floor}

    def send_method(self, method: Method) -> None:
        """Queue a method: requests wait their turn, other methods keep their order.

        Args:
            method: the method; a synchronous request (without ``nowait``) is answered
                by an :class:`RpcReply`.

        Raises:
            InvalidStateError: the channel is closing or closed.
            LocalProtocolError: an argument cannot be encoded (nothing was queued).
        """
        self._check_usable(method.NAME)
        frame = self._check_size(method_frame(self.channel_id, method), method.NAME)
        if method.SYNCHRONOUS and method.RESPONSES and not getattr(method, "nowait", False):
            request = (method.RESPONSES, frame)
            if not self._rpc_outstanding and not self._pending:
                self._start_rpc(request)
            else:
                self._pending.append(request)
            if type(method) is spec.ConfirmSelect:
                self.confirm_mode = True
            elif type(method) is spec.TxSelect:
                self.transactional = True
            return
        self._send_frames([frame])

    def _check_size(self, frame: bytes, what: str) -> bytes:
        """Refuse a frame the broker would answer with 501 FRAME_ERROR (closing everything)."""
        frame_max = self._conn.frame_max
        if frame_max and len(frame) > frame_max:
            raise LocalProtocolError(
                f"{what}: the frame would be {len(frame)} bytes, above the negotiated "
                f"frame_max {frame_max} (arguments or properties too large)"
            )
        return frame

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: spec.BasicProperties | None = None,
        mandatory: bool = False,
    ) -> int:
        """Queue basic.publish with its content.

        Args:
            exchange: the exchange to publish to (``""``: the default exchange).
            routing_key: the routing key.
            body: the message body.
            properties: the message properties (``None``: none).
            mandatory: ask the broker to return the message if no queue takes it.

        Returns:
            The publish sequence number in confirm mode, else 0.

        Raises:
            InvalidStateError: the channel is closing or closed.
            LocalProtocolError: the exchange, routing key, properties or body cannot be
                sent; nothing was queued.
        """
        if self.state is not OPEN and self.state is not OPENING:
            self._check_usable("basic.publish")
        return self.send_publish(
            self.encode_publish(exchange, routing_key, body, properties, mandatory)
        )

    def encode_publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: spec.BasicProperties | None = None,
        mandatory: bool = False,
    ) -> list[bytes]:
        """Encode basic.publish and its content without touching the channel's state.

        Safe to call from any thread: it only reads settings fixed at open and a cache of
        encoded method frames. :meth:`send_publish` then queues the frames.

        Args:
            exchange: the exchange to publish to (``""``: the default exchange).
            routing_key: the routing key.
            body: the message body.
            properties: the message properties (``None``: none).
            mandatory: ask the broker to return the message if no queue takes it.

        Returns:
            The method, header and body frames of the message, in order.

        Raises:
            LocalProtocolError: the exchange, routing key, properties or body are invalid.
        """
        return self._encoder.encode(exchange, routing_key, body, properties, mandatory)

    def use_confirms(self, confirms: ConfirmTracker[Any]) -> None:
        """Register the waiters of confirm-mode publishes in ``confirms`` (see
        :meth:`send_publish`).

        The engine keeps one table per channel across recoveries and hands it to each
        protocol object of the channel before publishing on it.

        Args:
            confirms: the table; its waiters are whatever the engine settles.
        """
        self._confirms = confirms

    def send_publish(self, frames: list[bytes], waiter: object = None) -> int:
        """Queue frames made by :meth:`encode_publish`; returns the sequence number or 0.

        In confirm mode a ``waiter`` other than ``None`` is registered under the
        publish's sequence number in the table given to :meth:`use_confirms`, which the
        broker's confirm of that number settles; nothing is registered when the frames
        cannot be queued (the error is raised) or outside confirm mode (0 is returned).

        Args:
            frames: one message's frames, as :meth:`encode_publish` made them.
            waiter: what the broker's confirm settles (``None``: nothing to register).

        Returns:
            The publish's sequence number in confirm mode, else 0.

        Raises:
            InvalidStateError: the channel is closing or closed, or a ``waiter`` came in
                confirm mode before :meth:`use_confirms`; nothing was queued.
        """
        if (
            self.state is not OPEN and self.state is not OPENING
        ) or self._connection_failed is not None:
            self._check_usable("basic.publish")
        if not self.confirm_mode:
            self._send_frames(frames)
            return 0
        confirms = self._confirms
        if waiter is not None and confirms is None:
            raise InvalidStateError(
                f"channel {self.channel_id}: a confirm waiter but no confirm table (use_confirms)"
            )
        self._send_frames(frames)
        seq = self.next_publish_seq
        self.next_publish_seq = seq + 1
        if waiter is not None:
            confirms.add(seq, waiter)  # type: ignore[union-attr]
        return seq

    def close(self, reply_code: int = 200, reply_text: str = "Normal shutdown") -> None:
        """Start closing the channel (channel.close goes out at once).

        Requests still waiting to be sent are dropped: the engine fails their futures
        when the channel-closed event arrives.

        Args:
            reply_code: the code the close carries (200: a normal shutdown).
            reply_text: the text it carries (at most 255 bytes).
        """
        if self.state is CLOSING or self.state is CLOSED:
            return
        frame = method_frame(
            self.channel_id,
            spec.ChannelClose(
                reply_code=reply_code, reply_text=reply_text, class_id=0, method_id=0
            ),
        )
        self.state = CLOSING
        self.close_exc = ChannelClosedByClient(reply_code, reply_text)
        self._pending.clear()
        self._write(frame)

    @property
    def connection_error(self) -> AMQPError | None:
        """The protocol violation the connection is closing for, if any."""
        return self._connection_failed

    def connection_failed(self, exc: AMQPError) -> None:
        """The connection found a protocol violation and sent connection.close: from
        now on every send raises ``InvalidStateError`` caused by ``exc``.

        Args:
            exc: the violation.
        """
        self._connection_failed = exc

    def _check_usable(self, what: str) -> None:
        failed = self._connection_failed
        if failed is not None:
            raise InvalidStateError(
                f"cannot send {what}: the connection is closing after a protocol error ({failed})"
            ) from failed
        if self.state is CLOSING or self.state is CLOSED:
            why = f" ({self.close_exc})" if self.close_exc is not None else ""
            exc = InvalidStateError(f"cannot send {what}: channel {self.channel_id} is closed{why}")
            raise exc from self.close_exc

    def _start_rpc(self, request: tuple[tuple[type[Method], ...], bytes]) -> None:
        self._rpc_responses, frame = request
        self._rpc_outstanding = True
        self._write(frame)

    def _send_frames(self, frames: list[bytes]) -> None:
        if not self._rpc_outstanding and not self._pending:
            self._write_many(frames)
        else:
            self._pending.append(frames)

    def _rpc_done(self) -> None:
        self._rpc_outstanding = False
        self._rpc_responses = ()
        pending = self._pending
        while pending:
            item = pending.popleft()
            if isinstance(item, list):
                self._write_many(item)
            else:
                self._start_rpc(item)
                return

    # ------------------------------------------------------------------ receiving

    def receive_frame(self, kind: int, payload: bytes) -> None:
        """Handle one frame for this channel (called by the connection).

        Args:
            kind: the frame type (method, header or body).
            payload: the frame's payload.

        Raises:
            RemoteProtocolError: the frame breaks the protocol; the connection fails.
        """
        if self.state is CLOSING:
            # channel.close (§1.5.2.5): after sending close, discard every frame but
            # close and close-ok; that includes the rest of a message in flight.
            self._content.reset()
            if kind == FRAME_METHOD:
                self._receive_method(spec.decode_method(payload))
            return
        if kind == FRAME_METHOD:
            if self._content.method is not None:
                raise RemoteProtocolError(
                    f"method frame on channel {self.channel_id} while content was expected", 505
                )
            self._receive_method(spec.decode_method(payload))
        elif kind == FRAME_HEADER:
            if self._content.header(payload, self._rpc_responses):
                self._rpc_done()  # the header completed a basic.get-ok with no body
        elif kind == FRAME_BODY:
            if self._content.body(payload, self._rpc_responses):
                self._rpc_done()  # the body completed a basic.get-ok
        else:
            raise RemoteProtocolError(f"unknown frame type {kind}", 501)

    def _receive_method(self, method: Method) -> None:
        if self.state is CLOSING:
            # §2.3.5.2 / channel.close: after sending close, discard everything but
            # close and close-ok.
            if type(method) is spec.ChannelCloseOk:
                self.finish(self.close_exc or ChannelClosedByClient(200, "Normal shutdown"))
            elif type(method) is spec.ChannelClose:
                self._write(method_frame(self.channel_id, spec.ChannelCloseOk()))
                self.finish(self.close_exc or ChannelClosedByClient(200, "Normal shutdown"))
            return
        if method.CONTENT:
            self._content.method = method
            return
        cls = type(method)
        if cls in self._rpc_responses:
            if cls is spec.ChannelOpenOk:
                self.state = OPEN
            self._conn.event_queue.append(RpcReply(self.channel_id, method))
            self._rpc_done()
        elif cls is spec.BasicAck:
            assert isinstance(method, spec.BasicAck)
            self._conn.event_queue.append(
                PublishConfirmed(self.channel_id, method.delivery_tag, method.multiple, True)
            )
        elif cls is spec.BasicNack:
            assert isinstance(method, spec.BasicNack)
            self._conn.event_queue.append(
                PublishConfirmed(self.channel_id, method.delivery_tag, method.multiple, False)
            )
        elif cls is spec.ChannelClose:
            assert isinstance(method, spec.ChannelClose)
            self._write(method_frame(self.channel_id, spec.ChannelCloseOk()))
            self.finish(
                channel_error_for(
                    method.reply_code, method.reply_text, method.class_id, method.method_id
                )
            )
        elif cls is spec.BasicCancel:
            assert isinstance(method, spec.BasicCancel)
            if not method.nowait:
                self._write(
                    method_frame(
                        self.channel_id, spec.BasicCancelOk(consumer_tag=method.consumer_tag)
                    )
                )
            self._conn.event_queue.append(
                ConsumerCancelledByBroker(self.channel_id, method.consumer_tag)
            )
        elif cls is spec.ChannelFlow:
            assert isinstance(method, spec.ChannelFlow)
            self.flow_active = method.active
            self._write(method_frame(self.channel_id, spec.ChannelFlowOk(active=method.active)))
            self._conn.event_queue.append(FlowChanged(self.channel_id, method.active))
        else:
            expected = (
                " or ".join(r.NAME for r in self._rpc_responses)
                if self._rpc_responses
                else "nothing"
            )
            raise RemoteProtocolError(
                f"unexpected {method.NAME} on channel {self.channel_id} (expected {expected})", 503
            )

    def finish(self, exc: AMQPError) -> None:
        """Mark the channel closed and tell the engine (once).

        Also called by its connection for each of its channels when the connection ends.

        Args:
            exc: why the channel closed; the :class:`ChannelClosedEvent` carries it.
        """
        if self.state is CLOSED:
            return
        self.state = CLOSED
        self.close_exc = exc
        self._pending.clear()
        self._rpc_outstanding = False
        self._rpc_responses = ()
        self._finished(self.channel_id)
        self._conn.event_queue.append(ChannelClosedEvent(self.channel_id, exc))
