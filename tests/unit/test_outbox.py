"""The durable outbox store (SQLiteOutbox) and the ``rabbitry outbox`` command; no broker."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result

from rabbitry import (
    ConfigurationError,
    OutboxCorrupt,
    OutboxError,
    OutboxLocked,
    SQLiteOutbox,
)
from rabbitry.cli._app import cli
from rabbitry.outbox import APPLICATION_ID, OutboxBatch, OutboxRecord
from rabbitry.protocol import spec
from rabbitry.protocol.frames import method_frame
from rabbitry.protocol.publish import publish_key

if TYPE_CHECKING:
    from collections.abc import Iterator


def record(row_id: int, body: bytes = b"body", **fields: object) -> OutboxRecord:
    values: dict[str, object] = {
        "message_id": f"m-{row_id}",
        "exchange": "ex",
        "routing_key": "rk",
        "mandatory": True,
        "properties": b"\x00\x80\x03m-1",
        "body": body,
        "created_at": 1000.0 + row_id,
    }
    values.update(fields)
    return OutboxRecord(row_id, **values)  # type: ignore[arg-type]


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "outbox.db")


@pytest.fixture
def store(path: str) -> Iterator[SQLiteOutbox]:
    outbox = SQLiteOutbox(path)
    outbox.open()
    yield outbox
    outbox.close()


# --------------------------------------------------------------------------- store


def test_new_file_is_created_empty_in_wal_mode(store: SQLiteOutbox, path: str) -> None:
    status = store.status()
    assert (status.pending, status.dead, status.resent, status.last_id) == (0, 0, 0, 0)
    assert status.oldest_age() is None
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    finally:
        db.close()


def test_apply_inserts_deletes_failures_deaths_in_one_batch(store: SQLiteOutbox) -> None:
    store.apply(OutboxBatch(inserts=[record(i) for i in range(1, 8)]))
    store.apply(
        OutboxBatch(
            deletes=[1, 2, 3, 5],  # two ranges
            failures=[(4, 2, "Nacked: the broker nacked publish #9")],
            deaths=[(6, "312 NO_ROUTE")],
            resent=3,
        )
    )
    pending = list(store.pending())
    assert [r.id for r in pending] == [4, 7]
    assert (pending[0].attempts, pending[0].last_error) == (
        2,
        "Nacked: the broker nacked publish #9",
    )
    assert pending[1].body == b"body" and pending[1].mandatory is True
    status = store.status()
    assert (status.pending, status.retrying, status.dead, status.resent) == (2, 1, 1, 3)
    assert status.pending_bytes == 2 * (4 + len(b"\x00\x80\x03m-1"))
    assert status.oldest_created_at == 1004.0
    assert status.last_id == 7
    (dead,) = store.dead()
    assert (dead.record.id, dead.record.message_id, dead.reason) == (6, "m-6", "312 NO_ROUTE")


def test_batch_is_atomic(store: SQLiteOutbox) -> None:
    store.apply(OutboxBatch(inserts=[record(1)]))
    with pytest.raises(OutboxError, match="write failed"):
        # Row 1 exists: the whole batch (row 2 and the delete) is rolled back.
        store.apply(OutboxBatch(inserts=[record(2), record(1)]))
    assert [r.id for r in store.pending()] == [1]


def test_large_batches_and_scattered_deletes(store: SQLiteOutbox) -> None:
    store.apply(OutboxBatch(inserts=[record(i, body=b"x" * 10) for i in range(1, 2501)]))
    store.apply(OutboxBatch(deletes=list(range(1, 2501, 2))))  # 1250 ranges of one
    assert [r.id for r in store.pending()] == list(range(2, 2501, 2))


def test_contents_survive_reopening(path: str) -> None:
    first = SQLiteOutbox(path)
    first.open()
    first.apply(OutboxBatch(inserts=[record(1), record(2, body=b"")]))
    first.close()
    second = SQLiteOutbox(path)
    status = second.open()
    try:
        assert status.pending == 2 and status.last_id == 2
        assert [r.body for r in second.pending()] == [b"body", b""]
    finally:
        second.close()


def test_last_id_is_kept_after_everything_is_deleted(path: str, store: SQLiteOutbox) -> None:
    # New rows must never reuse an id a consumer-side log may already know.
    store.apply(OutboxBatch(inserts=[record(1), record(2)]))
    store.apply(OutboxBatch(deletes=[1, 2]))
    store.close()
    assert store.open().last_id == 2


def test_second_open_is_locked(path: str, store: SQLiteOutbox) -> None:
    with pytest.raises(OutboxLocked, match=f"in use by another publisher \\(pid {os.getpid()}\\)"):
        SQLiteOutbox(path).open()
    store.close()
    again = SQLiteOutbox(path)
    again.open()  # released by close()
    again.close()


def test_lock_held_by_another_process(path: str) -> None:
    code = (
        "import sys, time\n"
        "from rabbitry import SQLiteOutbox\n"
        f"o = SQLiteOutbox({path!r}); o.open(); print('open', flush=True); time.sleep(30)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(OutboxLocked) as info:
            SQLiteOutbox(path).open()
        assert info.value.path == path
        assert f"pid {child.pid}" in str(info.value)
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    store = SQLiteOutbox(path)
    store.open()  # the dead process's lock is gone with it
    store.close()


def test_database_locked_by_sqlite_is_a_clear_error(path: str) -> None:
    created = SQLiteOutbox(path)
    created.open()
    created.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(OutboxLocked, match="locked"):
            SQLiteOutbox(path, busy_timeout=0.1).open()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"this is not a database at all" * 200, "file is not a database"),
        (b"SQLite format 3\x00" + b"\xff" * 4000, "unreadable"),
    ],
    ids=["garbage", "bad-header"],
)
def test_corrupt_file_is_refused(path: str, content: bytes, match: str) -> None:
    Path(path).write_bytes(content)
    with pytest.raises(OutboxCorrupt, match=match) as info:
        SQLiteOutbox(path).open()
    assert info.value.path == path
    assert Path(path).read_bytes() == content  # never rewritten


def test_damaged_pages_are_refused(path: str) -> None:
    store = SQLiteOutbox(path)
    store.open()
    store.apply(OutboxBatch(inserts=[record(i, body=os.urandom(3000)) for i in range(1, 60)]))
    store.close()
    # Checkpoint the WAL into the main file, then overwrite a data page in the middle.
    db = sqlite3.connect(path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    data = bytearray(Path(path).read_bytes())
    page = 4096
    assert len(data) > 20 * page
    data[10 * page : 12 * page] = b"\x07" * (2 * page)
    Path(path).write_bytes(bytes(data))
    with pytest.raises(OutboxCorrupt):
        SQLiteOutbox(path).open()


def test_foreign_sqlite_database_is_refused(path: str) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (name TEXT)")
    db.commit()
    db.close()
    with pytest.raises(OutboxCorrupt, match="not a rabbitry outbox"):
        SQLiteOutbox(path).open()


def test_newer_schema_is_refused(path: str, store: SQLiteOutbox) -> None:
    store.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(OutboxCorrupt, match="schema version 99"):
        SQLiteOutbox(path).open()


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OutboxError, match="lock file"):
        SQLiteOutbox(str(tmp_path / "nope" / "outbox.db")).open()


def test_status_of_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OutboxError, match="no such file"):
        SQLiteOutbox(str(tmp_path / "missing.db")).status()
    assert not (tmp_path / "missing.db").exists()


def test_status_and_purge_work_while_open(path: str, store: SQLiteOutbox) -> None:
    store.apply(OutboxBatch(inserts=[record(1), record(2), record(3)]))
    store.apply(OutboxBatch(deaths=[(1, "312 NO_ROUTE"), (2, "312 NO_ROUTE")]))
    reader = SQLiteOutbox(path)  # another "process": no lock needed to read
    assert reader.status().dead == 2
    assert reader.purge_dead([1]) == 1
    assert [d.record.id for d in store.dead()] == [2]


def test_retry_dead_needs_the_lock_and_renumbers(path: str, store: SQLiteOutbox) -> None:
    store.apply(OutboxBatch(inserts=[record(1), record(2), record(3)]))
    store.apply(OutboxBatch(failures=[(2, 3, "PublishTimeout")], deaths=[(2, "312 NO_ROUTE")]))
    with pytest.raises(OutboxLocked):
        SQLiteOutbox(path).retry_dead()
    store.close()
    assert SQLiteOutbox(path).retry_dead() == 1
    store.open()
    pending = list(store.pending())
    assert [(r.id, r.message_id, r.attempts) for r in pending] == [
        (1, "m-1", 0),
        (3, "m-3", 0),
        (4, "m-2", 0),  # a new id above every id used; same message_id
    ]
    assert store.status().dead == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_rows": 0}, "max_rows"),
        ({"max_bytes": True}, "max_bytes"),
        ({"confirm_timeout": 0}, "confirm_timeout"),
        ({"retry_delay": -1}, "retry_delay"),
        ({"retry_delay": 5, "max_retry_delay": 1}, "max_retry_delay"),
        ({"synchronous": "OFF"}, "synchronous"),
        ({"busy_timeout": -1}, "busy_timeout"),
    ],
)
def test_invalid_options(path: str, options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        SQLiteOutbox(path, **options)  # type: ignore[arg-type]


def test_head_key_decodes_a_publish_frame() -> None:
    head = method_frame(
        3, spec.BasicPublish(exchange="orders", routing_key="eu.new", mandatory=True)
    )
    assert publish_key(head) == ("orders", "eu.new", True)
    plain = method_frame(1, spec.BasicPublish(exchange="", routing_key="q"))
    assert publish_key(plain) == ("", "q", False)


# --------------------------------------------------------------------------- CLI


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def test_cli_help_lists_the_outbox_commands() -> None:
    result = invoke("outbox", "--help")
    assert result.exit_code == 0
    for sub in ("status", "retry-dead", "purge-dead"):
        assert sub in result.stdout


def test_cli_status_json_and_text(path: str, store: SQLiteOutbox) -> None:
    now = time.time()
    store.apply(OutboxBatch(inserts=[record(1, created_at=now - 60), record(2), record(3)]))
    store.apply(OutboxBatch(deaths=[(2, "312 NO_ROUTE")], failures=[(3, 1, "Nacked")], resent=4))
    result = invoke("--json", "outbox", "status", path)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["pending"] == 2 and data["dead"] == 1 and data["resent"] == 4
    assert data["retrying"] == 1
    assert data["oldest_age_s"] >= 59
    (dead,) = data["dead_messages"]
    assert (dead["id"], dead["message_id"], dead["reason"]) == (2, "m-2", "312 NO_ROUTE")
    assert dead["body"] == "body"
    text = invoke("outbox", "status", path)
    assert text.exit_code == 0
    assert "2 pending" in text.stdout and "1 dead" in text.stdout
    assert "312 NO_ROUTE" in text.stdout


def test_cli_retry_dead_and_purge_dead(path: str, store: SQLiteOutbox) -> None:
    store.apply(OutboxBatch(inserts=[record(1), record(2), record(3)]))
    store.apply(OutboxBatch(deaths=[(1, "312 NO_ROUTE"), (2, "312 NO_ROUTE"), (3, "x")]))
    locked = invoke("outbox", "retry-dead", path)
    assert locked.exit_code == 1
    assert "OutboxLocked" in locked.stderr and "in use by another publisher" in locked.stderr
    store.close()
    result = invoke("--json", "outbox", "retry-dead", path, "--id", "1")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"path": path, "retried": 1}
    refused = invoke("outbox", "purge-dead", path)
    assert refused.exit_code == 2 and "without --yes" in refused.stderr
    purged = invoke("--json", "outbox", "purge-dead", path, "--yes")
    assert json.loads(purged.stdout) == {"path": path, "purged": 2}
    assert SQLiteOutbox(path).status().pending == 1


def test_cli_missing_and_corrupt_files(tmp_path: Path) -> None:
    missing = invoke("outbox", "status", str(tmp_path / "none.db"))
    assert missing.exit_code == 2 and "no outbox at" in missing.stderr
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 1000)
    corrupt = invoke("outbox", "status", str(bad))
    assert corrupt.exit_code == 1
    assert "OutboxCorrupt" in corrupt.stderr and str(bad) in corrupt.stderr
