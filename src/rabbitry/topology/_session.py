"""A channel of its own for the topology operations, and the existence checks.

The consumer checks that its dead-letter exchange and retry queues exist with
:func:`missing_entities`; this module imports neither the consumer nor
:class:`~rabbitry.topology.Topology`, so both may use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from ..exceptions import NotFound, ResourceLocked

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..aio.channel import AsyncChannel
    from ..aio.connection import AsyncConnection

__all__ = ["missing_entities"]


class Session:
    """A dedicated channel, opened on first use and again after a channel error."""

    def __init__(self, connection: AsyncConnection, timeout: float | None) -> None:
        self._connection = connection
        self._timeout = timeout
        self._channel: AsyncChannel | None = None

    async def channel(self) -> AsyncChannel:
        if self._channel is None or not self._channel.is_open:
            self._channel = await self._connection.channel(timeout=self._timeout)
        return self._channel

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and channel.is_open:
            await channel.close(timeout=self._timeout)


async def missing_entities(
    connection: AsyncConnection,
    wanted: Sequence[tuple[Literal["exchange", "queue"], str]],
    timeout: float | None = None,
) -> list[tuple[Literal["exchange", "queue"], str]]:
    """Which of ``wanted`` do not exist on the broker (passive declares).

    Runs on a channel of its own, opened again after each 404 (which closes it). The
    default exchange (``""``) always exists; a queue exclusive to another connection
    (405) exists too.
    """
    session = Session(connection, timeout)
    missing: list[tuple[Literal["exchange", "queue"], str]] = []
    try:
        for kind, name in wanted:
            if kind == "exchange" and not name:
                continue
            channel = await session.channel()
            try:
                if kind == "exchange":
                    await channel.exchange_declare(name, passive=True, timeout=timeout)
                else:
                    await channel.queue_declare(name, passive=True, timeout=timeout)
            except NotFound:
                missing.append((kind, name))
            except ResourceLocked:
                pass
    finally:
        await session.close()
    return missing


# --------------------------------------------------------------------------- references
