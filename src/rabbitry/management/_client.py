"""ManagementClient and AsyncManagementClient: the HTTP transport for ``_ops`` requests."""

from __future__ import annotations

import importlib
import ssl
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from ..exceptions import ConfigurationError, ManagementError
from . import _ops

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import timedelta
    from types import ModuleType

    from ..protocol.spec import BasicProperties
    from ..topology._policy import Policy
    from ._ops import QueueInfo, Request

__all__ = ["AsyncManagementClient", "ManagementClient", "MissingExtraError"]

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:15672"


class MissingExtraError(ImportError):
    """An optional dependency of rabbitry is not installed; the message names the extra."""


def _httpx() -> ModuleType:
    try:
        return importlib.import_module("httpx")
    except ImportError as exc:
        raise MissingExtraError(
            "rabbitry.management needs httpx, which is not installed: "
            "pip install 'rabbitry[management]'",
            name="httpx",
        ) from exc


def _split(url: str, user: str | None, password: str | None) -> tuple[str, str, str]:
    """``(base URL without credentials, user, password)``."""
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"url: must be an http(s) URL, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(
            "url: must be an http:// or https:// URL with a host (the management "
            f"listener, e.g. {DEFAULT_URL})"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{parts.port}" if parts.port else host
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    name = user if user is not None else unquote(parts.username or "") or "guest"
    secret = password if password is not None else unquote(parts.password or "") or "guest"
    for field, value in (("user", name), ("password", secret)):
        if not isinstance(value, str):
            raise ConfigurationError(f"{field}: must be a str, got {type(value).__name__}")
    return base, name, secret


