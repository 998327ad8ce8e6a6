"""Content assembly (§4.2.6): a content method, its header frame and its body frames.

A :class:`~rabbitry.protocol.channel.ChannelProtocol` holds one :class:`ContentAssembler`
and hands it the header and body frames; the complete message becomes a
:class:`~rabbitry.protocol.events.Delivery`, :class:`~rabbitry.protocol.events.Returned`
or :class:`~rabbitry.protocol.events.RpcReply` event. This runs once per delivery: the
channel calls :meth:`ContentAssembler.header` and :meth:`ContentAssembler.body` in place
of methods of its own, so that no call is added per message.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Protocol

from ..exceptions import RemoteProtocolError
from . import spec
from .events import Delivery, Returned, RpcReply
from .message import Message

if TYPE_CHECKING:
    from .events import Event
    from .frames import Method

# Content-bearing methods we can receive, and what to make of them when complete.
_DELIVER = spec.BasicDeliver.INDEX
_RETURN = spec.BasicReturn.INDEX
_GET_OK = spec.BasicGetOk.INDEX


class ContentSink(Protocol):
    """What an assembler uses of its connection: the size limit and the event queue."""

    max_message_size: int
    event_queue: list[Event]


class ContentAssembler:
    """Assembles one channel's incoming messages from their frames into events.

    Args:
        connection: where the limit on bodies is read and the events go.
        channel_id: the channel number the events carry.
    """

    __slots__ = ("_conn", "_parts", "_props", "_received", "_size", "channel_id", "method")

    def __init__(self, connection: ContentSink, channel_id: int) -> None:
        self._conn = connection
        self.channel_id = channel_id
        #: The content method (deliver, get-ok, return) whose content is awaited, if any.
        self.method: Method | None = None
        self._props: spec.BasicProperties | None = None
        self._size = 0
        self._parts: list[bytes] = []
        self._received = 0

    def header(self, payload: bytes, rpc_responses: tuple[type[Method], ...]) -> bool:
        """Take the content header frame of the awaited message.

        Args:
            payload: the header frame's payload.
            rpc_responses: the answers the channel's outstanding request awaits.

        Returns:
            ``True`` when the message was a basic.get-ok and is now complete (its body
            is empty): the channel's request is answered.

        Raises:
            RemoteProtocolError: no content method came first, a header came already,
                the header is malformed or announces a body above max_message_size.
        """
        method = self.method
        if method is None or self._props is not None:
            raise RemoteProtocolError(
                f"content header on channel {self.channel_id} without a content method", 505
            )
        if len(payload) < 14:
            raise RemoteProtocolError("content header shorter than 14 bytes", 502)
        class_id = (payload[0] << 8) | payload[1]
        if class_id != 60:
            raise RemoteProtocolError(f"content header for class {class_id}, expected 60", 505)
        size = int.from_bytes(payload[4:12], "big")
        max_size = self._conn.max_message_size
        if max_size and size > max_size:
            raise RemoteProtocolError(
                f"message body of {size} bytes exceeds max_message_size {max_size}", 501
            )
        try:
            props, end = spec.BasicProperties.decode(payload, 12)
        except RemoteProtocolError:
            raise
        except (struct.error, IndexError, ValueError, OverflowError, RecursionError) as exc:
            raise RemoteProtocolError(f"malformed content header: {exc}", 502) from None
        if end != len(payload):
            raise RemoteProtocolError("malformed content header: trailing bytes", 502)
        self._props = props
        self._size = size
        if size == 0:
            return self._complete(b"", rpc_responses)
        return False

    def body(self, payload: bytes, rpc_responses: tuple[type[Method], ...]) -> bool:
        """Take a body frame of the message being assembled.

        Args:
            payload: the body frame's payload.
            rpc_responses: the answers the channel's outstanding request awaits.

        Returns:
            ``True`` when the message was a basic.get-ok and is now complete: the
            channel's request is answered.

        Raises:
            RemoteProtocolError: no header came first, the body is longer than the
                header announced, or the message cannot be accepted.
        """
        if self._props is None:
            raise RemoteProtocolError(
                f"content body on channel {self.channel_id} without a content header", 505
            )
        received = self._received + len(payload)
        if received > self._size:
            raise RemoteProtocolError(
                f"content body longer than the {self._size} bytes its header announced",
                501,
            )
        if received == self._size and not self._parts:
            return self._complete(payload, rpc_responses)
        self._parts.append(payload)
        self._received = received
        if received == self._size:
            return self._complete(b"".join(self._parts), rpc_responses)
        return False

    def reset(self) -> None:
        """Forget the message being assembled (the channel is closing)."""
        self.method = None
        self._props = None
        if self._parts:  # the common one-frame body never filled it: keep it
            self._parts = []
        self._received = 0
        self._size = 0

    def _complete(self, body: bytes, rpc_responses: tuple[type[Method], ...]) -> bool:
        method = self.method
        props = self._props
        assert method is not None and props is not None
        # reset(), inlined: this runs once per delivery.
        self.method = None
        self._props = None
        if self._parts:
            self._parts = []
        self._received = 0
        self._size = 0
        index = method.INDEX
        events = self._conn.event_queue
        if index == _DELIVER:
            assert isinstance(method, spec.BasicDeliver)
            message = Message(
                body,
                props,
                delivery_tag=method.delivery_tag,
                redelivered=method.redelivered,
                exchange=method.exchange,
                routing_key=method.routing_key,
                consumer_tag=method.consumer_tag,
            )
            events.append(Delivery(self.channel_id, message))
            return False
        elif index == _GET_OK:
            assert isinstance(method, spec.BasicGetOk)
            if spec.BasicGetOk not in rpc_responses:
                raise RemoteProtocolError("basic.get-ok without a basic.get", 503)
            message = Message(
                body,
                props,
                delivery_tag=method.delivery_tag,
                redelivered=method.redelivered,
                exchange=method.exchange,
                routing_key=method.routing_key,
                message_count=method.message_count,
            )
            events.append(RpcReply(self.channel_id, method, message))
            return True
        elif index == _RETURN:
            assert isinstance(method, spec.BasicReturn)
            message = Message(
                body,
                props,
                exchange=method.exchange,
                routing_key=method.routing_key,
                reply_code=method.reply_code,
                reply_text=method.reply_text,
            )
            events.append(Returned(self.channel_id, message))
            return False
        # basic.publish from the broker: not a thing a client accepts
        raise RemoteProtocolError(f"unexpected {method.NAME} from the broker", 503)
