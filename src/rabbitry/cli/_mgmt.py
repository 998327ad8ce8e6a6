"""The management API client for ``topology apply/verify`` of files with policies."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Any

import click

from ._common import CliError, get_state
from ._exit import ExitCode

if TYPE_CHECKING:
    from ..management import ManagementClient

__all__ = ["MANAGEMENT_URL", "management_client", "management_for"]

MANAGEMENT_URL = click.option(
    "--management-url",
    help="Management API base URL, used to set/check the file's policies (AMQP cannot); "
    "default: http://<first broker host>:15672 with the broker URL's credentials.",
)


def management_for(topology: Any, url: str | None) -> ManagementClient | None:
    """A management client when ``topology`` has policies (else ``None``)."""
    if not topology.policies:
        return None
    return management_client(url, "the file has policies, which need the management API client")


def management_client(url: str | None, why: str) -> ManagementClient:
    """A management client of ``url`` (default: the first broker's host, port 15672)."""
    try:
        from ..management import ManagementClient
    except ImportError as exc:  # pragma: no cover - the import itself needs no extra
        raise CliError(str(exc), ExitCode.USAGE) from exc
    params = get_state().params()[0]
    if url is None:
        host = f"[{params.host}]" if ":" in params.host else params.host
        url = f"http://{host}:15672"
    parts = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(parts.username) if parts.username else params.username
    password = urllib.parse.unquote(parts.password) if parts.password else params.password
    try:
        return ManagementClient(url, user, password, timeout=get_state().timeout)
    except ImportError as exc:
        raise CliError(
            f"{why}: {exc}",
            ExitCode.USAGE,
        ) from exc
