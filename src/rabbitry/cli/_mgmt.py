"""The management API for the CLI: which URL belongs to the broker, and its client.

Without ``--management-url`` the URL is derived from the first broker URL only where that
is safe: the default AMQP port (5672, or 5671 with TLS) has its management API on the
default port of the same host (15672, or 15671 over HTTPS). On any other AMQP port a
guess could reach another broker on the same host (two nodes side by side: the other
one's API answers on 15672), so a candidate (port 15672, and the AMQP port + 10000, the
usual offset of a second node) is used only when its ``/api/overview`` reports the
cluster name the AMQP connection reported in its server properties. Otherwise the
command asks for ``--management-url``.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

import click

from ._common import CliError, get_state
from ._exit import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..config import ConnectionParameters
    from ..management import ManagementClient

__all__ = [
    "MANAGEMENT_URL",
    "basic_auth",
    "management_client",
    "management_for",
    "management_url",
    "management_url_option",
    "resolve_management_url",
]


def management_url_option(used_for: str) -> Callable[[Any], Any]:
    """The ``--management-url`` option of a command that uses the API ``used_for``."""
    return click.option(
        "--management-url",
        help=f"Management API base URL, {used_for}. Default: port 15672 of the broker's "
        "host when its AMQP port is 5672 (HTTPS 15671 for AMQPS 5671); on another AMQP "
        "port, the API on 15672 or on the AMQP port + 10000 that reports the same cluster "
        "name as the broker, else an error asking for this option.",
    )


MANAGEMENT_URL = management_url_option("to set and check the file's policies (AMQP cannot)")

#: Management API ports tried next to a non-default AMQP port (``{amqp}``: that port).
CANDIDATE_PORTS = ("15672", "{amqp}+10000")


def _host(params: ConnectionParameters) -> str:
    return f"[{params.host}]" if ":" in params.host else params.host


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def basic_auth(url: str, params: ConnectionParameters) -> tuple[str, str, str]:
    """``(url without credentials, user, password)``: the URL's own, else the broker's."""
    parts = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(parts.username) if parts.username else params.username
    password = urllib.parse.unquote(parts.password) if parts.password else params.password
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port:
        netloc += f":{parts.port}"
    clean = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return clean, user, password


def _overview_cluster(base: str, params: ConnectionParameters, timeout: float) -> str | None:
    """The cluster name ``base``'s /api/overview reports, or None (no API, refused...)."""
    clean, user, password = basic_auth(base, params)
    request = urllib.request.Request(f"{clean}/api/overview")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = json.load(response)
    except (OSError, ValueError):
        return None
    return _text(body.get("cluster_name")) if isinstance(body, dict) else None


def _candidates(params: ConnectionParameters) -> list[str]:
    ports: list[int] = []
    for spec in CANDIDATE_PORTS:
        port = params.port + 10000 if spec == "{amqp}+10000" else int(spec)
        if port <= 65535 and port not in ports:
            ports.append(port)
    return [f"http://{_host(params)}:{port}" for port in ports]


def resolve_management_url(
    url: str | None,
    params: ConnectionParameters,
    cluster_name: Callable[[], str | None],
    *,
    timeout: float = 5.0,
    candidates: Sequence[str] | None = None,
) -> str:
    """The management API base URL for the broker of ``params``.

    Args:
        url: ``--management-url``; returned as given when set.
        params: the first broker URL's parameters.
        cluster_name: returns the cluster name the broker reports over AMQP (its
            ``cluster_name`` server property), connecting when called.
        timeout: seconds for each candidate's ``/api/overview``.
        candidates: the URLs to confirm (default: port 15672 and the AMQP port + 10000).

    Returns:
        The base URL.

    Raises:
        CliError: the AMQP port is not the default one and no candidate answers for the
            same cluster (exit code 2: pass ``--management-url``).
    """
    if url is not None:
        return url
    if params.port == 5672 and not params.use_tls:
        return f"http://{_host(params)}:15672"
    if params.port == 5671 and params.use_tls:
        return f"https://{_host(params)}:15671"
    tried = list(candidates if candidates is not None else _candidates(params))
    expected = cluster_name()
    found: list[str] = []
    if expected is not None:
        for candidate in tried:
            name = _overview_cluster(candidate, params, timeout)
            if name == expected:
                return candidate
            found.append(f"{candidate}: {'no answer' if name is None else f'cluster {name!r}'}")
    else:
        found.append("the broker reports no cluster_name over AMQP")
    raise CliError(
        f"the broker URL's port {params.port} is not the default one, so its management API "
        f"cannot be assumed on port 15672, and none was found for cluster {expected!r} "
        f"({'; '.join(found)}); pass --management-url",
        ExitCode.USAGE,
    )


def _amqp_cluster_name() -> str | None:
    conn = get_state().connect()
    try:
        return _text(conn.server_properties.get("cluster_name"))
    finally:
        conn.close()


def management_url(url: str | None) -> str:
    """The management API base URL of the CLI's first broker (see the module docstring).

    Args:
        url: ``--management-url``, or None to derive it.

    Returns:
        The base URL, possibly with credentials.

    Raises:
        CliError: it cannot be derived safely (exit code 2).
    """
    state = get_state()
    params = state.params()[0]
    return resolve_management_url(url, params, _amqp_cluster_name, timeout=min(state.timeout, 5.0))


def management_for(topology: Any, url: str | None) -> ManagementClient | None:
    """A management client when ``topology`` has policies (else ``None``)."""
    if not topology.policies:
        return None
    return management_client(url, "the file has policies, which need the management API client")


def management_client(url: str | None, why: str) -> ManagementClient:
    """A management client of ``url`` (default: derived, see :func:`management_url`)."""
    try:
        from ..management import ManagementClient
    except ImportError as exc:  # pragma: no cover - the import itself needs no extra
        raise CliError(str(exc), ExitCode.USAGE) from exc
    params = get_state().params()[0]
    base, user, password = basic_auth(management_url(url), params)
    try:
        return ManagementClient(base, user, password, timeout=get_state().timeout)
    except ImportError as exc:
        raise CliError(f"{why}: {exc}", ExitCode.USAGE) from exc
