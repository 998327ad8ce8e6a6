"""``rabbitry topology apply|verify|diff``: a topology file against the broker (or
another file)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import click

from ._common import CliError, fail, get_state, handle_errors
from ._exit import ExitCode
from ._mgmt import MANAGEMENT_URL, basic_auth, management_for, management_url, management_url_option

__all__ = ["topology"]


@click.group()
def topology() -> None:
    """Apply, verify or diff a topology file (our YAML/JSON form or a definitions export)."""


_FILE = click.argument("file", type=click.Path(exists=True, dir_okay=False))
_VHOST = click.option(
    "--vhost", default=None, help="vhost to read from a definitions export (default: the URL's)."
)


def _load(file: str, vhost: str | None) -> Any:
    from ..topology import Topology

    state = get_state()
    if vhost is None:
        vhost = state.params()[0].virtual_host
    try:
        return Topology.load(file, vhost)
    except ImportError as exc:
        raise CliError(
            f"{file}: reading it needs {exc.name or 'an extra module'}: "
            "pip install 'rabbitry[yaml]'",
            ExitCode.USAGE,
        ) from exc


@topology.command("apply")
@_FILE
@_VHOST
@MANAGEMENT_URL
@handle_errors
def topology_apply(file: str, vhost: str | None, management_url: str | None) -> None:
    """Declare every exchange, queue and binding of FILE, and set its policies through
    the management API (idempotent; exit 1 on conflict)."""
    state = get_state()
    topo = _load(file, vhost)
    api = management_for(topo, management_url)
    conn = state.connect()
    try:
        result = topo.apply(conn, timeout=state.timeout, management=api)
    finally:
        conn.close()
        if api is not None:
            api.close()
    summary = {
        "exchanges": len(result.topology.exchanges),
        "queues": list(result.queue_names),
        "bindings": len(result.topology.bindings),
        "message_counts": dict(result.message_counts),
    }
    if state.json:
        state.emit_json({"applied": True, **summary})
    else:
        state.info(
            f"applied {file}: {summary['exchanges']} exchanges, {len(result.queue_names)} "
            f"queues, {summary['bindings']} bindings"
        )


@topology.command("verify")
@_FILE
@_VHOST
@MANAGEMENT_URL
@handle_errors
def topology_verify(file: str, vhost: str | None, management_url: str | None) -> None:
    """Check that every exchange, queue and policy of FILE exists (exit 1 if not)."""
    state = get_state()
    topo = _load(file, vhost)
    api = management_for(topo, management_url)
    conn = state.connect()
    try:
        report = topo.verify(conn, timeout=state.timeout, management=api)
    finally:
        conn.close()
        if api is not None:
            api.close()
    if state.json:
        state.emit_json(
            {
                "ok": report.ok,
                "missing": [item.label for item in report.missing],
                "present": [item.label for item in report.present],
                "unchecked": [item.label for item in report.unchecked],
                "message_counts": dict(report.message_counts),
                "policy_differences": list(report.policy_differences),
            }
        )
    else:
        state.info(str(report))
        if report.unchecked:
            state.info(f"not checkable over AMQP: {len(report.unchecked)} (bindings etc.)")
    if not report.ok:
        missing = f"{len(report.missing)} missing: {', '.join(i.label for i in report.missing)}"
        if report.policy_differences:
            missing += f"; policies differ: {'; '.join(report.policy_differences)}"
        fail(missing)


@topology.command("diff")
@_FILE
@_VHOST
@click.option(
    "--against",
    type=click.Path(exists=True, dir_okay=False),
    help="Compare with this file (a definitions export or another topology) instead of the broker.",
)
@management_url_option("to read the broker's definitions from (without --against)")
@click.option(
    "--extra/--no-extra",
    default=None,
    help="Also list what only the other side has (default: only with --against).",
)
@handle_errors
def topology_diff(
    file: str,
    vhost: str | None,
    against: str | None,
    management_url: str | None,
    extra: bool | None,
) -> None:
    """Show how FILE differs from the broker (or --against a file); exit 1 if it does."""
    state = get_state()
    topo = _load(file, vhost)
    if against is not None:
        other = _load(against, vhost)
        lines = topo.diff(other, extra=True if extra is None else extra)
        overlaps = topo.policy_overlaps(other)
        source = against
    else:
        params = state.params()[0]
        definitions = _fetch_definitions(management_url, params)
        lines = topo.diff(definitions, vhost=vhost or params.virtual_host, extra=bool(extra))
        overlaps = topo.policy_overlaps(definitions, vhost=vhost or params.virtual_host)
        source = "the broker"
    # A policy and a queue argument setting a key to the same value is no difference,
    # but worth knowing (changing the policy alone will not change that queue).
    notes = [f"note: {o.line()}" for o in overlaps if o.line() not in lines]
    if state.json:
        state.emit_json(
            {
                "same": not lines,
                "differences": lines,
                "policy_overlaps": [o.line() for o in overlaps],
            }
        )
    elif lines:
        for line in lines + notes:
            state.info(line)
    else:
        for line in notes:
            state.info(line)
        state.info(f"{file} matches {source}")
    if lines:
        fail(f"{len(lines)} difference(s) between {file} and {source}")


def _fetch_definitions(base: str | None, params: Any) -> Any:
    clean, user, password = basic_auth(management_url(base), params)
    vhost = urllib.parse.quote(params.virtual_host, safe="")
    request = urllib.request.Request(f"{clean}/api/definitions/{vhost}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=get_state().timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        code = ExitCode.CONNECTION if exc.code in (401, 403) else ExitCode.FAILED
        raise CliError(f"management API {clean}: HTTP {exc.code} {exc.reason}", code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(
            f"management API {clean} did not answer ({reason}); enable the management "
            "plugin, pass --management-url, or compare with --against FILE",
            ExitCode.CONNECTION,
        ) from None