class _Base:
    """What both clients share: the base URL, the credentials, answer handling."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        user: str | None = None,
        password: str | None = None,
        *,
        timeout: float = 10.0,
        verify: bool | str | ssl.SSLContext = True,
    ) -> None:
        self._httpx = _httpx()
        base, name, secret = _split(url, user, password)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"timeout: must be a positive number, got {timeout!r}")
        self.url = base
        self.user = name
        self.timeout = float(timeout)
        self._options: dict[str, Any] = {
            "base_url": f"{base}/api",
            "auth": self._httpx.BasicAuth(name, secret),
            "timeout": float(timeout),
            # A CA bundle path becomes a context (httpx deprecates str paths).
            "verify": ssl.create_default_context(cafile=verify)
            if isinstance(verify, str)
            else verify,
            "headers": {"Content-Type": "application/json"},
        }

    def __repr__(self) -> str:
        # Never the password (it lives only inside the httpx auth object).
        return f"{type(self).__name__}({self.url!r}, user={self.user!r})"

    @staticmethod
    def _headers(request: Request[Any], reason: str | None) -> dict[str, str]:
        return {"X-Reason": reason} if reason else {}

    def _answer(self, request: Request[T], response: Any) -> T:
        if response.status_code >= 400:
            raise _ops.error_for(response.status_code, response.text, request.method, request.path)
        if request.method != "GET" and not request.reads_answer:
            return request.parse(None)
        try:
            data = response.json()
        except ValueError as exc:
            raise ManagementError(
                response.status_code, f"the answer is not JSON: {exc}", request.method, request.path
            ) from None
        return request.parse(data)

    def _transport_error(self, request: Request[Any], exc: Exception) -> ManagementError:
        return ManagementError(
            None, f"{type(exc).__name__}: {exc} ({self.url})", request.method, request.path
        )


class ManagementClient(_Base):
    """A client of RabbitMQ's management HTTP API (the ``rabbitmq_management`` plugin).

    Needs the ``management`` extra (httpx): ``pip install 'rabbitry[management]'``.
    Thread-safe (httpx's client is); use as a context manager or call :meth:`close`.
    :class:`AsyncManagementClient` has the same methods, awaitable.

    Args:
        url: the management listener, e.g. ``http://127.0.0.1:15672`` (a path prefix
            is kept; credentials in the URL are used when ``user``/``password`` are not
            given).
        user: the user name (default: from the URL, else ``guest``).
        password: the password (default: from the URL, else ``guest``). It is never
            logged nor shown in ``repr``.
        timeout: seconds per request.
        verify: TLS verification for ``https``: ``True``, ``False``, a CA bundle path or
            an :class:`ssl.SSLContext`.

    Raises:
        MissingExtraError: httpx is not installed (an :class:`ImportError`).
        ConfigurationError: a bad URL or option.

    Every method raises :class:`~rabbitry.exceptions.ManagementError` (``status`` and the
    API's ``reason``) when the API refuses, :class:`~rabbitry.exceptions.ManagementNotFound`
    on 404 (and on a 400 that passes on the broker's ``404 NOT_FOUND``), and
    ``ManagementError`` with ``status=None`` when no answer came.
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
        super().__init__(url, user, password, timeout=timeout, verify=verify)
        self._client = self._httpx.Client(**self._options)

    def __enter__(self) -> ManagementClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def _send(self, request: Request[T], reason: str | None = None) -> T:
        try:
            response = self._client.request(
                request.method,
                request.path,
                json=request.body,
                headers=self._headers(request, reason),
            )
        except self._httpx.HTTPError as exc:
            raise self._transport_error(request, exc) from exc
        return self._answer(request, response)

    def overview(self) -> dict[str, Any]:
        """``GET /api/overview``: versions, totals, listeners, message rates."""
        return self._send(_ops.overview())

    def vhosts(self) -> list[dict[str, Any]]:
        """Every virtual host."""
        return self._send(_ops.vhosts())

    def create_vhost(self, name: str) -> None:
        """Create virtual host ``name`` (no error if it exists).

        Args:
            name: the virtual host.
        """
        self._send(_ops.create_vhost(name))

    def delete_vhost(self, name: str) -> None:
        """Delete virtual host ``name`` and everything in it.

        Args:
            name: the virtual host.
        """
        self._send(_ops.delete_vhost(name))

    def set_permissions(
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
        self._send(_ops.set_permissions(vhost, user, configure, write, read))

    def queues(self, vhost: str | None = None) -> list[QueueInfo]:
        """Every queue (of ``vhost``, or of all vhosts): depth, rates, consumers.

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            One :class:`QueueInfo` per queue.
        """
        return self._send(_ops.queues(vhost))

    def queue(self, name: str, vhost: str = "/") -> QueueInfo:
        """One queue.

        Args:
            name: the queue.
            vhost: its virtual host.

        Returns:
            Its depth, rates and consumers.

        Raises:
            ManagementNotFound: the queue does not exist.
        """
        return self._send(_ops.queue(name, vhost))

    def delete_queue(self, name: str, vhost: str = "/") -> None:
        """Delete a queue and its messages.

        Args:
            name: the queue.
            vhost: its virtual host.
        """
        self._send(_ops.delete_queue(name, vhost))

    def purge_queue(self, name: str, vhost: str = "/") -> None:
        """Delete a queue's ready messages.

        Args:
            name: the queue.
            vhost: its virtual host.
        """
        self._send(_ops.purge_queue(name, vhost))

    def exchanges(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every exchange (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The API's object for each exchange.
        """
        return self._send(_ops.exchanges(vhost))

    def exchange(self, name: str, vhost: str = "/") -> dict[str, Any]:
        """One exchange.

        Args:
            name: the exchange.
            vhost: its virtual host.

        Returns:
            The API's object for the exchange.

        Raises:
            ManagementNotFound: the exchange does not exist.
        """
        return self._send(_ops.exchange(name, vhost))

    def bindings(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every binding (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The API's object for each binding.
        """
        return self._send(_ops.bindings(vhost))

    def connections(self) -> list[dict[str, Any]]:
        """Every client connection (``name`` is what :meth:`close_connection` takes)."""
        return self._send(_ops.connections())

    def close_connection(self, name: str, reason: str = "closed via the management API") -> None:
        """Force-close a client connection; the client sees 320 CONNECTION_FORCED.

        Args:
            name: the connection's name, as :meth:`connections` lists it.
            reason: the text the client receives with the close.
        """
        self._send(_ops.close_connection(name), reason)

    def definitions(self, vhost: str | None = None) -> dict[str, Any]:
        """Export definitions (of one vhost, or the whole broker).

        Args:
            vhost: the virtual host; ``None``: the whole broker.

        Returns:
            The definitions document.
        """
        return self._send(_ops.definitions(vhost))

    def import_definitions(self, definitions: Mapping[str, Any], vhost: str | None = None) -> None:
        """Import definitions; with ``vhost``, a single-vhost document into that vhost.

        Args:
            definitions: the document, as :meth:`definitions` exports it.
            vhost: the virtual host to import into; ``None``: a whole-broker document.
        """
        self._send(_ops.import_definitions(definitions, vhost))

    def policies(self, vhost: str | None = None) -> list[Policy]:
        """Every policy (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The policies, as validated ``Policy`` objects.
        """
        return self._send(_ops.policies(vhost))

    def policy(self, name: str, vhost: str = "/") -> Policy:
        """One policy.

        Args:
            name: the policy.
            vhost: its virtual host.

        Returns:
            The policy, validated.

        Raises:
            ManagementNotFound: the policy does not exist.
        """
        return self._send(_ops.policy(name, vhost))

    def set_policy(
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
        self.put_policy(item, vhost)
        return item

    def put_policy(self, policy: Policy, vhost: str = "/") -> None:
        """Create or replace ``policy`` (a :class:`~rabbitry.topology.Policy`).

        Args:
            policy: the policy.
            vhost: its virtual host.
        """
        self._send(_ops.put_policy(policy, vhost))

    def delete_policy(self, name: str, vhost: str = "/") -> None:
        """Delete a policy.

        Args:
            name: the policy.
            vhost: its virtual host.

        Raises:
            ManagementNotFound: the policy does not exist.
        """
        self._send(_ops.delete_policy(name, vhost))

    def publish(
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
        """Publish one message through the API (``POST /api/exchanges/.../publish``).

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
        return self._send(
            _ops.publish(exchange, routing_key, body, properties, persistent, expiration, vhost)
        )


class AsyncManagementClient(_Base):
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
        super().__init__(url, user, password, timeout=timeout, verify=verify)
        self._client = self._httpx.AsyncClient(**self._options)

    async def __aenter__(self) -> AsyncManagementClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()

    async def _send(self, request: Request[T], reason: str | None = None) -> T:
        try:
            response = await self._client.request(
                request.method,
                request.path,
                json=request.body,
                headers=self._headers(request, reason),
            )
        except self._httpx.HTTPError as exc:
            raise self._transport_error(request, exc) from exc
        return self._answer(request, response)

    async def overview(self) -> dict[str, Any]:
        """``GET /api/overview``: versions, totals, listeners, message rates."""
        return await self._send(_ops.overview())

    async def vhosts(self) -> list[dict[str, Any]]:
        """Every virtual host."""
        return await self._send(_ops.vhosts())

    async def create_vhost(self, name: str) -> None:
        """Create virtual host ``name`` (no error if it exists).

        Args:
            name: the virtual host.
        """
        await self._send(_ops.create_vhost(name))

    async def delete_vhost(self, name: str) -> None:
        """Delete virtual host ``name`` and everything in it.

        Args:
            name: the virtual host.
        """
        await self._send(_ops.delete_vhost(name))

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
        await self._send(_ops.set_permissions(vhost, user, configure, write, read))

    async def queues(self, vhost: str | None = None) -> list[QueueInfo]:
        """Every queue (of ``vhost``, or of all vhosts): depth, rates, consumers.

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            One :class:`QueueInfo` per queue.
        """
        return await self._send(_ops.queues(vhost))

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
        return await self._send(_ops.queue(name, vhost))

    async def delete_queue(self, name: str, vhost: str = "/") -> None:
        """Delete a queue and its messages.

        Args:
            name: the queue.
            vhost: its virtual host.
        """
        await self._send(_ops.delete_queue(name, vhost))

    async def purge_queue(self, name: str, vhost: str = "/") -> None:
        """Delete a queue's ready messages.

        Args:
            name: the queue.
            vhost: its virtual host.
        """
        await self._send(_ops.purge_queue(name, vhost))

    async def exchanges(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every exchange (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The API's object for each exchange.
        """
        return await self._send(_ops.exchanges(vhost))

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
        return await self._send(_ops.exchange(name, vhost))

    async def bindings(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """Every binding (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The API's object for each binding.
        """
        return await self._send(_ops.bindings(vhost))

    async def connections(self) -> list[dict[str, Any]]:
        """Every client connection (``name`` is what :meth:`close_connection` takes)."""
        return await self._send(_ops.connections())

    async def close_connection(
        self, name: str, reason: str = "closed via the management API"
    ) -> None:
        """Force-close a client connection; the client sees 320 CONNECTION_FORCED.

        Args:
            name: the connection's name, as :meth:`connections` lists it.
            reason: the text the client receives with the close.
        """
        await self._send(_ops.close_connection(name), reason)

    async def definitions(self, vhost: str | None = None) -> dict[str, Any]:
        """Export definitions (of one vhost, or the whole broker).

        Args:
            vhost: the virtual host; ``None``: the whole broker.

        Returns:
            The definitions document.
        """
        return await self._send(_ops.definitions(vhost))

    async def import_definitions(
        self, definitions: Mapping[str, Any], vhost: str | None = None
    ) -> None:
        """Import definitions; with ``vhost``, a single-vhost document into that vhost.

        Args:
            definitions: the document, as :meth:`definitions` exports it.
            vhost: the virtual host to import into; ``None``: a whole-broker document.
        """
        await self._send(_ops.import_definitions(definitions, vhost))

    async def policies(self, vhost: str | None = None) -> list[Policy]:
        """Every policy (of ``vhost``, or of all vhosts).

        Args:
            vhost: the virtual host; ``None``: all of them.

        Returns:
            The policies, as validated ``Policy`` objects.
        """
        return await self._send(_ops.policies(vhost))

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
        return await self._send(_ops.policy(name, vhost))

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
        await self._send(_ops.put_policy(policy, vhost))

    async def delete_policy(self, name: str, vhost: str = "/") -> None:
        """Delete a policy.

        Args:
            name: the policy.
            vhost: its virtual host.

        Raises:
            ManagementNotFound: the policy does not exist.
        """
        await self._send(_ops.delete_policy(name, vhost))

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
        return await self._send(
            _ops.publish(exchange, routing_key, body, properties, persistent, expiration, vhost)
        )
