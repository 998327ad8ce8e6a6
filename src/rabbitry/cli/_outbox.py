"""``rabbitry outbox status|retry-dead|purge-dead PATH``: a publisher's durable outbox.

These commands read the SQLite file of an :class:`rabbitry.SQLiteOutbox`; they need no
broker. ``status`` and ``purge-dead`` work while a publisher runs on the file.
``retry-dead`` moves dead (returned as unroutable, or refused) messages back for
delivery; it needs the outbox's lock, so it refuses while a publisher holds the file (the
publisher sends them at its next start).
"""

from __future__ import annotations

import os
import time
from typing import Any

import click

from ..outbox import DeadRecord, SQLiteOutbox
from ._common import body_view, fail, get_state, handle_errors, is_stdin_tty
from ._exit import ExitCode

__all__ = ["outbox"]

_PATH = click.argument("path", type=click.Path(dir_okay=False))
_IDS = click.option(
    "--id", "ids", type=int, multiple=True, metavar="ROW",
    help="Only this dead row (repeat for more); default: all of them.",
)  # fmt: skip


def _open(path: str) -> SQLiteOutbox:
    if not os.path.exists(path):
        fail(f"no outbox at {path}", ExitCode.USAGE)
    return SQLiteOutbox(path)


def _dead_record(dead: DeadRecord) -> dict[str, Any]:
    record = dead.record
    text, encoding = body_view(record.body)
    return {
        "id": record.id,
        "message_id": record.message_id,
        "exchange": record.exchange,
        "routing_key": record.routing_key,
        "reason": dead.reason,
        "attempts": record.attempts,
        "created_at": record.created_at,
        "died_at": dead.died_at,
        "body": text,
        "body_encoding": encoding,
    }


@click.group()
def outbox() -> None:
    """Inspect a publisher's durable outbox file (SQLiteOutbox); no broker needed."""


@outbox.command()
@_PATH
@click.option(
    "--dead", "show_dead", type=click.IntRange(min=0), default=20, show_default=True,
    help="List at most this many dead messages.",
)  # fmt: skip
@handle_errors
def status(path: str, show_dead: int) -> None:
    """Pending messages (count, bytes, oldest age, retrying), resends and dead messages.

    Also why: the reasons of the dead messages and the last errors of the retried ones,
    each with its count of rows.
    """
    state = get_state()
    store = _open(path)
    info = store.status()
    dead = store.dead(limit=show_dead) if show_dead else []
    dead_reasons, retry_errors = store.reasons()
    age = info.oldest_age(time.time())
    result = {
        "path": path,
        "pending": info.pending,
        "pending_bytes": info.pending_bytes,
        "oldest_age_s": None if age is None else round(age, 3),
        "retrying": info.retrying,
        "resent": info.resent,
        "dead": info.dead,
        "dead_reasons": [{"reason": r, "rows": n} for r, n in dead_reasons],
        "retry_errors": [{"error": e, "rows": n} for e, n in retry_errors],
        "dead_messages": [_dead_record(d) for d in dead],
    }
    if state.json:
        state.emit_json(result)
        return
    oldest = "-" if age is None else f"{age:.1f} s"
    state.info(
        f"{path}: {info.pending} pending ({info.pending_bytes} bytes, oldest {oldest}, "
        f"{info.retrying} retrying), {info.resent} resent, {info.dead} dead"
    )
    for reason, rows in dead_reasons:
        state.info(f"  dead ({rows}): {reason}")
    for error, rows in retry_errors:
        state.info(f"  retrying ({rows}): {error}")
    if dead and not state.quiet:
        from rich.table import Table

        table = Table(title=f"dead messages (showing {len(dead)} of {info.dead})")
        for column in ("row", "message id", "exchange / routing key", "reason", "died"):
            table.add_column(column, overflow="fold")
        for item in dead:
            record = item.record
            table.add_row(
                str(record.id),
                record.message_id,
                f"{record.exchange or '(default)'} / {record.routing_key}",
                item.reason,
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(item.died_at)),
            )
        state.out.print(table)


@outbox.command("retry-dead")
@_PATH
@_IDS
@handle_errors
def retry_dead(path: str, ids: tuple[int, ...]) -> None:
    """Move dead messages back into the outbox; the next publisher start sends them.

    Refuses (exit 1) while a publisher holds the outbox.
    """
    state = get_state()
    moved = _open(path).retry_dead(list(ids) if ids else None)
    if state.json:
        state.emit_json({"path": path, "retried": moved})
    else:
        state.info(f"moved {moved} dead message(s) back into {path}")


@outbox.command("purge-dead")
@_PATH
@_IDS
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@handle_errors
def purge_dead(path: str, ids: tuple[int, ...], yes: bool) -> None:
    """Delete dead messages (asks first unless --yes)."""
    state = get_state()
    store = _open(path)
    if not yes:
        if not is_stdin_tty():
            fail(
                f"refusing to purge the dead messages of {path} without --yes "
                "(stdin is not a terminal)",
                ExitCode.USAGE,
            )
        count = len(ids) if ids else store.status().dead
        click.confirm(f"Delete {count} dead message(s) from {path}?", abort=True)
    purged = store.purge_dead(list(ids) if ids else None)
    if state.json:
        state.emit_json({"path": path, "purged": purged})
    else:
        state.info(f"purged {purged} dead message(s) from {path}")
