"""A throw-away 3-node RabbitMQ cluster on loopback, for the cluster tier (tests/cluster).

:class:`RabbitCluster` is three :class:`tests.support.node.BrokerNode` s that share one
private cookie and find each other with ``classic_config`` peer discovery
(the fastest way to form a cluster from scratch): every node's ``rabbitmq.conf`` lists all
three names before the first boot, all three are launched at once, and the cluster is
ready when every node's ``cluster_status`` shows three running nodes (about 20-25 s on a
busy 2-core machine). The shared node on 127.0.0.1:5672 is never touched: each member
has its own ports, data, logs and cookie, exactly as a single ``BrokerNode``.

Faults, by member index (0, 1, 2) or by node:

* :meth:`kill` -- ``kill -9`` (data kept); :meth:`start` brings it back and waits until
  it rejoined (about 5-7 s);
* :meth:`stop` -- graceful ``rabbitmqctl stop`` (data kept), then :meth:`start`;
* :meth:`pause` / :meth:`resume` / ``with cluster.paused(i, seconds)`` -- ``SIGSTOP`` /
  ``SIGCONT``, capped at 20 s (below ``net_ticktime``, or the cluster partitions for
  good, §4.8) and always resumed by a timer as well as by the ``finally`` of
  :meth:`paused`;
* :meth:`leader` -- the node that leads a quorum or stream queue (one ``eval``);
* :meth:`heal` -- after a test: resume paused members, start stopped ones, and wait for
  three running nodes again.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final

from tests.support.node import BrokerNode, BrokerNodeError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

__all__ = ["MAX_PAUSE", "RabbitCluster"]

#: The longest freeze allowed: well below the default ``net_ticktime`` of 60 s.
MAX_PAUSE: Final = 20.0


def _erl_binary(text: str) -> str:
    return "<<" + ",".join(str(b) for b in text.encode()) + ">>"


class RabbitCluster:
    """Three private RabbitMQ nodes clustered with ``classic_config`` peer discovery.

    Args:
        size: number of nodes (3 for quorum queues that survive one loss).
        plugins: plugins enabled on every node (e.g. ``rabbitmq_consistent_hash_exchange``).
        config: extra ``rabbitmq.conf`` settings for every node.
        start_timeout: seconds the formation may take.
    """

    def __init__(
        self,
        size: int = 3,
        *,
        plugins: Iterable[str] = (),
        config: Mapping[str, str] | None = None,
        start_timeout: float = 120.0,
    ) -> None:
        if size < 1:
            raise BrokerNodeError("size: a cluster needs at least one node")
        cookie = secrets.token_hex(20).upper()
        plugins = list(plugins)
        self.nodes: Final = [
            BrokerNode(plugins=plugins, config=config, cookie=cookie, start_timeout=start_timeout)
            for _ in range(size)
        ]
        discovery = {"cluster_formation.peer_discovery_backend": "classic_config"}
        for number, node in enumerate(self.nodes, 1):
            discovery[f"cluster_formation.classic_config.nodes.{number}"] = node.name
        for node in self.nodes:
            node.configure(discovery)
        self._start_timeout = start_timeout
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<RabbitCluster {[n.name for n in self.nodes]}>"

    def __enter__(self) -> RabbitCluster:
        self.start_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

    # ------------------------------------------------------------------ facts

    def node(self, which: int | BrokerNode) -> BrokerNode:
        return which if isinstance(which, BrokerNode) else self.nodes[which]

    def index(self, node: BrokerNode | str) -> int:
        """The member index of ``node`` (a BrokerNode or its ``name@host``)."""
        name = node.name if isinstance(node, BrokerNode) else node
        for i, member in enumerate(self.nodes):
            if member.name == name:
                return i
        raise BrokerNodeError(f"{name} is not a member of {self!r}")

    @property
    def urls(self) -> list[str]:
        """Every member's AMQP URL, in member order."""
        return [n.url for n in self.nodes]

    def urls_from(self, first: int | BrokerNode) -> list[str]:
        """Every URL, starting with ``first``'s (the node a client connects to first)."""
        start = self.index(self.node(first))
        return [self.nodes[(start + i) % len(self.nodes)].url for i in range(len(self.nodes))]

    def running(self) -> list[BrokerNode]:
        """Members whose VM runs and is not frozen."""
        return [n for n in self.nodes if n.is_running and not n.is_paused]

    def any_running(self, *, besides: Iterable[int | BrokerNode] = ()) -> BrokerNode:
        excluded = {self.node(b).name for b in besides}
        for node in self.running():
            if node.name not in excluded:
                return node
        raise BrokerNodeError("no running member to ask")

    def running_nodes(self, via: int | BrokerNode | None = None) -> set[str]:
        """The names the cluster reports as running (``rabbit_mnesia:cluster_nodes(running)``)."""
        node = self.node(via) if via is not None else self.any_running()
        return set(re.findall(r"'([^']+)'", node.eval("rabbit_mnesia:cluster_nodes(running).")))

    def partitions(self, via: int | BrokerNode | None = None) -> str:
        """``rabbit_node_monitor:partitions()`` as printed; ``[]`` when healthy."""
        node = self.node(via) if via is not None else self.any_running()
        return node.eval("rabbit_node_monitor:partitions().")

    def leader(self, queue: str, vhost: str = "/") -> BrokerNode:
        """The member leading the quorum (or stream) queue ``queue``.

        Asks a running member for the queue record's leader (one ``eval``). Retries for a
        few seconds while an election is in progress.
        """
        expr = (
            f"case rabbit_amqqueue:lookup(rabbit_misc:r({_erl_binary(vhost)}, queue, "
            f"{_erl_binary(queue)})) of {{ok, Q}} -> case amqqueue:get_pid(Q) of "
            "{_, N} when is_atom(N) -> N; P when is_pid(P) -> node(P); _ -> none end; "
            "_ -> none end."
        )
        deadline = time.monotonic() + 15
        while True:
            answer = self.any_running().eval(expr).strip().strip("'")
            with contextlib.suppress(BrokerNodeError):
                node = self.nodes[self.index(answer)]
                if node.is_running and not node.is_paused:
                    return node
            if time.monotonic() >= deadline:
                raise BrokerNodeError(f"no live leader for queue {queue!r} (got {answer})")
            time.sleep(0.2)

    def move_leader(self, queue: str, to: int | BrokerNode, vhost: str = "/") -> None:
        """Make ``to`` the leader of quorum queue ``queue`` (``ra:transfer_leadership``)
        and wait until the queue record says so."""
        target = self.node(to)
        if self.leader(queue, vhost).name == target.name:
            return
        expr = (
            f"{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r({_erl_binary(vhost)}, queue, "
            f"{_erl_binary(queue)})), {{RaName, Leader}} = amqqueue:get_pid(Q), "
            f"ra:transfer_leadership({{RaName, Leader}}, {{RaName, '{target.name}'}})."
        )
        deadline = time.monotonic() + 20
        while True:
            self.any_running().eval(expr)
            until = time.monotonic() + 3
            while time.monotonic() < until:
                if self.leader(queue, vhost).name == target.name:
                    return
                time.sleep(0.2)
            if time.monotonic() >= deadline:
                raise BrokerNodeError(f"leadership of {queue!r} did not move to {target.name}")

    # ------------------------------------------------------------------ lifecycle

    def start_all(self) -> None:
        """Launch every member at once and wait until all of them see the whole cluster."""
        try:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                for future in [pool.submit(n.start) for n in self.nodes]:
                    future.result()
            self.wait_formed(self._start_timeout)
        except BaseException:
            self.stop_all()
            raise

    def wait_formed(self, timeout: float = 60.0) -> None:
        """Wait until every member runs and reports every member as running.

        One ``eval`` per check: a running member asks all members (``rpc``) for their
        view of the running nodes.
        """
        wanted = sorted(n.name for n in self.nodes)
        names = ",".join(f"'{n}'" for n in wanted)
        expr = (
            "lists:all(fun(N) -> case rpc:call(N, rabbit_mnesia, cluster_nodes, [running], "
            f"5000) of L when is_list(L) -> lists:sort(L) =:= lists:sort([{names}]); "
            f"_ -> false end end, [{names}])."
        )
        deadline = time.monotonic() + timeout
        while True:
            if len(self.running()) == len(self.nodes):
                with contextlib.suppress(BrokerNodeError):
                    if self.any_running().eval(expr) == "true":
                        return
            if time.monotonic() >= deadline:
                seen: set[str] | str
                try:
                    seen = self.running_nodes()
                except BrokerNodeError as exc:
                    seen = str(exc)
                raise BrokerNodeError(f"cluster did not form within {timeout} s: running {seen}")
            time.sleep(0.5)

    def stop_all(self) -> None:
        """Stop and delete every member (in parallel); raises the first cleanup error."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            futures = [pool.submit(n.stop) for n in self.nodes]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise BrokerNodeError(f"cluster cleanup failed: {errors}")

    def kill(self, which: int | BrokerNode) -> BrokerNode:
        """``kill -9`` a member; its data stays for :meth:`start`."""
        node = self.node(which)
        node.kill()
        return node

    def stop(self, which: int | BrokerNode) -> BrokerNode:
        """Stop a member gracefully, keeping its data and ports."""
        node = self.node(which)
        node.stop(keep_data=True)
        return node

    def start(self, which: int | BrokerNode, timeout: float = 60.0) -> BrokerNode:
        """Start a stopped or killed member and wait until it is back in the cluster."""
        node = self.node(which)
        node.start(timeout)
        self.wait_formed(timeout)
        return node

    def pause(self, which: int | BrokerNode, seconds: float = 10.0) -> BrokerNode:
        """``SIGSTOP`` a member; a timer resumes it after ``seconds`` (at most 20)."""
        if not 0 < seconds <= MAX_PAUSE:
            raise BrokerNodeError(f"seconds: a freeze must last 0-{MAX_PAUSE} s, not {seconds}")
        node = self.node(which)
        node.pause(max_seconds=seconds)
        return node

    def resume(self, which: int | BrokerNode) -> None:
        self.node(which).resume()

    @contextlib.contextmanager
    def paused(self, which: int | BrokerNode, seconds: float = 10.0) -> Iterator[BrokerNode]:
        """``with cluster.paused(i, 10):`` frozen inside, resumed in a ``finally``."""
        node = self.pause(which, seconds)
        try:
            yield node
        finally:
            node.resume()

    def heal(self, timeout: float = 90.0) -> None:
        """Resume frozen members, start stopped ones, wait for the full cluster."""
        with self._lock:
            for node in self.nodes:
                node.resume()
            down = [n for n in self.nodes if not n.is_running]
            if down:
                with ThreadPoolExecutor(len(down)) as pool:
                    for future in [pool.submit(n.start, timeout) for n in down]:
                        future.result()
            self.wait_formed(timeout)
