"""basic.publish on the wire: the encoder of its frames and the table of publisher confirms.

:class:`PublishEncoder` is the only place that lays out the frames of a publish (the
method frame, the content header with its property flags, the body frames split at
``frame_max``); every publishing path of the engine uses it. Its output has a fixed
layout that :func:`retarget` and :func:`publish_parts` rely on::

    [method frame,
     header frame head, header payload, frame end,
     body frame head, body part, frame end,     # once per body frame, none if empty
     ...]

so the frame heads are item 0 and every item at index 1, 4, 7, ... and the header
payload (class, weight, body size, properties) is item 2.

:class:`ConfirmTracker` keeps the publishes of a channel in confirm mode that await
their ``basic.ack`` / ``basic.nack`` and applies the confirm rule of the RabbitMQ
extension: a confirm with ``multiple`` set settles every unconfirmed tag up to and
including its tag, one without settles that tag only.

Both are sans-IO: no sockets, threads or clocks.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import TYPE_CHECKING, Generic, TypeVar

from ..exceptions import LocalProtocolError, MessageTooLarge
from . import spec
from .frames import FRAME_BODY, FRAME_OVERHEAD, method_frame

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, KeysView

__all__ = [
    "ConfirmTracker",
    "PublishEncoder",
    "as_body",
    "frames_channel",
    "properties_prefix",
    "publish_key",
    "publish_parts",
    "retarget",
]

_FRAME_HEAD = struct.Struct(">BHI")
_CONTENT_HEAD = struct.Struct(">HHQ")
_FLAGS = struct.Struct(">H")
_EMPTY_PROPERTIES = b"\x00\x00"
_SHORT_LEN = [bytes((n,)) for n in range(256)]
# Property flags of the properties the publisher sets itself (AMQP 0-9-1 §4.2.6.1:
# bit 15 is the first property, content-type).
_FLAG_DELIVERY_MODE = 0x1000
_FLAG_EXPIRATION = 0x0100
_FLAG_MESSAGE_ID = 0x0080
#: Cached method frames per encoder, dropped all at once past this many.
CACHE_LIMIT = 512


def as_body(body: object) -> bytes:
    """A message body as bytes (``str`` as UTF-8).

    Args:
        body: the body as the application gave it.

    Returns:
        ``body`` itself when it is ``bytes``, else a copy as ``bytes``.

    Raises:
        LocalProtocolError: ``body`` is not bytes, bytearray, memoryview or str.
    """
    if isinstance(body, bytes):
        return body
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8")
    raise LocalProtocolError(
        f"basic.publish.body: must be bytes, bytearray, memoryview or str, "
        f"got {type(body).__name__}"
    )


def properties_prefix(persistent: bool | None, expiration: str | None) -> bytes:
    """Encoded basic properties up to, not including, the ``message_id`` value.

    The properties are ``delivery_mode`` (2 if ``persistent``, 1 if ``False``, absent
    if ``None``), ``expiration`` (a digit string, absent if ``None``) and
    ``message_id``, whose value :meth:`PublishEncoder.frames` appends (``message_id=``).

    Args:
        persistent: the delivery mode: ``True`` 2, ``False`` 1, ``None`` absent.
        expiration: the per-message TTL in milliseconds as a digit string, or ``None``.

    Returns:
        The property flags and the values of the properties before ``message_id``.

    Raises:
        LocalProtocolError: ``expiration`` is longer than 255 bytes.
    """
    flags = _FLAG_MESSAGE_ID
    parts = []
    if persistent is not None:
        flags |= _FLAG_DELIVERY_MODE
        parts.append(b"\x02" if persistent else b"\x01")
    if expiration is not None:
        raw = expiration.encode()
        if len(raw) > 255:
            raise LocalProtocolError(f"expiration: at most 255 bytes, got {len(raw)}")
        flags |= _FLAG_EXPIRATION
        parts.append(_SHORT_LEN[len(raw)] + raw)
    return _FLAGS.pack(flags) + b"".join(parts)


class PublishEncoder:
    """Encodes ``basic.publish`` with its content for one channel.

    Safe to use from several threads: it only reads its settings and a cache of
    encoded method frames (one per exchange, routing key and mandatory flag).

    Args:
        channel_id: the channel number written in every frame.
        frame_max: the negotiated maximum frame size (0 = no limit): bodies are split
            to fit, and a method frame or content header that cannot fit is refused.
        max_message_size: :meth:`encode` refuses larger bodies (0 = no limit).
    """

    __slots__ = ("_heads", "channel_id", "frame_max", "max_message_size")

    def __init__(self, channel_id: int, frame_max: int = 0, max_message_size: int = 0) -> None:
        self.channel_id = channel_id
        self.frame_max = frame_max
        self.max_message_size = max_message_size
        self._heads: dict[tuple[str, str, bool], bytes] = {}

    def method_frame(self, exchange: str, routing_key: str, mandatory: bool) -> bytes:
        """The ``basic.publish`` method frame (cached).

        Args:
            exchange: the exchange name.
            routing_key: the routing key.
            mandatory: the mandatory flag.

        Returns:
            The whole method frame, frame-end included.

        Raises:
            LocalProtocolError: an argument is invalid or the frame exceeds ``frame_max``.
        """
        key = (exchange, routing_key, mandatory)
        head = self._heads.get(key)
        if head is None:
            head = self._new_head(key)
        return head

    def _new_head(self, key: tuple[str, str, bool]) -> bytes:
        exchange, routing_key, mandatory = key
        head = method_frame(
            self.channel_id,
            spec.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        )
        frame_max = self.frame_max
        if frame_max and len(head) > frame_max:
            raise LocalProtocolError(
                f"basic.publish: the frame would be {len(head)} bytes, above the negotiated "
                f"frame_max {frame_max} (arguments or properties too large)"
            )
        heads = self._heads
        if len(heads) >= CACHE_LIMIT:
            heads.clear()
        heads[key] = head
        return head

    def encode(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray | memoryview | str,
        properties: spec.BasicProperties | None = None,
        mandatory: bool = False,
    ) -> list[bytes]:
        """The frames of one publish, every argument checked.

        Args:
            exchange: the exchange name.
            routing_key: the routing key.
            body: the message body (``str`` is sent as UTF-8).
            properties: the message properties (``None``: none).
            mandatory: the mandatory flag.

        Returns:
            The frames in the layout of the module docstring.

        Raises:
            MessageTooLarge: the body exceeds ``max_message_size``.
            LocalProtocolError: the exchange, routing key, properties or body are
                invalid, or do not fit ``frame_max``; nothing was produced.
        """
        if type(body) is not bytes:
            body = as_body(body)
        max_size = self.max_message_size
        if max_size and len(body) > max_size:
            raise MessageTooLarge(len(body), max_size)
        props = _EMPTY_PROPERTIES if properties is None else properties.encode()
        return self.frames(exchange, routing_key, mandatory, props, body)

    def frames(
        self,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        properties: bytes,
        body: bytes,
        message_id: bytes | None = None,
    ) -> list[bytes]:
        """The frames of one publish whose properties are encoded already.

        The fast path of publishers: the method frame comes from the cache, and with
        ``message_id`` the properties are a :func:`properties_prefix` to which the
        message id is appended. ``max_message_size`` is not checked here.

        Args:
            exchange: the exchange name.
            routing_key: the routing key.
            mandatory: the mandatory flag.
            properties: the encoded property flags and values.
            body: the message body.
            message_id: the value of the ``message_id`` property, appended to
                ``properties`` (at most 255 bytes).

        Returns:
            The frames in the layout of the module docstring.

        Raises:
            LocalProtocolError: an argument is invalid, or the method frame or the
                content header does not fit ``frame_max``; nothing was produced.
        """
        head = self._heads.get((exchange, routing_key, mandatory))
        if head is None:
            head = self._new_head((exchange, routing_key, mandatory))
        if message_id is not None:
            try:
                properties = properties + _SHORT_LEN[len(message_id)] + message_id
            except IndexError:
                raise LocalProtocolError(
                    f"basic.properties.message_id: at most 255 bytes, got {len(message_id)}"
                ) from None
        frame_max = self.frame_max
        # Header frame = 7 (frame head) + 12 (class, weight, size) + properties + 1 (end).
        if frame_max and len(properties) + 20 > frame_max:
            raise LocalProtocolError(
                f"basic.properties: the content header would be {len(properties) + 20} "
                f"bytes, above the negotiated frame_max {frame_max} (headers too large)"
            )
        channel = self.channel_id
        size = len(body)
        # Literals on this path (it runs once per message): class 60 is basic, frame
        # type 2 a content header (FRAME_HEADER), 3 a body (FRAME_BODY), 206 ends a frame.
        header = _CONTENT_HEAD.pack(60, 0, size) + properties
        pack = _FRAME_HEAD.pack
        if size <= frame_max - 8 or not frame_max:
            if not size:
                return [head, pack(2, channel, len(header)), header, b"\xce"]
            return [
                head,
                pack(2, channel, len(header)),
                header,
                b"\xce",
                pack(3, channel, size),
                body,
                b"\xce",
            ]
        out = [head, pack(2, channel, len(header)), header, b"\xce"]
        # A large body is not copied: its pieces are memoryview slices of ``body``
        # (immutable bytes); every consumer of frames takes any buffer.
        chunk = frame_max - FRAME_OVERHEAD
        view = memoryview(body)
        for start in range(0, size, chunk):
            part = view[start : start + chunk]
            out += (pack(FRAME_BODY, channel, len(part)), part, b"\xce")  # type: ignore[arg-type]
        return out


def retarget(frames: list[bytes], channel_id: int) -> list[bytes]:
    """The frames of a publish (as :class:`PublishEncoder` lays them out) addressed to
    channel ``channel_id`` (for a resend on another channel).

    Args:
        frames: the frames of one publish.
        channel_id: the channel to address them to.

    Returns:
        New frame heads with the channel number replaced; the other pieces are shared.
    """
    number = channel_id.to_bytes(2, "big")
    out = [frames[0][:1] + number + frames[0][3:]]
    for index in range(1, len(frames)):
        piece = frames[index]
        out.append(piece[:1] + number + piece[3:] if index % 3 == 1 else piece)
    return out


def frames_channel(frames: list[bytes]) -> bytes:
    """The channel number (2 bytes, big-endian) the frames of a publish are addressed to.

    Args:
        frames: the frames of one publish.

    Returns:
        The two bytes of the channel number in the method frame's head.
    """
    return frames[0][1:3]


def publish_parts(frames: list[bytes]) -> tuple[bytes, bytes]:
    """The encoded properties and the body of the frames of one publish.

    Args:
        frames: the frames of one publish.

    Returns:
        ``(encoded property flags and values, body)``.
    """
    properties = frames[2][_CONTENT_HEAD.size :]
    if len(frames) == 7:
        body = bytes(frames[5])
    elif len(frames) == 4:
        body = b""
    else:
        body = b"".join(frames[5::3])
    return properties, body


def publish_key(head: bytes) -> tuple[str, str, bool]:
    """``(exchange, routing_key, mandatory)`` of an encoded ``basic.publish`` method frame.

    Args:
        head: the method frame, frame head and frame-end included.

    Returns:
        The exchange, routing key and mandatory flag it carries.

    Raises:
        RemoteProtocolError: the frame is not a well-formed method frame.
        LocalProtocolError: the frame is another method than ``basic.publish``.
    """
    method = spec.decode_method(head[_FRAME_HEAD.size : -1])
    if type(method) is not spec.BasicPublish:
        raise LocalProtocolError(f"not a basic.publish frame: {method.NAME}")
    return method.exchange, method.routing_key, method.mandatory


W = TypeVar("W")


class ConfirmTracker(Generic[W]):
    """The publishes of one channel in confirm mode that await the broker's confirm.

    Each is a waiter (anything: the engine decides what settling means) under its
    delivery tag, the publish sequence number of the channel (1, 2, 3... in the order
    sent). :meth:`confirm` applies a ``basic.ack`` or ``basic.nack`` from the broker:
    with ``multiple`` it settles every tracked tag up to and including its tag (acks
    and nacks alike), without it that tag only; tags it does not hold (confirmed
    already, or forgotten with :meth:`take_all`) are ignored. Settling a waiter calls
    ``settle(waiter, tag, ack)``, where ``tag`` is the confirm's tag (for a multiple
    confirm, the highest one it covers).

    Tags must be added in increasing order, which is the order the broker numbers
    publishes in; a channel that starts numbering again (after recovery, a new
    channel is opened) starts from an empty tracker (:meth:`take_all`).

    Args:
        settle: called once for each waiter a confirm settles, oldest first.
    """

    __slots__ = ("_order", "_pending", "_settle")

    def __init__(self, settle: Callable[[W, int, bool], object]) -> None:
        self._settle = settle
        self._pending: dict[int, W] = {}
        # Tags in the order added; a multiple confirm pops from the left, O(settled).
        self._order: deque[int] = deque()

    def add(self, tag: int, waiter: W) -> None:
        """Track a publish just sent with delivery tag ``tag``.

        Args:
            tag: the publish's sequence number, above every tag added before.
            waiter: what the confirm of ``tag`` settles.
        """
        self._pending[tag] = waiter
        self._order.append(tag)

    def confirm(self, tag: int, multiple: bool, ack: bool) -> bool:
        """Apply a ``basic.ack`` (``ack``) or ``basic.nack`` of ``tag`` from the broker.

        Args:
            tag: the confirm's delivery tag.
            multiple: it confirms every tracked tag up to and including ``tag``.
            ack: ``True`` for basic.ack, ``False`` for basic.nack.

        Returns:
            ``True`` when no publish is left unconfirmed afterwards.
        """
        pending = self._pending
        order = self._order
        settle = self._settle
        if multiple:
            while order and order[0] <= tag:
                waiter = pending.pop(order.popleft(), None)
                if waiter is not None:
                    settle(waiter, tag, ack)
        else:
            waiter = pending.pop(tag, None)
            if waiter is not None:
                settle(waiter, tag, ack)
            while order and order[0] not in pending:
                order.popleft()
        return not self._pending  # a settle callback may have published again

    def get(self, tag: int) -> W | None:
        """The waiter of ``tag``, if it is still unconfirmed.

        Args:
            tag: a delivery tag.

        Returns:
            The waiter, or ``None`` when ``tag`` is not tracked.
        """
        return self._pending.get(tag)

    def tags(self) -> KeysView[int]:
        """The unconfirmed tags (a live view)."""
        return self._pending.keys()

    def take_all(self) -> dict[int, W]:
        """Forget every unconfirmed publish (the channel ended); returns them by tag."""
        pending, self._pending = self._pending, {}
        self._order.clear()
        return pending

    def __iter__(self) -> Iterator[tuple[int, W]]:
        """The unconfirmed publishes as ``(tag, waiter)``, oldest first."""
        pending = self._pending
        for tag in list(self._order):
            waiter = pending.get(tag)
            if waiter is not None:
                yield tag, waiter

    def __len__(self) -> int:
        return len(self._pending)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __contains__(self, tag: object) -> bool:
        return tag in self._pending
