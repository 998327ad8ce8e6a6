"""Which unconfirmed publish a broker's channel.close refused (pure; no I/O).

Theory of operation
-------------------
RabbitMQ refuses a publish by closing its channel: ``channel.close`` with a reply code
(404, 403, 406...) whose ``class_id``/``method_id`` name ``basic.publish`` (60/40). The
close carries no delivery tag, so the client has to work out which of its unconfirmed
publishes caused it. What is certain:

* the broker handles a channel's frames in order and, once it has sent
  ``channel.close``, discards every method that follows except close/close-ok
  (AMQP 0-9-1, channel.close: "After sending this method, any received methods except
  Close and Close-OK MUST be discarded"). Publishes sent *after* the refused one were
  never processed;
* publishes sent *before* it were processed but may still lack their confirm (a
  persistent message waits for the disk, a quorum queue for its replicas). They may or
  may not have been routed: the first unconfirmed publish is *not* necessarily the
  refused one.

So the refused publish is found by what the reply text names: the exchange for 404
("no exchange 'x'") and 403 ("access to exchange 'x' ... refused",
"cannot publish to internal exchange 'x'"), the body size ("message size N is larger
than configured max size M"), the ``user_id`` ("user_id property set to 'u'"), the
delivery mode. The first unconfirmed publish that matches is the refused one. When the
text names nothing recognisable, a lone unconfirmed publish is the refused one; with
several the refusal cannot be attributed and :func:`refused_index` returns ``None``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .spec import BasicProperties

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["PublishSummary", "is_publish_refusal", "refused_index", "summarize"]

#: basic.publish: the method a refusing channel.close names.
_PUBLISH = (60, 40)
#: Method frame: 7 bytes of frame head, class and method ids, the reserved ticket; then
#: the exchange as a shortstr.
_EXCHANGE_AT = 7 + 2 + 2 + 2
#: Content header payload: class id, weight, body size (8 bytes), then the properties.
_SIZE_AT = 4
_PROPERTIES_AT = 12


class PublishSummary:
    """What matching needs from one sent publish, read from its encoded frames.

    Args:
        exchange: the exchange the publish named.
        size: the body size its content header announced.
        header: the content header payload, whose properties are decoded on demand.
    """

    __slots__ = ("_header", "exchange", "size")

    def __init__(self, exchange: str, size: int, header: bytes) -> None:
        self.exchange = exchange
        self.size = size
        self._header = header

    @property
    def properties(self) -> BasicProperties:
        """The message's properties (decoded on demand)."""
        props, _ = BasicProperties.decode(self._header, _PROPERTIES_AT)
        return props


def summarize(method_frame: bytes, header_payload: bytes) -> PublishSummary | None:
    """Read the exchange and body size of a publish from its method frame and header.

    Never raises.

    Args:
        method_frame: the whole basic.publish method frame, frame head included.
        header_payload: the payload of its content header frame.

    Returns:
        The summary; ``None`` for bytes that are not a basic.publish laid out as the
        encoder makes it.
    """
    try:
        length = method_frame[_EXCHANGE_AT]
        exchange = method_frame[_EXCHANGE_AT + 1 : _EXCHANGE_AT + 1 + length].decode(
            "utf-8", "surrogateescape"
        )
        size = int.from_bytes(header_payload[_SIZE_AT:_PROPERTIES_AT], "big")
    except (IndexError, UnicodeError):
        return None
    return PublishSummary(exchange, size, header_payload)


def is_publish_refusal(reply_code: int, class_id: int, method_id: int) -> bool:
    """Whether a broker's channel.close refuses a basic.publish.

    Args:
        reply_code: the close's reply code (200 is a normal close, never a refusal).
        class_id: the class of the method that caused the close.
        method_id: that method's id; basic.publish is class 60, method 40.

    Returns:
        True for an error close that names basic.publish.
    """
    return reply_code != 200 and (class_id, method_id) == _PUBLISH


def _quoted(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.replace("Q", "'(.*?)'"))


# Reply texts of RabbitMQ 3.x and 4.x for refused publishes, and how each names the
# message it refuses: 404 NOT_FOUND and 403 ACCESS_REFUSED name the exchange, 406
# PRECONDITION_FAILED the body size, the user_id property or the delivery mode.
_EXCHANGE_TEXTS = (
    _quoted(r"no exchange Q"),
    _quoted(r"access to exchange Q in vhost .* refused"),
    _quoted(r"cannot publish to internal exchange Q"),
    _quoted(r"to topic Q in exchange Q"),  # topic authorisation: the exchange is second
)
_SIZE_TEXT = re.compile(r"message size (\d+) is larger than")
_USER_TEXT = _quoted(r"user_id property set to Q")
_MODE_TEXT = re.compile(r"delivery_mode_unknown,\s*(\d+)")


def _matcher(reply_text: str) -> Callable[[PublishSummary], bool] | None:
    for pattern in _EXCHANGE_TEXTS:
        found = pattern.search(reply_text)
        if found:
            exchange = found.groups()[-1]
            return lambda p: p.exchange == exchange
    found = _SIZE_TEXT.search(reply_text)
    if found:
        size = int(found.group(1))
        return lambda p: p.size == size
    found = _USER_TEXT.search(reply_text)
    if found:
        user = found.group(1)
        return lambda p: p.properties.user_id == user
    found = _MODE_TEXT.search(reply_text)
    if found:
        mode = int(found.group(1))
        return lambda p: p.properties.delivery_mode == mode
    return None


def refused_index(reply_text: str, candidates: Sequence[PublishSummary | None]) -> int | None:
    """The index, in send order, of the unconfirmed publish a refusal names.

    Args:
        reply_text: the channel.close reply text.
        candidates: the unconfirmed publishes in the order they were sent; ``None`` for
            one whose frames are not known.

    Returns:
        The index of the first candidate the text names; the only candidate when the
        text names nothing recognisable; else ``None`` (not attributable).
    """
    match = _matcher(reply_text)
    if match is not None:
        for index, candidate in enumerate(candidates):
            if candidate is not None and match(candidate):
                return index
        return None
    return 0 if len(candidates) == 1 else None
