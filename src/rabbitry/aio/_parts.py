"""The collaborators of an :class:`~rabbitry.aio.connection.AsyncConnection`, wired."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..exceptions import ConfigurationError
from ..publishing.pipe import WritePath
from ._connect import Connector
from ._connection_state import ConnectionLifecycle, Owner
from ._dispatch import EventDispatcher
from ._opener import ChannelOpener, ChannelOwner
from ._recovery_port import Endpoint, RecoveryPort
from ._socket import SocketIO
from ._timers import Timers

if TYPE_CHECKING:
    from ..config import ConnectionParameters
    from ._connect import CredentialsProvider
    from ._lifecycle import ChannelEvents
    from .channel import AsyncChannel

__all__ = ["Connection", "Parts", "assemble", "check_provider"]


class Connection(Owner, Endpoint, ChannelOwner, Protocol):
    """The connection as its collaborators know it: its public attributes."""


class Parts(NamedTuple):
    """The collaborators of one connection (see :mod:`rabbitry.aio.connection`)."""

    io: SocketIO
    timers: Timers
    dispatch: EventDispatcher
    life: ConnectionLifecycle
    connector: Connector
    opener: ChannelOpener


def check_provider(credentials_provider: CredentialsProvider | None) -> None:
    """Refuse a ``credentials_provider`` that cannot be called.

    Raises:
        ConfigurationError: it is not callable.
    """
    if credentials_provider is not None and not callable(credentials_provider):
        raise ConfigurationError(
            "credentials_provider: must be a callable returning (username, password), "
            f"not {type(credentials_provider).__name__}"
        )


def assemble(
    connection: Connection,
    channels: dict[int, ChannelEvents[AsyncChannel]],
    candidates: list[ConnectionParameters],
    credentials_provider: CredentialsProvider | None,
    max_message_size: int | None,
) -> Parts:
    """Create the collaborators of ``connection`` and wire them to each other.

    Returns:
        They.
    """
    io = SocketIO(channels)
    timers = Timers(io)
    dispatch = EventDispatcher(io, timers, channels)
    life = ConnectionLifecycle(connection, io, timers, dispatch)
    io.sink = timers.sink = dispatch
    dispatch.ends = life
    io.writes = WritePath(io.kick, io.flush, life.await_recovery)
    connector = Connector(candidates, credentials_provider, max_message_size, io, life)
    opener = ChannelOpener(connection, io, dispatch)
    life.port = RecoveryPort(connection, io, dispatch, life, connector, opener)
    return Parts(io, timers, dispatch, life, connector, opener)
