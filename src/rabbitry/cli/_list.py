"""``rabbitry list queues|exchanges|bindings``: what the broker holds, from its
management API (AMQP has no way to list entities)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ..exceptions import ManagementError
from ._common import CliError, get_state, handle_errors
from ._exit import ExitCode
from ._mgmt import basic_auth, management_url, management_url_option

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..management import ManagementClient

__all__ = ["list_group"]

_OPTIONS = [
    management_url_option("to list what the broker holds"),
    click.option(
        "--vhost",
        default=None,
        help="Only this vhost (default: the broker URL's; --all-vhosts for every one).",
    ),
    click.option("--all-vhosts", is_flag=True, help="List every vhost's entities."),
]


def _with_options(fn: Any) -> Any:
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


@click.group("list")
def list_group() -> None:
    """List queues, exchanges or bindings through the management API."""


def _client(url_option: str | None) -> ManagementClient:
    from ..management import ManagementClient

    state = get_state()
    params = state.params()[0]
    base, user, password = basic_auth(management_url(url_option), params)
    return ManagementClient(base, user, password, timeout=state.timeout)


def _fetch(kind: str, management_url: str | None, vhost: str | None, every: bool) -> Any:
    state = get_state()
    if vhost is not None and every:
        raise click.UsageError("give --vhost or --all-vhosts, not both")
    if vhost is None and not every:
        vhost = state.params()[0].virtual_host
    try:
        with _client(management_url) as api:
            if kind == "queues":
                return api.queues(None if every else vhost)
            if kind == "exchanges":
                return api.exchanges(None if every else vhost)
            return api.bindings(None if every else vhost)
    except ImportError as exc:
        hint = "" if "rabbitry[management]" in str(exc) else "; pip install 'rabbitry[management]'"
        raise CliError(
            f"listing needs the management API client: {exc}{hint}", ExitCode.USAGE
        ) from exc
    except ManagementError as exc:
        code = ExitCode.CONNECTION if exc.status in (None, 401, 403) else ExitCode.FAILED
        hint = " (is the management plugin enabled? --management-url)" if exc.status is None else ""
        raise CliError(f"management API: {exc}{hint}", code) from exc


def _show(title: str, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    state = get_state()
    if state.json:
        state.emit_json(rows)
        return
    if state.quiet:
        return
    from rich.table import Table

    table = Table(title=f"{title} ({len(rows)})")
    for column in columns:
        table.add_column(column, justify="right" if column in _NUMERIC else "left")
    for row in rows:
        table.add_row(*(_cell(row[column]) for column in columns))
    state.out.print(table)


_NUMERIC = {"messages", "ready", "unacked", "consumers"}


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "" if value is None else str(value)


@list_group.command("queues")
@_with_options
@handle_errors
def list_queues(management_url: str | None, vhost: str | None, all_vhosts: bool) -> None:
    """Queues: type, depth (ready / unacked), consumers, state, policy."""
    rows = [
        {
            "vhost": q.vhost,
            "name": q.name,
            "type": q.type,
            "messages": q.messages,
            "ready": q.messages_ready,
            "unacked": q.messages_unacknowledged,
            "consumers": q.consumers,
            "state": q.state,
            "durable": q.durable,
            "policy": q.policy,
            "arguments": dict(q.arguments),
        }
        for q in _fetch("queues", management_url, vhost, all_vhosts)
    ]
    rows.sort(key=lambda r: (r["vhost"], r["name"]))
    columns = ["name", "type", "messages", "ready", "unacked", "consumers", "state", "policy"]
    _show("queues", ["vhost", *columns] if all_vhosts else columns, rows)


@list_group.command("exchanges")
@_with_options
@handle_errors
def list_exchanges(management_url: str | None, vhost: str | None, all_vhosts: bool) -> None:
    """Exchanges: type, durable, auto-delete, internal, arguments."""
    rows = [
        {
            "vhost": x.get("vhost", ""),
            "name": x.get("name", ""),
            "type": x.get("type", ""),
            "durable": bool(x.get("durable")),
            "auto_delete": bool(x.get("auto_delete")),
            "internal": bool(x.get("internal")),
            "arguments": dict(x.get("arguments") or {}),
        }
        for x in _fetch("exchanges", management_url, vhost, all_vhosts)
    ]
    rows.sort(key=lambda r: (r["vhost"], r["name"]))
    columns = ["name", "type", "durable", "auto_delete", "internal", "arguments"]
    _show("exchanges", ["vhost", *columns] if all_vhosts else columns, rows)


@list_group.command("bindings")
@_with_options
@handle_errors
def list_bindings(management_url: str | None, vhost: str | None, all_vhosts: bool) -> None:
    """Bindings: source exchange, destination (queue or exchange), routing key."""
    rows = [
        {
            "vhost": b.get("vhost", ""),
            "source": b.get("source", ""),
            "destination": b.get("destination", ""),
            "destination_type": b.get("destination_type", ""),
            "routing_key": b.get("routing_key", ""),
            "arguments": dict(b.get("arguments") or {}),
        }
        for b in _fetch("bindings", management_url, vhost, all_vhosts)
    ]
    rows.sort(key=lambda r: (r["vhost"], r["source"], r["destination"], r["routing_key"]))
    columns = ["source", "destination", "destination_type", "routing_key", "arguments"]
    _show("bindings", ["vhost", *columns] if all_vhosts else columns, rows)
