"""Callbacks registered on a sync ``Connection`` before ``connect()`` fire once connected."""

from __future__ import annotations

import threading
import time

import rabbitry


def test_callbacks_registered_before_connect_run_on_the_dispatcher(url: str) -> None:
    conn = rabbitry.Connection(url)
    seen: list[tuple[str, object, str]] = []
    conn.on_state_change(
        lambda state, cause: seen.append(("state", state, threading.current_thread().name))
    )
    conn.add_close_callback(
        lambda exc: seen.append(("closed", type(exc), threading.current_thread().name))
    )
    conn.connect(timeout=10)
    try:
        assert conn.is_open
    finally:
        conn.close()
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("state", rabbitry.State.CLOSED) in [(k, v) for k, v, _ in seen]
    assert ("closed", rabbitry.ConnectionClosedByClient) in [(k, v) for k, v, _ in seen]
    assert all(name.startswith("rabbitry-callbacks-") for _, _, name in seen)
