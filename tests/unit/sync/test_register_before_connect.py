"""The sync ``Connection`` takes its callbacks before ``connect()``, as the async twin does.

Registering ``on_state_change`` (or any other connection callback) on a connection that is
not connected yet used to raise ``InvalidStateError`` on the sync twin only, so the
natural order "build, register, connect" worked with ``AsyncConnection`` and failed with
``Connection``. No broker is needed: nothing connects here.
"""

from __future__ import annotations

from typing import Any

import pytest

import rabbitry

# (sync method, the engine collaborator that keeps the callbacks, its list)
REGISTRATIONS = [
    ("on_state_change", "_life", "state_callbacks", lambda state, cause: None),
    ("on_queue_renamed", "_life", "rename_callbacks", lambda old, new: None),
    ("on_recovery_error", "_life", "recovery_error_callbacks", lambda kind, name, exc: None),
    ("add_blocked_callback", "_dispatch", "blocked_callbacks", lambda reason: None),
    ("add_close_callback", "_life", "close_callbacks", lambda exc: None),
]


@pytest.mark.parametrize(
    ("method", "keeper", "engine_list", "callback"),
    REGISTRATIONS,
    ids=[r[0] for r in REGISTRATIONS],
)
def test_registering_before_connect_reaches_the_engine(
    method: str, keeper: str, engine_list: str, callback: Any
) -> None:
    conn = rabbitry.Connection("amqp://guest:guest@127.0.0.1:1/")
    callbacks = getattr(getattr(conn._async, keeper), engine_list)
    before = len(callbacks)
    getattr(conn, method)(callback)  # no InvalidStateError
    assert len(callbacks) == before + 1
    assert conn._portal is None  # registering started no thread


def test_a_relayed_callback_runs_on_the_dispatcher_once_connected() -> None:
    """Before connect the relay has no dispatcher: it drops the call instead of raising."""
    conn = rabbitry.Connection("amqp://guest:guest@127.0.0.1:1/")
    seen: list[object] = []
    conn.add_close_callback(seen.append)
    relay = conn._async._life.close_callbacks[-1]
    relay(rabbitry.ConnectionLost("test"))  # what the engine would call
    assert seen == []
