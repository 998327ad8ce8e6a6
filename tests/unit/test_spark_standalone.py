"""The process bookkeeping of the Spark standalone cluster helper, on plain processes."""

from __future__ import annotations

import os
import subprocess
import time
from typing import TYPE_CHECKING

import pytest
from tests.support import spark_standalone as standalone

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

_TWO_SLEEPS = ["sh", "-c", "sleep 60 & sleep 60 & wait"]


def _until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, f"no {what} within 30 s"
        time.sleep(0.05)


def _members(group: int) -> list[int]:
    return [pid for pid, (_, pgrp) in standalone._processes().items() if pgrp == group]


@pytest.fixture
def shell() -> Iterator[subprocess.Popen[bytes]]:
    """A shell in a session of its own with two ``sleep`` children; all killed afterwards."""
    proc = subprocess.Popen(_TWO_SLEEPS, start_new_session=True)
    group = proc.pid

    def two_sleeps() -> bool:
        # A child the shell has forked is "sh -c ..." until its exec: wait for the sleeps.
        found = standalone._descendants([proc.pid], standalone._children())
        return [standalone._cmdline(pid) for pid in found] == [["sleep", "60"]] * 2

    _until("two sleeps", two_sleeps)
    yield proc
    for pid in _members(group):
        os.kill(pid, 9)
    proc.wait(10)


def test_descendants_follow_the_process_tree_down(shell: subprocess.Popen[bytes]) -> None:
    found = standalone._descendants([shell.pid], standalone._children())
    assert [standalone._cmdline(pid) for pid in found] == [["sleep", "60"]] * 2
    assert {standalone._processes()[pid][1] for pid in found} == {shell.pid}


def test_a_group_whose_leader_is_gone_is_still_killed_whole(
    shell: subprocess.Popen[bytes],
) -> None:
    shell.kill()  # the leader alone, reaped: its children live on in its group
    shell.wait(10)
    assert len(_members(shell.pid)) == 2
    standalone.kill_process_group(shell)
    _until("the end of the group", lambda: not _members(shell.pid))


def test_a_reaped_leader_of_an_empty_group_is_not_signalled(
    shell: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    for pid in _members(shell.pid):
        os.kill(pid, 9)
    shell.wait(10)
    _until("the end of the group", lambda: not _members(shell.pid))
    signalled: list[int] = []
    monkeypatch.setattr(standalone.os, "killpg", lambda pgid, sig: signalled.append(pgid))
    standalone.kill_process_group(shell)  # its pid may belong to another process by now
    assert signalled == []
