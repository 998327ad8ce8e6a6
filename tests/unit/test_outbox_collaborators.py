"""The objects the outbox publisher, the shovel and the batching publisher hold, alone;
no broker."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from rabbitry import OutboxFull, OutboxLocked, SQLiteOutbox
from rabbitry._batch_envelopes import Accumulator, EnvelopeOutcomes
from rabbitry._outbox.file import OutboxLock
from rabbitry._outbox.room import OutboxRoom
from rabbitry._outbox.rows import READY, Entry, ReadyRows
from rabbitry._shovel.ledger import ShovelLedger
from rabbitry.exceptions import InvalidStateError, LocalProtocolError
from rabbitry.outbox import OutboxRecord
from rabbitry.publishing.unobserved import UnobservedLedger

if TYPE_CHECKING:
    from pathlib import Path


def _entry(row_id: int, body: bytes = b"x") -> Entry:
    record = OutboxRecord(row_id, f"m-{row_id}", "", "q", False, b"", body, 0.0)
    return Entry(record, None, 0)


async def test_room_reserves_waits_in_order_and_refuses_when_closed(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "o.db", max_rows=2, max_bytes=100)
    room = OutboxRoom(outbox, timeout=None)
    await room.reserve(2, 10, None)
    assert (room.rows, room.bytes) == (2, 10)
    with pytest.raises(LocalProtocolError, match="can never fit"):
        await room.reserve(3, 1, None)
    with pytest.raises(OutboxFull):
        await room.reserve(1, 1, 0.01)
    waiting = asyncio.ensure_future(room.reserve(1, 5, None))
    await asyncio.sleep(0)
    assert not waiting.done()
    room.release(1, 5)  # room for the waiter: granted
    await asyncio.wait_for(waiting, 1)
    assert (room.rows, room.bytes) == (2, 10)
    idle = asyncio.ensure_future(room.wait_idle())
    await asyncio.sleep(0)
    room.release(2, 10)
    await asyncio.wait_for(idle, 1)
    room.close(InvalidStateError("closed"))
    with pytest.raises(InvalidStateError):
        await room.reserve(1, 1, None)


async def test_ready_rows_queue_in_order_and_wake_the_sender() -> None:
    ready = ReadyRows()
    ready.add([])
    assert not ready.event.is_set()
    entries = [_entry(1), _entry(2)]
    ready.add(entries)
    assert ready.event.is_set()
    assert list(ready.rows) == entries
    assert all(e.state == READY for e in entries)


def test_outbox_lock_is_exclusive(tmp_path: Path) -> None:
    path = str(tmp_path / "o.db")
    first, second = OutboxLock(path), OutboxLock(path)
    first.acquire()
    try:
        with pytest.raises(OutboxLocked, match="in use"):
            second.acquire()
    finally:
        first.release()
    second.acquire()
    second.release()
    second.release()  # idempotent


def test_shovel_ledger_remembers_each_kind() -> None:
    ledger = ShovelLedger()
    assert not ledger.was_sent("d1")
    ledger.sent("d1")
    assert ledger.was_sent("d1")
    assert not ledger.was_confirmed("m1")
    ledger.confirmed("m1")
    assert ledger.was_confirmed("m1")
    assert ledger.acknowledged("m1") is True
    assert ledger.acknowledged("m1") is False  # counted once


def test_envelope_outcomes_count_and_fail() -> None:
    acc = Accumulator(10, 1000)
    outcomes = EnvelopeOutcomes(acc, UnobservedLedger("publish"))
    loop = asyncio.new_event_loop()
    try:
        futures = [loop.create_future(), loop.create_future()]
        outcomes.refused(futures, ValueError("no"), False)
        assert all(isinstance(f.exception(), ValueError) for f in futures)
        lost = [loop.create_future()]
        outcomes.refused(lost, KeyboardInterrupt(), False, InvalidStateError("lost"))
        assert isinstance(lost[0].exception(), InvalidStateError)
        outcomes.close()
    finally:
        loop.close()
