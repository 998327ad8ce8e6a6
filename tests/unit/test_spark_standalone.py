"""The process bookkeeping of the Spark standalone cluster helper, on plain processes."""

from __future__ import annotations

import subprocess
import time

from tests.support import spark_standalone as standalone


def test_descendants_follow_the_process_tree_down() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(standalone._descendants([shell.pid], standalone._children())) < 2:
            assert time.monotonic() < deadline, "the shell never started its two sleeps"
            time.sleep(0.05)
        found = standalone._descendants([shell.pid], standalone._children())
        assert [standalone._cmdline(pid) for pid in found] == [["sleep", "60"]] * 2
        groups = {standalone._processes()[pid][1] for pid in found}
        assert groups == {shell.pid}  # in the shell's process group: what stop() kills
    finally:
        shell.kill()
        subprocess.run(["pkill", "-KILL", "-g", str(shell.pid)], check=False)
        shell.wait(10)
