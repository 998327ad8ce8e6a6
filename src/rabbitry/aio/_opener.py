"""AsyncConnection's channel opening: :class:`ChannelOpener`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..exceptions import InvalidStateError
from ..protocol.connection import ConnectionProtocol, ConnectionState
from .channel import AsyncChannel, create_channel

if TYPE_CHECKING:
    from ..exceptions import AMQPError
    from ..record import TopologyRecord
    from ..recovery import RecoveryPolicy
    from ._dispatch import EventDispatcher
    from ._socket import ReadFlow, SocketIO

__all__ = ["ChannelOpener", "ChannelOwner"]


class ChannelOwner(Protocol):
    """The connection as its channels and :class:`ChannelOpener` know it."""

    topology_record: TopologyRecord
    recovery: RecoveryPolicy | None
    close_exc: AMQPError | None

    @property
    def read_flow(self) -> ReadFlow:
        """The back-pressure on the connection's socket reads."""

    def consumer_cancelled(self, queue: str) -> None:
        """A consumer of ``queue`` was cancelled (see ``AsyncConnection``)."""


class ChannelOpener:
    """Opens a connection's channels and enters them in its table of channels.

    Args:
        owner: the connection (the channels' connection, its recovery policy).
        io: its socket side (the protocol object, the loop, the write path).
        dispatch: its event dispatcher (the table of channels).
    """

    def __init__(self, owner: ChannelOwner, io: SocketIO, dispatch: EventDispatcher) -> None:
        self._owner = owner
        self._io = io
        self._dispatch = dispatch

    def require_open(self) -> ConnectionProtocol:
        """The protocol object of the open connection.

        Returns:
            It.

        Raises:
            InvalidStateError: the connection is not open (never was, is closing, or
                is closed).
        """
        proto = self._io.proto
        if proto is None or proto.state is not ConnectionState.OPEN:
            close_exc = self._owner.close_exc
            if close_exc is not None:
                raise InvalidStateError("the connection is closed") from close_exc
            if proto is not None and proto.close_exc is not None:
                raise InvalidStateError(
                    f"the connection is closing ({proto.close_exc})"
                ) from proto.close_exc
            raise InvalidStateError("the connection is not open (call connect() first)")
        return proto

    async def open(
        self,
        channel_id: int | None,
        timeout: float | None,
        *,
        record: bool = True,
        internal: bool = False,
    ) -> AsyncChannel:
        """Open a channel now (recovery uses it while the connection is RECOVERING).

        ``record=False``: what the channel declares is not recorded for recovery (the
        channels of recovery itself and of the topology layer, which records on its own).

        Returns:
            The open channel.
        """
        proto = self.require_open()
        channel_proto = proto.open_channel(channel_id)
        policy = self._owner.recovery
        records = record and policy is not None and policy.record_channel_topology
        io = self._io
        loop = io.loop
        assert loop is not None
        hooks = create_channel(
            self._owner,
            channel_proto,
            io.writes,
            loop=loop,
            records=records,
            internal=internal,
            forget=self._dispatch.forget,
        )
        self._dispatch.channels[channel_proto.channel_id] = hooks
        await hooks.wait_open(timeout)
        return hooks.channel

    async def open_channel(self, timeout: float) -> AsyncChannel:
        """Open a channel for recovery's own requests: it records nothing, and is
        closed, not suspended, if the connection drops again.

        Args:
            timeout: seconds to wait for channel.open-ok.

        Returns:
            The open channel.
        """
        return await self.open(None, timeout, record=False, internal=True)
