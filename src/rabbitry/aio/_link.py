"""The state a channel's collaborators share: its protocol object, recovery and end.

:class:`ChannelLink` is one object per :class:`~rabbitry.aio.channel.AsyncChannel`,
held by the channel and by each of its collaborators (requests, consumers, lifecycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.tags import DeliveryTags

if TYPE_CHECKING:
    import asyncio

    from ..exceptions import AMQPError
    from ..protocol.channel import ChannelProtocol

__all__ = ["ChannelLink"]


class ChannelLink:
    """What a channel and its collaborators share: the channel's current protocol
    object, whether the connection is recovering under it, its delivery tags, its
    QoS and its end.

    Args:
        protocol: the channel's protocol state (replaced when recovery re-opens it).
        closed: resolved with the reason when the channel ends.
    """

    __slots__ = ("channel_id", "closed", "lost_reason", "protocol", "qos", "suspended", "tags")

    def __init__(self, protocol: ChannelProtocol, closed: asyncio.Future[AMQPError]) -> None:
        self.channel_id = protocol.channel_id
        #: The channel's current protocol object.
        self.protocol = protocol
        #: The connection died under the channel and is recovering it.
        self.suspended = False
        #: Delivery tags keep growing across recoveries (see rabbitry.protocol.tags):
        #: settling a tag of a dead connection is dropped.
        self.tags = DeliveryTags()
        #: The last basic.qos sent, ``(count, size, global)``, replayed by recovery.
        self.qos: tuple[int, int, bool] | None = None
        #: Resolved with the reason when the channel ends.
        self.closed = closed
        #: Set by recovery when it could not restore the channel.
        self.lost_reason: AMQPError | None = None
