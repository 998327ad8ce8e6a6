"""What a test must give back: threads and TCP sockets (checked after every fault test).

:func:`snapshot` records this process's live threads and its connected TCP sockets
(read from ``/proc``: every fd that is a socket, matched by inode against the kernel's
TCP tables; listening sockets are not counted). :func:`leaked` polls until both are back
to a snapshot's level or a grace period ends, and says what is left over.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

# Threads owned by the interpreter or by asyncio's default executor (shut down with its
# loop, which pytest-asyncio closes after the test's fixtures): not ours to check.
_IGNORED_THREAD_PREFIXES = ("asyncio_", "ThreadPoolExecutor-", "pydevd")
_LISTEN = "0A"


@dataclass(frozen=True)
class Snapshot:
    threads: frozenset[int]
    sockets: frozenset[int]


def _tcp_inodes() -> dict[int, str]:
    states: dict[int, str] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if len(parts) > 9:
                        states[int(parts[9])] = parts[3]
        except OSError:
            continue
    return states


def _connected_tcp_sockets() -> frozenset[int]:
    tcp = _tcp_inodes()
    mine: set[int] = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = int(target[8:-1])
            state = tcp.get(inode)
            if state is not None and state != _LISTEN:
                mine.add(inode)
    return frozenset(mine)


def _threads() -> dict[int, str]:
    return {
        t.ident: t.name
        for t in threading.enumerate()
        if t.ident is not None and t.is_alive() and not t.name.startswith(_IGNORED_THREAD_PREFIXES)
    }


def snapshot() -> Snapshot:
    return Snapshot(frozenset(_threads()), _connected_tcp_sockets())


def leaked(before: Snapshot, grace: float = 5.0) -> str | None:
    """None when threads and sockets are back to ``before``; else what is left."""
    deadline = time.monotonic() + grace
    while True:
        threads = {i: n for i, n in _threads().items() if i not in before.threads}
        sockets = _connected_tcp_sockets() - before.sockets
        if not threads and not sockets:
            return None
        if time.monotonic() >= deadline:
            names = sorted(threads.values())
            return f"threads left running: {names}; TCP sockets left open: {len(sockets)}"
        time.sleep(0.05)
