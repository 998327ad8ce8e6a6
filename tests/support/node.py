"""Throw-away RabbitMQ nodes for the fault tests, started beside the shared broker.

:class:`BrokerNode` runs a private node with the recipe described in
``docs/testing.md``, so a test can stop, kill, freeze, alarm
and restart *its own* broker while the shared node on 127.0.0.1:5672 is never touched:

* the **unwrapped** scripts in the Debian package's ``lib/rabbitmq/bin`` (the ``sbin``
  wrapper ``su``s to the ``rabbitmq`` user, shares the shared node's cookie and
  overwrites its startup log);
* a private ``HOME`` holding a random ``.erlang.cookie`` (mode 400), so no CLI call made
  here can authenticate to another node even with a mistyped name;
* ``-n <node>`` on every CLI call, its own AMQP, distribution and CLI ports, its own data
  and log directories, an empty ``enabled_plugins`` and an empty env file instead of
  ``/etc/rabbitmq/rabbitmq-env.conf``; the CLI processes get a minimal environment, so
  nothing from the caller's ``RABBITMQ_*`` / ``ERL_*`` variables leaks in.

Ports come in blocks that never meet the shared node's (5672, 25672, CLI 35672-35682):
distribution ``D`` in 21000-24999, AMQP ``D-10000``, plugin listeners ``D-9999..D-9993``,
CLI ``D+10000..D+10010``. A block is reserved with a ``flock`` on a file in the temp
directory for as long as the node owns it, so parallel test runs pick different blocks,
and every port is bind-checked before use.

Cleanup is layered: :meth:`BrokerNode.stop` (graceful stop, then ``SIGKILL`` of whatever
is left, then waits until epmd has forgotten the name, then removes the directory); an
``atexit`` hook for every node still running; and a watchdog inside the node, started
before the broker boots, that halts it (and deletes its directory) within about a second
of the owning Python process disappearing, which covers ``kill -9`` of pytest and
``os._exit``, also while a boot waits for cluster peers.

Usage::

    with BrokerNode() as node:
        conn = rabbitry.Connection(node.url)
        node.set_alarm("memory")
        ...
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import itertools
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, get_args

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

__all__ = [
    "Alarm",
    "BrokerNode",
    "BrokerNodeError",
    "NodePorts",
    "epmd_names",
    "find_scripts_dir",
    "leftovers",
]

Alarm = Literal["memory", "disk"]
"""The resource alarms :meth:`BrokerNode.set_alarm` can raise."""

_log = logging.getLogger(__name__)

#: Overrides where the unwrapped RabbitMQ scripts are (a directory with rabbitmq-server).
SCRIPTS_ENV: Final = "RABBITRY_RABBITMQ_SCRIPTS"
_DEFAULT_SCRIPTS = Path("/usr/lib/rabbitmq/bin")
_PACKAGE_SBIN_GLOB = "/usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin"

#: Every node this process starts is called ``rabbitry-t<pid>-<n>@localhost``.
NAME_PREFIX: Final = f"rabbitry-t{os.getpid()}-"
_HOST: Final = "localhost"
_counter = itertools.count(1)

# Port blocks: see the module docstring. The stride leaves room for the 11 CLI ports
# and the 7 plugin ports of one block without touching the next block.
_DIST_BASES: Final = range(21008, 25000, 16)
_CLI_OFFSET: Final = 10000
_CLI_PORTS: Final = 11
_EXTRA_PORTS: Final = 7
_SHARED_PORTS: Final = frozenset({4369, 5671, 5672, 15672, 25672, *range(35672, 35683)})
_LOCK_DIR: Final = Path(tempfile.gettempdir()) / "rabbitry-node-ports"

#: How long a CLI call may take before the node counts as hung. The call boots an Erlang
#: VM: about 1 s on an idle machine, but over 30 s has been seen on two busy cores (a
#: forced close in the model-based fault test timed out at 30 s under a load of 12).
#: The deadline only catches a hung or paused node, so it is generous.
CLI_TIMEOUT: Final = 90.0
_EPMD_TIMEOUT: Final = 2.0
_PROBE_TIMEOUT: Final = 2.0
_LOG_TAIL_LINES: Final = 30
_FIRST_ERRORS: Final = 8

#: rabbitmq.conf settings for plugins that open ports, so they listen on 127.0.0.1 and a
#: port of the node's block instead of their defaults (the shared node's, mosquitto's...).
_PLUGIN_LISTENERS: Final[Mapping[str, Mapping[str, str]]] = {
    "rabbitmq_management": {"management.tcp.port": "{port}", "management.tcp.ip": "127.0.0.1"},
    "rabbitmq_prometheus": {"prometheus.tcp.port": "{port}", "prometheus.tcp.ip": "127.0.0.1"},
    "rabbitmq_stream": {"stream.listeners.tcp.1": "127.0.0.1:{port}"},
    "rabbitmq_mqtt": {"mqtt.listeners.tcp.1": "127.0.0.1:{port}"},
    "rabbitmq_stomp": {"stomp.listeners.tcp.1": "127.0.0.1:{port}"},
    "rabbitmq_web_mqtt": {"web_mqtt.tcp.port": "{port}", "web_mqtt.tcp.ip": "127.0.0.1"},
    "rabbitmq_web_stomp": {"web_stomp.tcp.port": "{port}", "web_stomp.tcp.ip": "127.0.0.1"},
}


class BrokerNodeError(RuntimeError):
    """A throw-away node did not do what was asked; the message ends with its log tail."""


@dataclass(frozen=True)
class NodePorts:
    """The ports one node owns (all on 127.0.0.1)."""

    amqp: int
    dist: int
    cli_min: int
    cli_max: int
    extra: tuple[int, ...]

    def all(self) -> list[int]:
        return [self.amqp, self.dist, *range(self.cli_min, self.cli_max + 1), *self.extra]


def find_scripts_dir() -> Path | None:
    """The directory of the unwrapped ``rabbitmq-server`` / ``rabbitmqctl``, or None.

    ``$RABBITRY_RABBITMQ_SCRIPTS`` wins; then Debian's ``/usr/lib/rabbitmq/bin``; then the
    package's own ``sbin``. The ``/usr/sbin`` wrapper is refused: it would run the node as
    the ``rabbitmq`` user with the shared node's cookie.
    """
    override = os.environ.get(SCRIPTS_ENV)
    candidates = (
        [Path(override)]
        if override
        else [
            _DEFAULT_SCRIPTS,
            *sorted(Path(p) for p in glob.glob(_PACKAGE_SBIN_GLOB)),
        ]
    )
    for directory in candidates:
        server = directory / "rabbitmq-server"
        if not (server.is_file() and (directory / "rabbitmqctl").is_file()):
            continue
        if server.resolve().name == "rabbitmq-script-wrapper":
            continue
        return directory
    return None


def epmd_names(port: int | None = None) -> dict[str, int]:
    """Short node names registered with the local epmd, mapped to their dist ports.

    Speaks epmd's NAMES request directly (no ``epmd`` process). Empty when no epmd runs.
    """
    epmd_port = port or int(os.environ.get("ERL_EPMD_PORT", "4369"))
    try:
        with socket.create_connection(("127.0.0.1", epmd_port), _EPMD_TIMEOUT) as sock:
            sock.settimeout(_EPMD_TIMEOUT)
            sock.sendall(b"\x00\x01n")  # length 1, NAMES_REQ (110)
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
    except OSError:
        return {}
    text = data[4:].decode("utf-8", "replace")  # 4 bytes: epmd's own port
    return {m[1]: int(m[2]) for m in re.finditer(r"^name (\S+) at port (\d+)$", text, re.M)}


def _proc_state(pid: int) -> str | None:
    """The process's state letter from /proc, or None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def _alive(pid: int) -> bool:
    # A zombie (Z) or dead (X) process is gone for our purposes: its sockets are closed.
    return _proc_state(pid) not in (None, "Z", "X")


