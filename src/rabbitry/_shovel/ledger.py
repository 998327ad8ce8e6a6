"""What a shovel run remembers of the messages it handled, to recognise redeliveries."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..protocol.message import Message

__all__ = ["REMEMBERED", "ShovelLedger", "key_of"]

#: How many message ids of confirmed copies are remembered to recognise redeliveries.
REMEMBERED = 200_000


def key_of(message: Message) -> tuple[str | None, str]:
    """``(message_id, digest)``: the id recognises a message; the digest only counts.

    Args:
        message: a message taken from the source queue.

    Returns:
        Its ``message_id`` property (``None`` without one) and a digest of its body,
        routing key and headers.
    """
    digest = hashlib.blake2b(bytes(message.body), digest_size=16)
    digest.update(message.routing_key.encode())
    digest.update(repr(message.properties.headers).encode())
    return message.properties.message_id, digest.hexdigest()


def _remember(store: OrderedDict[str, None], key: str) -> None:
    store[key] = None
    store.move_to_end(key)
    if len(store) > REMEMBERED:
        store.popitem(last=False)


class ShovelLedger:
    """Remembers (boundedly) which messages were sent, confirmed and acknowledged."""

    def __init__(self) -> None:
        # Ids of messages whose copy was confirmed, to recognise their redelivery.
        self._confirmed: OrderedDict[str, None] = OrderedDict()
        # Digests of messages already sent once (confirmed or outcome unknown).
        self._sent: OrderedDict[str, None] = OrderedDict()
        # Ids (or digests) of messages acknowledged at the source: an ack can be lost
        # with the connection, and the redelivered message must not count twice.
        self._acked: OrderedDict[str, None] = OrderedDict()

    def was_confirmed(self, message_id: str) -> bool:
        """Whether a copy of the message with this id was confirmed."""
        return message_id in self._confirmed

    def was_sent(self, digest: str) -> bool:
        """Whether a copy of a message with this digest was sent before."""
        return digest in self._sent

    def sent(self, digest: str) -> None:
        """Remember that a copy of the message with this digest was sent."""
        _remember(self._sent, digest)

    def confirmed(self, message_id: str) -> None:
        """Remember that the copy of the message with this id was confirmed."""
        _remember(self._confirmed, message_id)

    def acknowledged(self, key: str) -> bool:
        """Remember a source message as acknowledged.

        Returns:
            ``True`` the first time ``key`` is acknowledged, ``False`` after.
        """
        if key in self._acked:
            return False
        _remember(self._acked, key)
        return True
