"""Delivery tags of one channel across connection recoveries, without I/O.

The broker numbers the deliveries of a channel 1, 2, 3... per connection: a channel
recovered on a new connection is numbered from 1 again. An application holds the tags
it was handed across a recovery, and an ack of an old tag sent on the new channel would
settle a different delivery (or make the broker close the channel with 406). So the
tags handed out keep growing across recoveries:

* a delivery is handed out as the broker's number plus the channel's *offset*, the
  highest tag handed out before the last recovery (:meth:`DeliveryTags.stamp`), and
  stamped with the channel's recovery *epoch*;
* a recovery starts a new epoch and moves the offset up to the highest tag handed out
  so far (:meth:`DeliveryTags.new_epoch`);
* a settlement (ack, nack, reject) of a tag at or below the offset, or made while the
  connection is down, is *stale*: its delivery died with its connection (the broker
  redelivers it), and it is not sent (:meth:`DeliveryTags.wire_tag` returns ``None``);
  ``multiple`` never reaches across a recovery since tag 0 ("everything so far") means
  the current connection's deliveries only.

The engine keeps one :class:`DeliveryTags` per channel, for the channel's whole life.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .message import AckTarget, Message

__all__ = ["DeliveryTags"]


class DeliveryTags:
    """The numbering of one channel's deliveries across its recoveries.

    Attributes:
        epoch: the channel's recovery epoch: 0, then one more per recovery.
        offset: what is added to the broker's tags on the current connection.
        highest: the highest tag handed out so far.
        stale: how many settlements :meth:`wire_tag` refused as stale.
    """

    __slots__ = ("epoch", "highest", "offset", "stale")

    def __init__(self) -> None:
        self.epoch = 0
        self.offset = 0
        self.highest = 0
        self.stale = 0

    def stamp(self, message: Message, channel: AckTarget) -> None:
        """Give a message just received from the broker its tag, epoch and channel.

        Its ``delivery_tag`` (the broker's number) becomes the tag handed out, its
        ``epoch`` the current epoch, and ``channel`` what its ``ack()`` and friends go
        through (:meth:`Message.settle_through`).

        Args:
            message: a delivery (basic.deliver) or a fetched message (basic.get-ok), as
                the channel protocol made it.
            channel: the channel that received it.
        """
        message.settle_through(channel)
        message.epoch = self.epoch
        tag = message.delivery_tag = message.delivery_tag + self.offset
        if tag > self.highest:
            self.highest = tag

    def new_epoch(self) -> None:
        """The connection died: every tag handed out so far is stale from now on."""
        self.epoch += 1
        self.offset = self.highest

    def wire_tag(self, delivery_tag: int, *, connected: bool = True) -> int | None:
        """The broker's number of a tag handed out, to settle it with; ``None`` when stale.

        Args:
            delivery_tag: the tag handed out (0: "every delivery so far", with
                ``multiple``).
            connected: the channel has a live connection (``False`` while it recovers:
                every settlement is stale).

        Returns:
            The tag to send (0 stays 0), or ``None`` when the settlement is stale and
            must not be sent; it is then counted in :attr:`stale`.
        """
        offset = self.offset
        if not connected or (delivery_tag and delivery_tag <= offset):
            self.stale += 1
            return None
        return delivery_tag - offset if delivery_tag else 0