def _marked_pids(name: str | None = None) -> dict[int, str]:
    """Live processes started by :class:`BrokerNode` (``-rabbitry_node`` argument).

    With ``name``, only that node's; otherwise every node of *this* Python process.
    """
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        try:
            index = args.index(b"-rabbitry_node")
        except ValueError:
            continue
        if index + 1 >= len(args):
            continue
        node = args[index + 1].decode("utf-8", "replace")
        wanted = node == name if name is not None else node.startswith(NAME_PREFIX)
        pid = int(entry.name)
        if wanted and _alive(pid):
            found[pid] = node
    return found


def leftovers(only: Iterable[str] | None = None) -> list[str]:
    """What is left of this process's nodes: epmd names, processes, directories.

    Empty when every node was cleaned up; used by the session-end check. ``only`` limits
    it to the nodes with those short names: a fixture that checks its own nodes at its
    teardown must not flag another fixture's, still running because it is torn down later.
    """
    problems = [f"epmd still lists {n}" for n in epmd_names() if n.startswith(NAME_PREFIX)]
    problems += [f"process {pid} of {node} still runs" for pid, node in _marked_pids().items()]
    problems += [f"directory {d} still exists" for d in sorted(_BASE_DIRS) if d.exists()]
    if only is not None:
        # rabbitry-t<pid>-1 must not match rabbitry-t<pid>-12.
        names = [re.escape(name) + "(?![0-9])" for name in only]
        if not names:
            return []
        mine = re.compile("|".join(names))
        problems = [problem for problem in problems if mine.search(problem)]
    return problems


