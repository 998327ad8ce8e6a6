"""AsyncManagementClient: the asyncio client of the management HTTP API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _ops
from ._transport import DEFAULT_URL, AsyncTransport

if TYPE_CHECKING:
    import ssl
    from collections.abc import Mapping
    from datetime import timedelta

    from ..protocol.spec import BasicProperties
    from ..topology._policy import Policy
    from ._ops import QueueInfo

__all__ = ["AsyncManagementClient"]


class AsyncManagementClient:
    """:class:`ManagementClient` for asyncio: the same methods, awaitable.

    Use as ``async with`` or ``await client.close()``.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        user: str | None = None,
        password: str | None = None,
        *,
        timeout: float = 10.0,
        verify: bool | str | ssl.SSLContext = True,
    ) -> None:
        self._transport = AsyncTransport(url, user, password, timeout=timeout, verify=verify)
        self.url = self._transport.url
        self.user = self._transport.user
        self.timeout = self._transport.timeout

    def __repr__(self) -> str:
        # Never the password (it lives only inside the httpx auth object).
        return f"{type(self).__name__}({self.url!r}, user={self.user!r})"

    async def __aenter__(self) -> AsyncManagementClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._transport.close()

    async def overview(self) -> dict[str, Any]:
        """``GET /api/overview``: versions, totals, listeners, message rates."""
        return await self._transport.send(_ops.overview())

    async def vhosts(self) -> list[dict[str, Any]]:
        """Every virtual host."""
        return await self._transport.send(_ops.vhosts())

    async def create_vhost(self, name: str) -> None:
        """Create virtual host ``name`` (no error if it exists).

        Args:
            name: the virtual host.
        """
        await self._transport.send(_ops.create_vhost(name))

    async def delete_vhost(self, name: str) -> None:
        """Delete virtual host ``name`` and everything in it.

        Args:
            name: the virtual host.
        """
        await self._transport.send(_ops.delete_vhost(name))

    async def set_permissions(
        self,
        vhost: str,
        user: str,
        configure: str = ".*",
        write: str = ".*",
        read: str = ".*",
    ) -> None:
        """Give ``user`` permissions in ``vhost`` (regular expressions over names).

        Args:
            vhost: the virtual host.
            user: the user name.
            configure: the names ``user`` may declare and delete.
            write: the names ``user`` may publish to.
            read: the names ``user`` may consume from.
        """
        await self._transport.send(_ops.set_permissions(vhost, user, configure, write, read))

    async def queues(self, vhost: str | None = None) -> list[QueueInfo]:
        """Every queue (of ``vhost``, or of all vhosts): depth, rates, consumers.

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            One :class:`QueueInfo` per queue.
        """
        return await self._transport.send(_ops.queues(vhost))

    async def queue(self, name: str, vhost: str = "/") -> QueueInfo:
        """One queue.

        Args:
            name: the queue.
            vhost: its virtual host.

        Returns:
            Its depth, rates and consumers.

        Raises:
            ManagementNotFound: the queue does not exist.
        """
        return await self._transport.send(_ops.queue(name, vhost))

    async def delete_queue(self, name: str, vhost: str = "/") -> None:
        """Delete a queue and its messages.

        Args:
            name: the queue.
            vhost: its virtual host.
        """
        await self._transport.send(_ops.delete_queue(name, vhost))

    async def purge_queue(self, name: str, vhost: str = "/") -> None:
        """Delete a queue's ready messages.

        Args:
            name: the queue.
            vhost: its virtual host.
        """
        await self._transport.send(_ops.purge_queue(name, vhost))

    async def exchanges(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every exchange (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The API's object for each exchange.
        """
        return await self._transport.send(_ops.exchanges(vhost))

    async def exchange(self, name: str, vhost: str = "/") -> dict[str, Any]:
        """One exchange.

        Args:
            name: the exchange.
            vhost: its virtual host.

        Returns:
            The API's object for the exchange.

        Raises:
            ManagementNotFound: the exchange does not exist.
        """
        return await self._transport.send(_ops.exchange(name, vhost))

    async def bindings(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every binding (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The API's object for each binding.
        """
        return await self._transport.send(_ops.bindings(vhost))

    async def connections(self) -> list[dict[str, Any]]:
        """Every client connection (``name`` is what :meth:`close_connection` takes)."""
        return await self._transport.send(_ops.connections())

    async def close_connection(
        self, name: str, reason: str = "closed via the management API"
    ) -> None:
        """Force-close a client connection; the client sees 320 CONNECTION_FORCED.

        Args:
            name: the connection's name, as :meth:`connections` lists it.
            reason: the text the client receives with the close.
        """
        await self._transport.send(_ops.close_connection(name), reason)

    async def definitions(self, vhost: str | None = None) -> dict[str, Any]:
        """Export definitions (of one vhost, or the whole broker).

        Args:
            vhost: the virtual host; ``None``: the whole broker.

        Returns:
            The definitions document.
        """
        return await self._transport.send(_ops.definitions(vhost))

    async def import_definitions(
        self, definitions: Mapping[str, Any], vhost: str | None = None
    ) -> None:
        """Import definitions; with ``vhost``, a single-vhost document into that vhost.

        Args:
            definitions: the document, as :meth:`definitions` exports it.
            vhost: the virtual host to import into; ``None``: a whole-broker document.
        """
        await self._transport.send(_ops.import_definitions(definitions, vhost))

    async def policies(self, vhost: str | None = None) -> list[Policy]:
        """Every policy (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The policies, as validated ``Policy`` objects.
        """
        return await self._transport.send(_ops.policies(vhost))

    async def policy(self, name: str, vhost: str = "/") -> Policy:
        """One policy.

        Args:
            name: the policy.
            vhost: its virtual host.

        Returns:
            The policy, validated.

        Raises:
            ManagementNotFound: the policy does not exist.
        """
        return await self._transport.send(_ops.policy(name, vhost))

    async def set_policy(
        self,
        name: str,
        pattern: str,
        definition: Mapping[str, Any],
        *,
        apply_to: str = "all",
        priority: int = 0,
        vhost: str = "/",
    ) -> Policy:
        """Create or replace a policy (validated first, like ``Policy(...)``).

        Args:
            name: the policy.
            pattern: a regular expression matched against entity names.
            definition: the keys to set, e.g. ``{"message-ttl": 60000}``.
            apply_to: ``"all"``, ``"queues"`` or ``"exchanges"`` (3.12+ also
                ``"classic_queues"``, ``"quorum_queues"``, ``"streams"``).
            priority: higher wins when several policies match.
            vhost: its virtual host.

        Returns:
            The policy that was set.

        Raises:
            TopologyValidationError: a key or value breaks a rule; nothing was sent.
        """
        from ..topology._policy import Policy

        item = Policy(name, pattern, apply_to=apply_to, definition=definition, priority=priority)
        await self.put_policy(item, vhost)
        return item

    async def put_policy(self, policy: Policy, vhost: str = "/") -> None:
        """Create or replace ``policy`` (a :class:`~rabbitry.topology.Policy`).

        Args:
            policy: the policy.
            vhost: its virtual host.
        """
        await self._transport.send(_ops.put_policy(policy, vhost))

    async def delete_policy(self, name: str, vhost: str = "/") -> None:
        """Delete a policy.

        Args:
            name: the policy.
            vhost: its virtual host.

        Raises:
            ManagementNotFound: the policy does not exist.
        """
        await self._transport.send(_ops.delete_policy(name, vhost))

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | bytearray | memoryview | str,
        *,
        properties: BasicProperties | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        vhost: str = "/",
    ) -> bool:
        """Publish one message through the API (see :meth:`ManagementClient.publish`).

        A tool for operations and tests (a message from a shell, a probe, a fixture),
        not for throughput: one HTTP request per message, no publisher confirm, and the
        API holds the whole body in memory. ``exchange=""`` is the default exchange.

        Args:
            exchange: the exchange (``""``: the default exchange, routing by queue name).
            routing_key: the routing key.
            body: ``str`` is sent as text (UTF-8); bytes go base64-encoded and arrive
                unchanged.
            properties: the basic properties, validated as for ``basic.publish``;
                headers must be JSON values (str, int, float, bool, list, dict).
            persistent: ``True`` sends delivery mode 2, ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.
            vhost: the virtual host.

        Returns:
            Whether the broker routed the message to at least one queue.

        Raises:
            LocalProtocolError: a property or argument breaks a rule (the message names
                it); nothing was sent.
            ManagementNotFound: the exchange (or the vhost) does not exist.
        """
        return await self._transport.send(
            _ops.publish(exchange, routing_key, body, properties, persistent, expiration, vhost)
        )
