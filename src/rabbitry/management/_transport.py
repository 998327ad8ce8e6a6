"""The HTTP side of the management clients: URL and credentials, requests, answers."""

from __future__ import annotations

import importlib
import ssl
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

from ..exceptions import ConfigurationError, ManagementError
from . import _ops

if TYPE_CHECKING:
    from types import ModuleType

    from ._ops import Request

__all__ = ["DEFAULT_URL", "AsyncTransport", "MissingExtraError", "SyncTransport", "Transport"]

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


class Transport:
    """Turns ``_ops`` requests into HTTP exchanges with one management listener.

    Holds the base URL, the credentials (inside the httpx auth object only) and the
    client options; :class:`SyncTransport` and :class:`AsyncTransport` add the httpx
    client that sends.
    """

    def __init__(
        self,
        url: str,
        user: str | None,
        password: str | None,
        *,
        timeout: float,
        verify: bool | str | ssl.SSLContext,
    ) -> None:
        self.httpx = _httpx()
        base, name, secret = _split(url, user, password)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigurationError(f"timeout: must be a positive number, got {timeout!r}")
        self.url = base
        self.user = name
        self.timeout = float(timeout)
        self.options: dict[str, Any] = {
            "base_url": f"{base}/api",
            "auth": self.httpx.BasicAuth(name, secret),
            "timeout": float(timeout),
            # A CA bundle path becomes a context (httpx deprecates str paths).
            "verify": ssl.create_default_context(cafile=verify)
            if isinstance(verify, str)
            else verify,
            "headers": {"Content-Type": "application/json"},
        }

    @staticmethod
    def headers(reason: str | None) -> dict[str, str]:
        """The extra headers of one request: ``X-Reason`` when a reason is given."""
        return {"X-Reason": reason} if reason else {}

    def answer(self, request: Request[T], response: Any) -> T:
        """Parse ``response`` for ``request``, raising the API's refusal as an error."""
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

    def transport_error(self, request: Request[Any], exc: Exception) -> ManagementError:
        """The error raised when ``request`` got no answer (``status=None``)."""
        return ManagementError(
            None, f"{type(exc).__name__}: {exc} ({self.url})", request.method, request.path
        )


class SyncTransport(Transport):
    """Sends ``_ops`` requests with a blocking httpx client."""

    def __init__(
        self,
        url: str,
        user: str | None,
        password: str | None,
        *,
        timeout: float,
        verify: bool | str | ssl.SSLContext,
    ) -> None:
        super().__init__(url, user, password, timeout=timeout, verify=verify)
        self._client = self.httpx.Client(**self.options)

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    def send(self, request: Request[T], reason: str | None = None) -> T:
        """Send ``request`` and return its parsed answer."""
        try:
            response = self._client.request(
                request.method,
                request.path,
                json=request.body,
                headers=self.headers(reason),
            )
        except self.httpx.HTTPError as exc:
            raise self.transport_error(request, exc) from exc
        return self.answer(request, response)


class AsyncTransport(Transport):
    """Sends ``_ops`` requests with an asyncio httpx client."""

    def __init__(
        self,
        url: str,
        user: str | None,
        password: str | None,
        *,
        timeout: float,
        verify: bool | str | ssl.SSLContext,
    ) -> None:
        super().__init__(url, user, password, timeout=timeout, verify=verify)
        self._client = self.httpx.AsyncClient(**self.options)

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()

    async def send(self, request: Request[T], reason: str | None = None) -> T:
        """Send ``request`` and return its parsed answer."""
        try:
            response = await self._client.request(
                request.method,
                request.path,
                json=request.body,
                headers=self.headers(reason),
            )
        except self.httpx.HTTPError as exc:
            raise self.transport_error(request, exc) from exc
        return self.answer(request, response)