def _erl_binary(text: str) -> str:
    """``text`` as an Erlang binary literal (UTF-8 bytes, so no quoting to get wrong)."""
    return "<<" + ",".join(str(b) for b in text.encode()) + ">>"


def _wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class _PortLease:
    """A reserved port block: an exclusive flock held until :meth:`release`."""

    def __init__(self) -> None:
        self._fd: int | None = None
        _LOCK_DIR.mkdir(mode=0o777, exist_ok=True)
        bases = list(_DIST_BASES)
        random.SystemRandom().shuffle(bases)
        for base in bases:
            ports = NodePorts(
                amqp=base - 10000,
                dist=base,
                cli_min=base + _CLI_OFFSET,
                cli_max=base + _CLI_OFFSET + _CLI_PORTS - 1,
                extra=tuple(range(base - 10000 + 1, base - 10000 + 1 + _EXTRA_PORTS)),
            )
            assert not _SHARED_PORTS.intersection(ports.all()), ports
            try:
                fd = os.open(_LOCK_DIR / f"{base}.lock", os.O_RDWR | os.O_CREAT, 0o666)
            except OSError:  # e.g. another user's lock file in a sticky /tmp
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another node (of any process) has this block
                os.close(fd)
                continue
            if all(_port_free(p) for p in ports.all()):
                self.ports = ports
                self._fd = fd
                return
            os.close(fd)  # also drops the lock
        raise BrokerNodeError("no free port block for a throw-away node in 11000-35010")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# Nodes started and not yet stopped for good, for the atexit hook; and every base
# directory ever made, for leftovers().
_LIVE: set[BrokerNode] = set()
_BASE_DIRS: set[Path] = set()
_LIVE_LOCK = threading.Lock()


def _stop_all_at_exit() -> None:
    with _LIVE_LOCK:
        nodes = list(_LIVE)
    for node in nodes:
        try:
            node.stop(timeout=15)
        except Exception:  # keep going: every node gets its chance
            _log.exception("stopping %s at exit failed", node.name)


atexit.register(_stop_all_at_exit)


