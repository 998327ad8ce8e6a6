"""The connection as its recovery drives it: :class:`RecoveryPort`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ..exceptions import AMQPError
from ..protocol.connection import ConnectionState
from ..recovery import State

if TYPE_CHECKING:
    from ..config import ConnectionParameters
    from ..protocol.channel import ChannelProtocol
    from ..record import TopologyRecord
    from ._connect import Connector
    from ._connection_state import ConnectionLifecycle
    from ._dispatch import EventDispatcher
    from ._lifecycle import ChannelEvents
    from ._opener import ChannelOpener
    from ._socket import SocketIO
    from .channel import AsyncChannel

__all__ = ["Endpoint", "RecoveryPort"]

logger = logging.getLogger("rabbitry.connection")


class Endpoint(Protocol):
    """The public attributes of the connection that recovery reads and sets."""

    params: ConnectionParameters
    close_exc: AMQPError | None
    topology_record: TopologyRecord


class RecoveryPort:
    """The connection as its :class:`~rabbitry.aio._recovery.Recovery` drives it.

    For the library's own use. The connection's lifecycle hands it to the recovery it
    starts when the connection drops for a reason worth retrying: the recovery
    reconnects, re-opens the channels, reports what it could not restore and ends the
    outage only through these members (:class:`~rabbitry.aio._recovery.Port`).

    Args:
        endpoint: the connection's public attributes.
        io: its socket side.
        dispatch: its event dispatcher (the channels).
        lifecycle: its lifecycle.
        connector: its connection attempts.
        opener: opens the channels (recovery's own among them).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        io: SocketIO,
        dispatch: EventDispatcher,
        lifecycle: ConnectionLifecycle,
        connector: Connector,
        opener: ChannelOpener,
    ) -> None:
        self._endpoint = endpoint
        self._io = io
        self._dispatch = dispatch
        self._lifecycle = lifecycle
        self._connector = connector
        self._opener = opener

    @property
    def closing(self) -> bool:
        """``close()`` was called: recovery stops."""
        return self._lifecycle.closing

    @property
    def params(self) -> ConnectionParameters:
        """The address connected last: the one that failed, until a reconnect works."""
        return self._endpoint.params

    @property
    def is_open(self) -> bool:
        """The connection of the current attempt is open."""
        proto = self._io.proto
        return proto is not None and proto.is_open

    @property
    def close_exc(self) -> AMQPError | None:
        """Why the connection (or the last attempt) ended."""
        return self._endpoint.close_exc

    @property
    def topology_record(self) -> TopologyRecord:
        """What the channels and ``Topology.apply`` declared: recovery declares it again."""
        return self._endpoint.topology_record

    def candidates(self) -> list[ConnectionParameters]:
        """The configured addresses, in their configured order (a new list)."""
        return list(self._connector.candidates)

    async def connect(self, params: ConnectionParameters) -> None:
        """Connect to ``params``, which becomes :attr:`params`.

        Args:
            params: the address to connect to.

        Raises:
            AMQPError: the connection failed (``OSError`` and ``TimeoutError`` too);
                the attempt is forgotten before the error propagates.
        """
        try:
            await self._connector.connect(params)
        except (AMQPError, OSError, TimeoutError):
            self._lifecycle.reset_attempt()
            raise
        self._endpoint.params = params

    def end_attempt(self, reason: AMQPError | None = None) -> None:
        """Forget the current attempt: its socket, its protocol object and its timers.

        Args:
            reason: if given and the attempt's connection is still open, it is aborted
                with ``reason`` first, and what that causes is handled (its channels
                are suspended again).
        """
        proto = self._io.proto
        if reason is not None and proto is not None and proto.state is ConnectionState.OPEN:
            proto.abort(reason)
            self._dispatch.handle(proto.events_received())
        self._lifecycle.reset_attempt()

    def channels(self) -> list[ChannelEvents[AsyncChannel]]:
        """The hooks of the connection's channels (open or suspended), by channel number."""
        channels = self._dispatch.channels
        return [channels[number] for number in sorted(channels)]

    def reopen(self, channel_id: int) -> ChannelProtocol:
        """Open channel ``channel_id`` on the new connection (channel.open is queued).

        Args:
            channel_id: the number the channel had.

        Returns:
            The channel's new protocol object (for ``ChannelEvents.resume``).
        """
        proto = self._io.proto
        assert proto is not None
        return proto.open_channel(channel_id)

    async def open_channel(self, timeout: float) -> AsyncChannel:
        """Open a channel for recovery's own requests.

        It records nothing for recovery, and is closed, not suspended, if the
        connection drops again.

        Args:
            timeout: seconds to wait for channel.open-ok.

        Returns:
            The open channel.
        """
        return await self._opener.open_channel(timeout)

    def report(self, kind: str, name: str, exc: AMQPError) -> None:
        """Tell the ``on_recovery_error`` callbacks that something was not restored.

        Args:
            kind: what it is: ``"exchange"``, ``"queue"``, ``"binding"``,
                ``"consumer"``, ``"channel"`` or ``"connection"``.
            name: which one.
            exc: why.
        """
        for callback in list(self._lifecycle.recovery_error_callbacks):
            try:
                callback(kind, name, exc)
            except Exception:
                logger.exception("recovery error callback %r failed", callback)

    def renamed(self, old: str, new: str) -> None:
        """Tell the ``on_queue_renamed`` callbacks that a server-named queue was renamed.

        Args:
            old: its name before the connection dropped.
            new: the name the broker gave it now.
        """
        for callback in list(self._lifecycle.rename_callbacks):
            try:
                callback(old, new)
            except Exception:
                logger.exception("rename callback %r failed", callback)

    def recovered(self) -> None:
        """Recovery reconnected and replayed: the connection is OPEN again."""
        lifecycle = self._lifecycle
        assert lifecycle.recovered is not None
        lifecycle.set_state(State.OPEN, None)
        lifecycle.recovered.set()

    def give_up(self, exc: AMQPError) -> None:
        """Recovery failed for good: end the connection with ``exc``.

        Logged at ERROR and reported to the ``on_recovery_error`` callbacks as
        ``("connection", address, exc)``.

        Args:
            exc: why recovery gave up.
        """
        address = self._endpoint.params.address
        logger.error("giving up recovering the connection to %s: %r", address, exc)
        self.report("connection", address, exc)
        self._lifecycle.finish_closed(exc)
