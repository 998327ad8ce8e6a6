"""The message encoder of a publisher: message ids, properties and frames.

One per :class:`rabbitry.AsyncPublisher`, shared with its thread-safe twin, which
encodes in the calling thread (so an invalid message raises there, before anything is
handed to the IO thread).
"""

from __future__ import annotations

import copy
import itertools
import secrets
from typing import TYPE_CHECKING, Any

from ..exceptions import LocalProtocolError, MessageTooLarge
from ..protocol.publish import PublishEncoder, as_body, properties_prefix
from ..protocol.spec import BasicProperties
from .messages import Body, OutgoingMessage, as_properties, expiration_ms

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from datetime import timedelta

    from ..protocol import spec

__all__ = ["Encoded", "MessageEncoder"]

#: One encoded message: frames, message_id, mandatory.
Encoded = tuple[list[bytes], str | None, bool]

_CACHE_LIMIT = 512
_PLAIN_TEMPLATE = properties_prefix(None, None)


class MessageEncoder:
    """Turns messages into the frames of the publisher's current channel; any thread.

    The channel's frame encoder is swapped as one object (:meth:`use_channel`), so that
    a thread never mixes two channels; until a channel is open it encodes for channel 0
    without a frame_max.
    """

    __slots__ = ("_encoder", "_id_prefix", "_ids", "_max_size", "_templates", "mandatory")

    def __init__(self, mandatory: bool, max_size: int) -> None:
        #: The default of ``mandatory`` for the messages of a batch that set none.
        self.mandatory = mandatory
        self._encoder = PublishEncoder(0)
        self._max_size = max_size
        self._templates: dict[tuple[Any, Any], bytes] = {}
        self._id_prefix = secrets.token_hex(8) + "-"
        self._ids = itertools.count(1)

    def use_channel(self, channel_id: int, frame_max: int, max_size: int) -> None:
        """Encode for channel ``channel_id`` from now on, with the broker's limits.

        Args:
            channel_id: the number of the publisher's new channel.
            frame_max: the connection's negotiated frame size.
            max_size: the broker's largest message body (0: no limit).
        """
        self._encoder = PublishEncoder(channel_id, frame_max)
        self._max_size = max_size

    def new_message_id(self) -> str:
        """A message_id as :meth:`encode` generates them (unique to this publisher).

        Returns:
            The next message_id.
        """
        return f"{self._id_prefix}{next(self._ids)}"

    def frames(
        self,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        properties: bytes,
        body: bytes,
    ) -> list[bytes]:
        """The frames of one message with encoded ``properties``, for the current channel.

        Args:
            exchange: the exchange.
            routing_key: the routing key.
            mandatory: the mandatory flag.
            properties: the encoded content header properties.
            body: the payload.

        Returns:
            The frames, laid out as :mod:`rabbitry.protocol.publish` describes.
        """
        return self._encoder.frames(exchange, routing_key, mandatory, properties, body)

    def encode(
        self,
        body: Body,
        exchange: str,
        routing_key: str,
        properties: spec.BasicProperties | Mapping[str, Any] | None,
        mandatory: bool,
        persistent: bool | None,
        expiration: int | timedelta | None,
    ) -> tuple[list[bytes], str | None]:
        """Encode one message for the current channel; safe from any thread.

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange.
            routing_key: the routing key.
            properties: the basic properties, a mapping of their fields, or ``None``.
            mandatory: the mandatory flag.
            persistent: delivery mode 2 (``True``) or 1 (``False``); ``None``: unset.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.

        Returns:
            The frames (laid out as :mod:`rabbitry.protocol.publish` describes) and the
            message_id.

        Raises:
            MessageTooLarge: the body exceeds the broker's limit.
            LocalProtocolError: an invalid argument.
        """
        encoder = self._encoder
        if type(body) is not bytes:
            body = as_body(body)
        max_size = self._max_size
        if max_size and len(body) > max_size:
            raise MessageTooLarge(len(body), max_size)
        message_id: str | None
        if properties is None:
            template = _PLAIN_TEMPLATE
            if persistent is not None or expiration is not None:
                cached = self._templates.get((persistent, expiration))
                if cached is None or (expiration is not None and type(expiration) is not int):
                    cached = self._template(persistent, expiration)
                template = cached
            message_id = f"{self._id_prefix}{next(self._ids)}"
            frames = encoder.frames(
                exchange, routing_key, mandatory, template, body, message_id.encode()
            )
        else:
            if type(properties) is not BasicProperties:
                properties = as_properties(properties)
            props, message_id = self._properties(properties, persistent, expiration)
            frames = encoder.frames(exchange, routing_key, mandatory, props, body)
        return frames, message_id

    def encode_batch(
        self,
        messages: Iterable[OutgoingMessage | Body],
        exchange: str,
        routing_key: str,
        properties: spec.BasicProperties | Mapping[str, Any] | None,
        mandatory: bool | None,
        persistent: bool | None,
        expiration: int | timedelta | None,
    ) -> list[Encoded]:
        """Encode the messages of a batch (every one before anything is sent).

        Args:
            messages: :class:`OutgoingMessage` objects, or bodies that use the arguments
                below; ``None`` fields of an ``OutgoingMessage`` use them too.
            exchange: as for :meth:`encode`.
            routing_key: likewise.
            properties: likewise.
            mandatory: likewise (``None``: the publisher's default).
            persistent: likewise.
            expiration: likewise.

        Returns:
            A list of (frames, message_id, mandatory), in order.

        Raises:
            LocalProtocolError: ``messages`` is one message, or a message is invalid.
        """
        if isinstance(messages, bytes | bytearray | memoryview | str | OutgoingMessage):
            raise LocalProtocolError(
                "publish_batch.messages: must be an iterable of messages, got one message"
            )
        default_mandatory = self.mandatory if mandatory is None else mandatory
        encode = self.encode
        out: list[Encoded] = []
        for message in messages:
            if isinstance(message, OutgoingMessage):
                flag = default_mandatory if message.mandatory is None else message.mandatory
                frames, message_id = encode(
                    message.body,
                    exchange if message.exchange is None else message.exchange,
                    routing_key if message.routing_key is None else message.routing_key,
                    properties if message.properties is None else message.properties,
                    flag,
                    persistent if message.persistent is None else message.persistent,
                    expiration if message.expiration is None else message.expiration,
                )
            else:
                flag = default_mandatory
                frames, message_id = encode(
                    message, exchange, routing_key, properties, flag, persistent, expiration
                )
            out.append((frames, message_id, flag))
        return out

    def _template(self, persistent: bool | None, expiration: int | timedelta | None) -> bytes:
        """Encoded properties up to (not including) the message_id value."""
        text = None if expiration is None else expiration_ms(expiration)
        template = properties_prefix(persistent, text)
        if expiration is None or type(expiration) is int:
            if len(self._templates) >= _CACHE_LIMIT:
                self._templates.clear()
            self._templates[(persistent, expiration)] = template
        return template

    def _properties(
        self,
        properties: spec.BasicProperties,
        persistent: bool | None,
        expiration: int | timedelta | None,
    ) -> tuple[bytes, str | None]:
        message_id = properties.message_id
        if message_id is None or persistent is not None or expiration is not None:
            properties = copy.copy(properties)
            if message_id is None:
                message_id = properties.message_id = f"{self._id_prefix}{next(self._ids)}"
            if persistent is not None:
                properties.delivery_mode = 2 if persistent else 1
            if expiration is not None:
                properties.expiration = expiration_ms(expiration)
        return properties.encode(), message_id