class BrokerNode:
    """A private single RabbitMQ node with its own ports, data, logs and cookie.

    Args:
        plugins: plugins to enable at the first start (see :meth:`enable_plugins`).
        config: extra ``rabbitmq.conf`` settings, e.g. ``{"consumer_timeout": "5000"}``.
        scheduler_threads: Erlang schedulers (``+S n:n``); 1 keeps the node light.
        niceness: ``nice`` increment for the node, so the shared broker keeps priority.
        start_timeout: default seconds :meth:`start` waits for the node to be ready.
        cookie: the Erlang cookie to use instead of a random one; nodes that form a
            cluster (``tests.support.cluster``) share one. Still private to this run.

    Lifecycle: :meth:`start` → (:meth:`kill` / :meth:`pause` / :meth:`restart` ...) →
    :meth:`stop`. Data survives :meth:`kill`, :meth:`restart` and ``stop(keep_data=True)``;
    a plain :meth:`stop` deletes everything, and a later :meth:`start` begins afresh.
    The AMQP port (so :attr:`url`) stays the same until that final stop.

    Every wait is bounded; failures raise :class:`BrokerNodeError` with the node's log tail.
    """

    def __init__(
        self,
        *,
        plugins: Iterable[str] = (),
        config: Mapping[str, str] | None = None,
        scheduler_threads: int = 1,
        niceness: int = 10,
        start_timeout: float = 60.0,
        cookie: str | None = None,
    ) -> None:
        self.name: Final = f"{NAME_PREFIX}{next(_counter)}@{_HOST}"
        self.short_name: Final = self.name.partition("@")[0]
        self._scripts = find_scripts_dir()
        self._plugins: list[str] = []
        self._config = dict(config or {})
        self._scheduler_threads = scheduler_threads
        self._niceness = niceness
        self._start_timeout = start_timeout
        if cookie is not None and not re.fullmatch(r"[A-Za-z0-9]{16,255}", cookie):
            raise BrokerNodeError("cookie: must be 16-255 letters and digits")
        self._cookie = cookie
        self._base: Path | None = None
        self._lease: _PortLease | None = None
        self._alarms: set[Alarm] = set()
        self._paused = False
        self._resume_timer: threading.Timer | None = None
        self._launcher: subprocess.Popen[bytes] | None = None
        self._lock = threading.RLock()
        self.enable_plugins(plugins)

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<BrokerNode {self.name} {state} {self._base}>"

    def __enter__(self) -> BrokerNode:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ facts

    @property
    def ports(self) -> NodePorts:
        """The node's ports; reserved by the first :meth:`start`."""
        if self._lease is None:
            raise BrokerNodeError(f"{self.name} has no ports yet: start() it first")
        return self._lease.ports

    @property
    def port(self) -> int:
        """The AMQP port."""
        return self.ports.amqp

    @property
    def url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>/`` (guest may log in from localhost)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def base_dir(self) -> Path:
        """The node's private directory (home, data, logs, config, pid file)."""
        if self._base is None:
            raise BrokerNodeError(f"{self.name} has no directory: start() it first")
        return self._base

    @property
    def log_file(self) -> Path:
        return self.base_dir / "log" / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        """The node's OS pid, read fresh from its pid file (or found by its marker).

        None when the node does not run. A pid is only trusted when that process carries
        this node's marker argument, so a stale pid file never points a signal at a
        stranger.
        """
        pids = self._pids()
        return pids[0] if pids else None

    @property
    def is_running(self) -> bool:
        """The node's VM is alive (possibly paused, possibly still booting)."""
        return bool(self._pids())

    @property
    def is_paused(self) -> bool:
        return self._paused

    @property
    def plugins(self) -> list[str]:
        return list(self._plugins)

    def plugin_port(self, plugin: str) -> int:
        """The port a listener plugin (management, prometheus, stream...) was given."""
        if plugin not in self._plugins or plugin not in _PLUGIN_LISTENERS:
            raise BrokerNodeError(f"{plugin} is not an enabled listener plugin of {self.name}")
        listeners = [p for p in self._plugins if p in _PLUGIN_LISTENERS]
        return self.ports.extra[listeners.index(plugin)]

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the node's log, launcher output and crash dump slogan."""
        if self._base is None:
            return "(no node directory)"
        parts: list[str] = []
        for path in (self.log_file, self._base / "launcher.out"):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            all_lines = text.rstrip().splitlines()
            if not all_lines:
                continue
            # The first errors usually say why; the tail says what happened last.
            first_errors = [line for line in all_lines if "[error]" in line][:_FIRST_ERRORS]
            if first_errors and first_errors[0] not in all_lines[-lines:]:
                parts.append(f"--- {path} (first errors)\n" + "\n".join(first_errors))
            tail = "\n".join(all_lines[-lines:])
            parts.append(f"--- {path} (last {lines} lines)\n{tail}")
        dump = self._base / "erl_crash.dump"
        with contextlib.suppress(OSError), dump.open(errors="replace") as handle:
            head = [next(handle, "") for _ in range(3)]
            parts.append(f"--- {dump}\n{''.join(head).rstrip()}")
        return "\n".join(parts) if parts else "(the node wrote no log)"

    def _fail(self, message: str) -> BrokerNodeError:
        return BrokerNodeError(f"{self.name}: {message}\n{self.log_tail()}")

    # ------------------------------------------------------------------ processes

    def _pids(self) -> list[int]:
        """The node's live VM pid(s): the pid file first, checked against the marker."""
        marked = _marked_pids(self.name)
        if self._base is not None:
            with contextlib.suppress(OSError, ValueError):
                pid = int((self._base / "pid").read_text().strip())
                if pid in marked:
                    return [pid, *(p for p in marked if p != pid)]
        return sorted(marked)

    def _signal(self, sig: signal.Signals) -> list[int]:
        pids = self._pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    def _wait_gone(self, timeout: float) -> bool:
        """Wait until no process of the node runs and epmd has forgotten its name."""
        deadline = time.monotonic() + timeout
        if not _wait_until(lambda: not self._pids(), timeout):
            return False
        remaining = max(0.5, deadline - time.monotonic())
        return _wait_until(lambda: self.short_name not in epmd_names(), remaining)

    # ------------------------------------------------------------------ environment

    def _require_scripts(self) -> Path:
        if self._scripts is None:
            raise BrokerNodeError(
                "no unwrapped RabbitMQ scripts found (looked at $"
                f"{SCRIPTS_ENV}, {_DEFAULT_SCRIPTS}, {_PACKAGE_SBIN_GLOB}); "
                "install the rabbitmq-server package"
            )
        return self._scripts

    def _env(self) -> dict[str, str]:
        """A minimal environment for the scripts: nothing of the caller's leaks in."""
        base = self.base_dir
        ports = self.ports
        marker = f"-rabbitry_node {self.name} -rabbitry_owner {os.getpid()}"
        # The VM runs its -eval and -s arguments one after the other, in order, and
        # `rabbit:boot()` returns only once the node is up, which can take minutes (a
        # cluster member waiting for its peers' tables). So the script is told not to
        # add its own `-s rabbit boot` (RABBITMQ_NODE_ONLY), and the boot comes here,
        # after the watchdog: a node whose owner dies during a long boot halts too.
        erl_args = (
            f"+S {self._scheduler_threads}:{self._scheduler_threads} "
            "-kernel inet_dist_use_interface {127,0,0,1} "
            f"{marker} -eval {self._watchdog()} -s rabbit boot"
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": str(base / "home"),
            "TMPDIR": tempfile.gettempdir(),
            "ERL_CRASH_DUMP": str(base / "erl_crash.dump"),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(ports.amqp),
            "RABBITMQ_DIST_PORT": str(ports.dist),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(ports.cli_min),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(ports.cli_max),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(base / "pid"),
            "RABBITMQ_NODE_ONLY": "1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": erl_args,
            "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        if "ERL_EPMD_PORT" in os.environ:  # the one ERL_ variable that must match epmd's
            env["ERL_EPMD_PORT"] = os.environ["ERL_EPMD_PORT"]
        return env

    def _watchdog(self) -> str:
        """An ``-eval`` expression (no whitespace: the scripts word-split it) that halts
        the node, deleting its directory, once the owning Python process is gone."""
        owner = f'"/proc/{os.getpid()}"'
        cleanup = ""
        if re.fullmatch(r"[A-Za-z0-9_./+-]+", str(self.base_dir)):
            cleanup = f'file:del_dir_r("{self.base_dir}"),'
        return (
            "spawn(fun()->W=fun(F)->timer:sleep(1000),"
            f"(case(file:read_file_info({owner}))of{{ok,_}}->F(F);"
            f"_->{cleanup}erlang:halt(0)end)end,W(W)end)"
        )

    def _prepare_dir(self) -> None:
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix=f"{self.short_name}-"))
            _BASE_DIRS.add(self._base)
            home = self._base / "home"
            home.mkdir(mode=0o700)
            cookie = home / ".erlang.cookie"
            cookie.write_text(self._cookie or secrets.token_hex(20).upper())
            cookie.chmod(0o400)
            for sub in ("mnesia", "log"):
                (self._base / sub).mkdir()
            (self._base / "rabbitmq-env.conf").write_text("")  # not the system's env file
        if self._lease is None:
            self._lease = _PortLease()
        self._write_config()

    def _write_config(self) -> None:
        base = self.base_dir
        settings = {"log.console": "false", "log.file.level": "info"}
        listeners = [p for p in self._plugins if p in _PLUGIN_LISTENERS]
        for plugin, port in zip(listeners, self.ports.extra, strict=False):
            for key, value in _PLUGIN_LISTENERS[plugin].items():
                settings[key] = value.format(port=port)
        settings.update(self._config)
        (base / "rabbitmq.conf").write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))
        (base / "enabled_plugins").write_text(f"[{','.join(self._plugins)}].\n")

    # ------------------------------------------------------------------ lifecycle

    def enable_plugins(self, plugins: Iterable[str]) -> None:
        """Enable ``plugins`` from the next start on (written to ``enabled_plugins``).

        Plugins that listen on ports (management, prometheus, stream, mqtt, stomp,
        web_mqtt, web_stomp) get ports from the node's block on 127.0.0.1 -- see
        :meth:`plugin_port` -- so they never take the shared node's (or mosquitto's)
        defaults. Call before :meth:`start`, or :meth:`restart` afterwards.
        """
        added = [p for p in plugins if p not in self._plugins]
        if not added:
            return
        with self._lock:
            if self.is_running:
                raise BrokerNodeError(
                    f"{self.name} is running: enable plugins before start(), or "
                    "stop(keep_data=True) first and start() again"
                )
            listeners = [p for p in (*self._plugins, *added) if p in _PLUGIN_LISTENERS]
            if len(listeners) > _EXTRA_PORTS:
                raise BrokerNodeError(f"at most {_EXTRA_PORTS} listener plugins per node")
            self._plugins.extend(added)
            if self._base is not None and self._lease is not None:
                self._write_config()

    def configure(self, settings: Mapping[str, str]) -> None:
        """Add or change ``rabbitmq.conf`` settings from the next start on.

        For settings that depend on facts known only after construction, such as the
        names of a cluster's other nodes. Call before :meth:`start`, or restart after.
        """
        with self._lock:
            self._config.update(settings)
            if self._base is not None and self._lease is not None:
                self._write_config()

    def start(self, timeout: float | None = None) -> None:
        """Launch the node and wait until it is ready (:meth:`wait_ready`).

        ``rabbitmq-server`` runs in the foreground of a session of its own rather than
        with ``-detached``: Ctrl-C in the terminal does not reach it, and its boot output
        (which ``-detached`` throws away, and which is the only place a boot failure
        such as a bad config key is explained) goes to ``launcher.out``.

        Keeps the data of an earlier run unless :meth:`stop` removed it. Raises
        :class:`BrokerNodeError` if it is already running, does not come up within
        ``timeout`` (then it is killed again), or exits during boot.
        """
        timeout = self._start_timeout if timeout is None else timeout
        with self._lock:
            scripts = self._require_scripts()
            if self.is_running:
                raise BrokerNodeError(f"{self.name} is already running")
            if self.short_name in epmd_names():
                raise BrokerNodeError(f"epmd already lists {self.short_name}")
            self._prepare_dir()
            with _LIVE_LOCK:
                _LIVE.add(self)
            self._alarms.clear()
            (self.base_dir / "pid").unlink(missing_ok=True)
            self._reap_launcher(0)
            command = [str(scripts / "rabbitmq-server")]
            if self._niceness and shutil.which("nice"):
                command = ["nice", "-n", str(self._niceness), *command]
            try:
                with (self.base_dir / "launcher.out").open("ab") as out:
                    self._launcher = subprocess.Popen(
                        command,
                        env=self._env(),
                        cwd=self.base_dir,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                self.wait_ready(timeout)
            except BaseException:
                # Not half-started: whatever was launched goes, the directory stays
                # (for the log) until stop() or the atexit hook removes it.
                self._force_kill()
                raise

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until AMQP answers on :attr:`port` and ``await_startup`` succeeds."""
        deadline = time.monotonic() + timeout
        while not self._amqp_answers():
            launcher = self._launcher
            if launcher is not None and launcher.poll() is not None:
                raise self._fail(f"the node exited during boot (status {launcher.returncode})")
            if time.monotonic() >= deadline:
                raise self._fail(f"AMQP did not answer on port {self.port} within {timeout} s")
            time.sleep(0.1)
        remaining = max(5.0, deadline - time.monotonic())
        self.ctl("await_startup", "--timeout", str(int(remaining)), timeout=remaining + 10)

    def _amqp_answers(self) -> bool:
        """Does the node's port answer an AMQP 0-9-1 header with connection.start?"""
        try:
            with socket.create_connection(("127.0.0.1", self.port), _PROBE_TIMEOUT) as sock:
                sock.settimeout(_PROBE_TIMEOUT)
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                head = b""
                while len(head) < 11 and (chunk := sock.recv(11 - len(head))):
                    head += chunk
        except OSError:
            return False
        return len(head) == 11 and head[0] == 1 and head[7:11] == b"\x00\x0a\x00\x0a"

    def stop(self, *, keep_data: bool = False, timeout: float = 30.0) -> None:
        """Stop the node; always leaves no process and no epmd name behind.

        Resumes a paused node, asks it to stop (``rabbitmqctl stop``), and if that fails
        or takes too long kills what is left (``SIGKILL`` by pid file and marker). Then
        waits until epmd has forgotten the name. Unless ``keep_data``, also deletes the
        node's directory and gives up its ports. Idempotent; safe on a killed node.

        Raises:
            BrokerNodeError: something could not be cleaned up (after trying everything).
        """
        with self._lock:
            problems: list[str] = []
            self._cancel_resume_timer()
            if self._pids():
                self._signal(signal.SIGCONT)
                self._paused = False
                try:
                    self.ctl("stop", timeout=max(5.0, timeout / 2))
                except BrokerNodeError as exc:
                    _log.warning("graceful stop of %s failed, killing it: %s", self.name, exc)
                if not self._wait_gone(max(5.0, timeout / 2)):
                    self._force_kill()
            self._reap_launcher(5.0)
            self._paused = False
            self._alarms.clear()
            if self._pids():
                problems.append(f"processes {self._pids()} survived SIGKILL")
            if not _wait_until(lambda: self.short_name not in epmd_names(), 5.0):
                problems.append(f"epmd still lists {self.short_name}")
            if not keep_data:
                if self._base is not None:
                    try:
                        shutil.rmtree(self._base)
                    except FileNotFoundError:
                        pass  # the watchdog got there first
                    except OSError as exc:
                        problems.append(f"could not remove {self._base}: {exc}")
                    else:
                        self._base = None
                if self._lease is not None:
                    self._lease.release()
                    self._lease = None
                with _LIVE_LOCK:
                    _LIVE.discard(self)
            if problems:
                raise BrokerNodeError(f"{self.name}: cleanup incomplete: {'; '.join(problems)}")

    def _force_kill(self) -> None:
        """SIGKILL the VM and the launcher's whole process group, and reap the launcher."""
        self._cancel_resume_timer()
        self._signal(signal.SIGKILL)
        launcher = self._launcher
        if launcher is not None and launcher.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, signal.SIGKILL)
        self._paused = False
        self._wait_gone(10.0)
        self._reap_launcher(5.0)

    def _reap_launcher(self, timeout: float) -> None:
        """Collect the exit status of the ``rabbitmq-server`` script once the VM is gone."""
        launcher, self._launcher = self._launcher, None
        if launcher is None:
            return
        try:
            launcher.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(5.0)

    def kill(self) -> None:
        """``kill -9`` the node's VM, as a crash would; data stays for :meth:`start`.

        Returns once the process is gone and epmd has dropped the name.
        """
        with self._lock:
            if not self._signal(signal.SIGKILL):
                raise BrokerNodeError(f"{self.name} is not running")
            self._cancel_resume_timer()
            self._paused = False
            self._alarms.clear()
            if not self._wait_gone(10.0):
                raise self._fail("still running (or registered with epmd) 10 s after SIGKILL")
            self._reap_launcher(5.0)

    def restart(self, timeout: float | None = None) -> None:
        """Stop gracefully (keeping data and ports) and start again."""
        self.stop(keep_data=True)
        self.start(timeout)

    def pause(self, max_seconds: float = 20.0) -> None:
        """Freeze the node with ``SIGSTOP``; a timer sends ``SIGCONT`` after ``max_seconds``.

        The timer is a safety net (a freeze beyond ``net_ticktime`` makes the other
        nodes declare a partition); call :meth:`resume` yourself, ideally in a ``finally``, or use
        :meth:`paused`.
        """
        with self._lock:
            if not self._signal(signal.SIGSTOP):
                raise BrokerNodeError(f"{self.name} is not running")
            self._paused = True
            self._cancel_resume_timer()
            timer = threading.Timer(max_seconds, self.resume)
            timer.daemon = True
            timer.start()
            self._resume_timer = timer

    def resume(self) -> None:
        """``SIGCONT`` a paused node (no-op when it is not paused)."""
        with self._lock:
            self._cancel_resume_timer()
            if self._paused:
                self._signal(signal.SIGCONT)
                self._paused = False

    @contextlib.contextmanager
    def paused(self, max_seconds: float = 20.0) -> Iterator[None]:
        """``with node.paused(): ...`` -- frozen inside the block, resumed on the way out."""
        self.pause(max_seconds)
        try:
            yield
        finally:
            self.resume()

    def _cancel_resume_timer(self) -> None:
        timer, self._resume_timer = self._resume_timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()

    # ------------------------------------------------------------------ CLI

    def ctl(self, *args: str, timeout: float = CLI_TIMEOUT) -> str:
        """Run ``rabbitmqctl -n <node> *args`` with the node's private HOME and env.

        Returns stdout. Each call boots an Erlang VM (about 1 s); prefer one
        :meth:`eval` to several calls. Hangs on a paused node until ``timeout``.

        Raises:
            BrokerNodeError: non-zero exit or timeout (with output and log tail).
        """
        return self._run_cli("rabbitmqctl", args, timeout)

    def _run_cli(self, script: str, args: Iterable[str], timeout: float) -> str:
        command = [str(self._require_scripts() / script), "-n", self.name, *args]
        try:
            done = subprocess.run(
                command,
                env=self._env(),
                cwd=self.base_dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise self._fail(f"{script} {' '.join(args)} timed out after {timeout} s") from None
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            raise self._fail(f"{script} {' '.join(args)} exited {done.returncode}: {output}")
        return done.stdout

    def eval(self, expr: str, timeout: float = CLI_TIMEOUT) -> str:
        """Evaluate Erlang ``expr`` on the node (``rabbitmqctl eval``); returns the result
        as the CLI prints it, e.g. ``eval("node().")`` → ``"'rabbitry-t1-1@localhost'"``."""
        expr = expr.strip()
        if not expr.endswith("."):
            expr += "."
        return self.ctl("eval", expr, timeout=timeout).strip()

    # ------------------------------------------------------------------ alarms

    def set_alarm(self, alarm: Alarm) -> None:
        """Raise a memory or disk resource alarm, independent of real usage (§4.6).

        Publishing connections get ``connection.blocked`` at their next publish. The
        broker tells each connection process about the alarm asynchronously, so this
        returns only once every open client connection knows it (state ``blocking`` or
        ``blocked``): a publish sent before that would pass unblocked.
        """
        self._check_alarm(alarm)
        self.eval(f"rabbit_alarm:set_alarm({{{{resource_limit, {alarm}, node()}}, []}})")
        self._alarms.add(alarm)
        self._wait_connections_know_the_alarm()

    def _wait_connections_know_the_alarm(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            out = self.ctl("list_connections", "state", "--formatter", "json", "--quiet")
            rows: list[dict[str, Any]] = json.loads(out) if out.strip() else []
            unaware = [row.get("state") for row in rows if row.get("state") in ("running", "flow")]
            if not unaware:
                return
            if time.monotonic() > deadline:
                raise self._fail(f"{len(unaware)} connection(s) still {unaware} after the alarm")
            time.sleep(0.05)

    def clear_alarm(self, alarm: Alarm) -> None:
        """Clear an alarm set by :meth:`set_alarm`; ``connection.unblocked`` follows once
        no alarm is left."""
        self._check_alarm(alarm)
        self.eval(f"rabbit_alarm:clear_alarm({{resource_limit, {alarm}, node()}})")
        self._alarms.discard(alarm)

    def clear_alarms(self) -> None:
        """Clear every alarm raised through :meth:`set_alarm` (one CLI call; none if
        there is nothing to clear)."""
        if not self._alarms or not self.is_running:
            self._alarms.clear()
            return
        calls = ",".join(
            f"rabbit_alarm:clear_alarm({{resource_limit, {a}, node()}})"
            for a in sorted(self._alarms)
        )
        self.eval(calls)
        self._alarms.clear()

    @property
    def alarms(self) -> set[Alarm]:
        """The alarms raised through :meth:`set_alarm` and not cleared yet."""
        return set(self._alarms)

    def active_alarms(self) -> set[str]:
        """The resource alarms the node reports right now (a CLI call)."""
        return set(re.findall(r"resource_limit,\s*(\w+)", self.eval("rabbit_alarm:get_alarms()")))

    @staticmethod
    def _check_alarm(alarm: str) -> None:
        if alarm not in get_args(Alarm):
            raise ValueError(f"alarm must be one of {get_args(Alarm)}, not {alarm!r}")

    # ------------------------------------------------------------------ connections

    def list_connections(self) -> list[dict[str, Any]]:
        """The node's client connections (``rabbitmqctl list_connections``): each a dict
        with ``pid``, ``name``, ``user`` and ``connection_name`` (None if not given)."""
        out = self.ctl(
            "list_connections",
            "pid",
            "name",
            "user",
            "client_properties",
            "--formatter",
            "json",
            "--quiet",
        )
        rows: list[dict[str, Any]] = json.loads(out) if out.strip() else []
        for row in rows:
            props = row.pop("client_properties", None) or []
            row["connection_name"] = next(
                (p[2] for p in props if isinstance(p, list) and p[:1] == ["connection_name"]),
                None,
            )
        return rows

    def close_connections(self, reason: str = "closed by the test") -> int:
        """Force-close every client connection (``CONNECTION_FORCED - reason``, 320).

        Returns how many were closed. One CLI call.
        """
        return int(
            self.eval(
                f"Why = {_erl_binary(reason)}, Ps = rabbit_networking:connections_local(), "
                "[rabbit_networking:close_connection(P, Why) || P <- Ps], length(Ps)"
            )
        )

    def close_connection_by_name(self, name: str, reason: str = "closed by the test") -> int:
        """Force-close the connections whose ``connection_name`` client property is
        ``name``; the client sees ``CONNECTION_FORCED - reason`` (320).

        Does what ``list_connections pid client_properties`` + ``close_connection <pid>``
        do, in one CLI call. Returns how many were closed.

        Raises:
            BrokerNodeError: no connection has that name.
        """
        closed = int(
            self.eval(
                f"Name = {_erl_binary(name)}, Why = {_erl_binary(reason)}, "
                "Named = fun(P) -> case catch rabbit_networking:connection_info(P, "
                "[client_properties]) of [{client_properties, Props}] -> "
                'lists:keyfind(<<"connection_name">>, 1, Props) =:= '
                '{<<"connection_name">>, longstr, Name}; _ -> false end end, '
                "Ps = [P || P <- rabbit_networking:connections_local(), Named(P)], "
                "[rabbit_networking:close_connection(P, Why) || P <- Ps], length(Ps)"
            )
        )
        if closed == 0:
            raise self._fail(f"no connection named {name!r} to close")
        return closed
