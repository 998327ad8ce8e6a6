"""A Spark standalone cluster on 127.0.0.1 for the tests and ``make bench-spark``.

:class:`SparkStandalone` starts a master and N workers (one core each by default) from
the pyspark package's own ``bin/spark-class``: separate JVMs, each with its own ports
(Spark picks free ones; they are read back from the logs) and its own directory. An
application connects with :attr:`SparkStandalone.master_url`; its executors are JVMs
launched by the workers, and their Python workers are processes forked by a
``pyspark.daemon`` under each executor, as on a real cluster.

For the fault tests it can find and ``SIGKILL`` those processes: a worker JVM
(:meth:`SparkStandalone.kill_worker`, restarted with :meth:`SparkStandalone.start_worker`)
and the Python workers under the executors (:meth:`SparkStandalone.kill_python_workers`).

Cleanup: :meth:`SparkStandalone.stop` kills every process group it started and removes
the directory; an ``atexit`` hook does the same for a cluster still running; and each
master and worker JVM is started through ``setpriv --pdeathsig KILL`` (util-linux), so a
``kill -9`` of the Python process that started them (from its main thread: the signal
follows the thread that forked) takes them down too. An
executor exits by itself when its worker is gone.

Usage::

    with SparkStandalone(workers=2) as cluster:
        spark = SparkSession.builder.master(cluster.master_url)...
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_ROOT = Path(__file__).resolve().parents[2]
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"

_RUNNING: set[SparkStandalone] = set()


def spark_home() -> Path:
    """The pyspark package directory: ``bin/spark-class`` and ``jars/`` are in it."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def cluster_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the JVMs: executors inherit it from their worker.

    Python workers run this interpreter with this checkout's ``src`` first on their
    path, so a clone under test imports its own rabbitry.
    """
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join([str(_ROOT / "src"), str(_ROOT)]),
        SPARK_DAEMON_MEMORY="512m",
    )
    env.pop("SPARK_CONF_DIR", None)
    env.update(extra or {})
    return env


@dataclass(eq=False)
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, *, group: bool = True) -> None:
        """``SIGKILL`` the JVM, with its process group (what it launched) unless not ``group``."""
        if group:
            kill_process_group(self.popen)
            return
        if self.popen.returncode is None:  # not reaped: the pid is still the JVM's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(30)


def kill_process_group(popen: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    """``SIGKILL`` the process group led by ``popen`` (started in a session of its own).

    Only what is still ours is signalled: the group while its leader is not reaped (the
    pid cannot go to another process before) or while a member lives (Linux does not
    reuse the id of a live group), so a recycled pid is never hit. Then reaps the leader.
    """
    if popen.returncode is None or _group_alive(popen.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout)


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every live process (zombies left out)."""
    found: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            found[int(entry)] = (int(fields[1]), int(fields[2]))
    return found


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process visible in ``/proc``."""
    tree: dict[int, list[int]] = {}
    for pid, (ppid, _) in _processes().items():
        tree.setdefault(ppid, []).append(pid)
    return tree


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _group_alive(group: int) -> bool:
    """Whether a live process is in process group ``group``."""
    return any(pgrp == group for _, pgrp in _processes().values())


def _descendants(roots: Iterable[int], tree: dict[int, list[int]]) -> list[int]:
    found: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        for child in tree.get(pid, []):
            found.append(child)
            stack.append(child)
    return found


@dataclass(eq=False)
class SparkStandalone:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each."""

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    start_timeout: float = 180.0
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rabbitry-spark-")))
    master_url: str = ""
    _master: _Process | None = None
    _workers: dict[int, _Process] = field(default_factory=dict)
    _launched: list[_Process] = field(default_factory=list)
    _restarts: int = 0

    def __enter__(self) -> SparkStandalone:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Start the master, then every worker; returns once all are registered."""
        _RUNNING.add(self)
        try:
            self._master = self._launch(
                "master",
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            )
            match = self._wait_for_log(self._master, _MASTER_URL.search, "the master's URL")
            self.master_url = match.group(1)
            for index in range(self.workers):  # they start side by side
                self._launch_worker(index)
            for index in range(self.workers):
                self._wait_registered(index)
        except BaseException:
            self.stop()
            raise

    def start_worker(self, index: int) -> None:
        """(Re)start worker ``index``; returns once the master has registered it."""
        self._launch_worker(index)
        self._wait_registered(index)

    def _launch_worker(self, index: int) -> None:
        old = self._workers.get(index)
        if old is not None and old.alive():
            raise RuntimeError(f"worker {index} runs already (pid {old.pid})")
        self._restarts += 1
        work = self.base / f"worker-{index}"
        work.mkdir(exist_ok=True)
        worker = self._launch(
            f"worker-{index}.{self._restarts}",
            "org.apache.spark.deploy.worker.Worker",
            [
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--webui-port",
                "0",
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work),
                self.master_url,
            ],
        )
        self._workers[index] = worker

    def _wait_registered(self, index: int) -> None:
        worker = self._workers[index]
        self._wait_for_log(worker, lambda text: _REGISTERED in text or None, "registration")

    def stop(self) -> None:
        """Kill every process the cluster started, then remove its directory.

        A worker's executors, and their Python workers, are in the worker's process group,
        also when the worker was killed alone and they outlived it.
        """
        for process in self._launched:
            process.kill()
        deadline = time.monotonic() + 10  # SIGKILLed processes take a moment to go
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.base, ignore_errors=True)
        _RUNNING.discard(self)

    def leftovers(self) -> list[str]:
        """What still runs in the process groups the cluster started (empty once stopped)."""
        groups = {process.pid for process in self._launched}
        return [
            f"process {pid} ({' '.join(_cmdline(pid))[:80]}) still runs"
            for pid, (_, group) in _processes().items()
            if group in groups
        ]

    # ------------------------------------------------------------------ faults

    def worker_pid(self, index: int) -> int:
        """The pid of worker ``index``'s JVM."""
        return self._workers[index].pid

    def kill_worker(self, index: int) -> None:
        """``SIGKILL`` worker ``index``'s JVM alone; its executors exit once they notice."""
        self._workers[index].kill(group=False)

    def executor_pids(self) -> list[int]:
        """The executor JVMs now running under the workers."""
        tree = _children()
        return [
            pid
            for pid in _descendants((w.pid for w in self._workers.values()), tree)
            if "CoarseGrainedExecutorBackend" in " ".join(_cmdline(pid))
        ]

    def python_worker_pids(self) -> list[int]:
        """The Python workers under the executors: what a ``pyspark.daemon`` forked."""
        tree = _children()
        daemons = [
            pid
            for pid in _descendants(self.executor_pids(), tree)
            if "pyspark.daemon" in _cmdline(pid)
        ]
        return [pid for daemon in daemons for pid in tree.get(daemon, [])]

    def kill_python_workers(self) -> list[int]:
        """``SIGKILL`` every Python worker under the executors; the pids killed."""
        killed = []
        for pid in self.python_worker_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        return killed

    # ------------------------------------------------------------------ details

    def _launch(self, name: str, main_class: str, args: list[str]) -> _Process:
        log = self.base / f"{name}.log"
        spark_class = str(spark_home() / "bin" / "spark-class")
        with log.open("wb") as out:
            popen = subprocess.Popen(
                # setpriv (util-linux) sets the parent-death signal and execs spark-class,
                # which execs the JVM: no preexec_fn, unsafe in a process with threads.
                ["setpriv", "--pdeathsig", "KILL", "--", spark_class, main_class, *args],
                env=cluster_env({"SPARK_LOCAL_DIRS": str(self.base / "local")}),
                cwd=self.base,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = _Process(name, popen, log)
        self._launched.append(process)
        return process

    def _wait_for_log(self, process: _Process, found: Callable[[str], Any], what: str) -> Any:
        deadline = time.monotonic() + self.start_timeout
        while True:
            text = process.log.read_text(errors="replace")
            match = found(text)
            if match:
                return match
            if not process.alive():
                raise RuntimeError(f"{process.name} exited before {what}:\n{text[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{process.name}: no {what} after {self.start_timeout} s")
            time.sleep(0.1)


@atexit.register
def _stop_all() -> None:
    for cluster in list(_RUNNING):
        cluster.stop()
