"""Policies in the topology model, applied through the management API, with their
effect on queues checked over AMQP on the same node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry.exceptions import TopologyError
from rabbitry.topology import Binding, Exchange, Policy, Queue, Topology

if TYPE_CHECKING:
    from pathlib import Path

    from tests.support.node import BrokerNode

    from rabbitry.management import ManagementClient


def _depth(channel: rabbitry.Channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).message_count


def _wait_depth(channel: rabbitry.Channel, queue: str, wanted: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (depth := _depth(channel, queue)) != wanted:
        if time.monotonic() > deadline:
            raise AssertionError(f"{queue}: depth {depth}, wanted {wanted}")
        time.sleep(0.05)


def _publish(channel: rabbitry.Channel, queue: str, n: int, exchange: str = "") -> None:
    """Publish ``n`` messages on a confirm-mode channel and wait for the confirms."""
    futures = [channel.basic_publish(exchange, queue, b"m%d" % i) for i in range(n)]
    for future in futures:
        assert future is not None
        future.result(timeout=10)


def _wait_policy_applied(api: ManagementClient, queue: str, policy: str) -> None:
    deadline = time.monotonic() + 10
    while api.queue(queue).policy != policy:
        if time.monotonic() > deadline:
            raise AssertionError(f"policy {policy!r} never applied to {queue!r}")
        time.sleep(0.05)


def test_policy_message_ttl_expires_messages_of_matching_queues(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    topology = Topology(
        queues=[Queue(f"{uid}.short", durable=False), Queue(f"{uid}-other", durable=False)],
        policies=[
            Policy(f"{uid}-ttl", f"^{uid}\\.", apply_to="queues", definition={"message-ttl": 200})
        ],
    )
    with rabbitry.Connection(mgmt_node.url) as conn:
        topology.apply(conn, management=api)
        try:
            assert topology.verify(conn, management=api).ok
            # Policies are set before the queues are declared: in force from the start.
            channel = conn.channel()
            channel.confirm_select()
            _publish(channel, f"{uid}.short", 5)
            _publish(channel, f"{uid}-other", 5)
            assert _depth(channel, f"{uid}.short") == 5
            _wait_depth(channel, f"{uid}.short", 0)  # expired by the policy's TTL
            assert _depth(channel, f"{uid}-other") == 5  # not matched: kept
            _wait_policy_applied(api, f"{uid}.short", f"{uid}-ttl")  # the API shows it
        finally:
            topology.delete(conn, management=api)
    assert f"{uid}-ttl" not in {p.name for p in api.policies("/")}


def test_policy_dead_letter_exchange_routes_rejected_messages(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    topology = Topology(
        exchanges=[Exchange(f"{uid}.dlx", "fanout", durable=False)],
        queues=[Queue(f"{uid}.work", durable=False), Queue(f"{uid}.dead", durable=False)],
        bindings=[Binding(f"{uid}.dlx", f"{uid}.dead")],
        policies=[
            Policy(
                f"{uid}-dlx",
                f"^{uid}\\.work$",
                apply_to="queues",
                definition={"dead-letter-exchange": f"{uid}.dlx"},
            )
        ],
    )
    with rabbitry.Connection(mgmt_node.url) as conn:
        topology.apply(conn, management=api)
        try:
            channel = conn.channel()
            channel.confirm_select()
            _publish(channel, f"{uid}.work", 3)
            for _ in range(3):
                message = channel.basic_get(f"{uid}.work")
                assert message is not None
                message.nack(requeue=False)
            _wait_depth(channel, f"{uid}.dead", 3)
            dead = channel.basic_get(f"{uid}.dead", no_ack=True)
            assert dead is not None
            assert dead.headers["x-death"][0]["reason"] == "rejected"
        finally:
            topology.delete(conn, management=api)


def test_apply_with_policies_needs_a_management_client(mgmt_node: BrokerNode, uid: str) -> None:
    topology = Topology(
        queues=[Queue(f"{uid}.q", durable=False)],
        policies=[Policy(f"{uid}-p", "^never$", definition={"max-length": 1})],
    )
    with rabbitry.Connection(mgmt_node.url) as conn:
        with pytest.raises(TopologyError, match="management=ManagementClient"):
            topology.apply(conn)
        # Raised before anything was declared.
        with pytest.raises(rabbitry.NotFound):
            conn.channel().queue_declare(f"{uid}.q", passive=True)
        with pytest.raises(TopologyError, match="management"):
            topology.delete(conn)


def test_verify_reports_missing_and_different_policies(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    wanted = Policy(f"{uid}-p", f"^{uid}", apply_to="queues", definition={"max-length": 10})
    topology = Topology(policies=[wanted])
    with rabbitry.Connection(mgmt_node.url) as conn:
        report = topology.verify(conn, management=api)
        assert not report.ok and report.missing == (wanted,)
        without = topology.verify(conn)
        assert without.ok and without.unchecked == (wanted,)
        api.set_policy(f"{uid}-p", f"^{uid}", {"max-length": 20}, apply_to="queues")
        try:
            report = topology.verify(conn, management=api)
            assert not report.ok
            assert report.policy_differences == (
                f"policy '{uid}-p': max-length: ours 10, theirs 20",
            )
            topology.apply(conn, management=api)
            assert topology.verify(conn, management=api).ok
        finally:
            api.delete_policy(f"{uid}-p")


async def test_async_apply_and_precedence_matches_the_broker(
    aapi: object, mgmt_node: BrokerNode, uid: str
) -> None:
    """The rule diff states is the broker's: for message-ttl the lower value applies
    (here the policy's), for dead-letter-exchange the queue argument wins."""
    from rabbitry.management import AsyncManagementClient

    assert isinstance(aapi, AsyncManagementClient)
    work = Queue(
        f"{uid}.work",
        durable=False,
        message_ttl=60_000,
        dead_letter_exchange=f"{uid}.by-argument",
    )
    topology = Topology(
        exchanges=[
            Exchange(f"{uid}.by-argument", "fanout", durable=False),
            Exchange(f"{uid}.by-policy", "fanout", durable=False),
        ],
        queues=[
            work,
            Queue(f"{uid}.arg-dead", durable=False),
            Queue(f"{uid}.policy-dead", durable=False),
        ],
        bindings=[
            Binding(f"{uid}.by-argument", f"{uid}.arg-dead"),
            Binding(f"{uid}.by-policy", f"{uid}.policy-dead"),
        ],
        policies=[
            Policy(
                f"{uid}-p",
                f"^{uid}\\.work$",
                apply_to="queues",
                definition={"message-ttl": 300, "dead-letter-exchange": f"{uid}.by-policy"},
            )
        ],
    )
    overlaps = {o.key: o for o in topology.policy_overlaps()}
    assert overlaps["message-ttl"].effective == 300
    assert overlaps["message-ttl"].winner == "policy"
    assert overlaps["dead-letter-exchange"].effective == f"{uid}.by-argument"
    assert overlaps["dead-letter-exchange"].winner == "argument"
    conn = rabbitry.AsyncConnection(mgmt_node.url)
    await conn.connect()
    try:
        await topology.aapply(conn, management=aapi)
        try:
            # diff against the broker's export names both overlaps and the winner.
            lines = topology.diff(await aapi.definitions("/"), extra=False)
            assert (
                f"queue '{uid}.work': message-ttl: policy '{uid}-p' sets 300, argument "
                "x-message-ttl 60000: 300 applies (the lower value wins)"
            ) in lines
            assert any("dead-letter-exchange" in line and "the queue argument wins" in line
                       for line in lines)  # fmt: skip
            channel = await conn.channel()
            await channel.confirm_select()
            for i in range(4):
                fut = await channel.basic_publish("", f"{uid}.work", b"%d" % i)
                assert fut is not None
                await fut
            # TTL 300 ms from the policy (not 60 s): they expire, and dead-letter
            # through the argument's exchange, not the policy's.
            for _ in range(200):
                arg = await channel.queue_declare(f"{uid}.arg-dead", passive=True)
                if arg.message_count == 4:
                    break
                await _sleep(0.05)
            assert arg.message_count == 4
            pol = await channel.queue_declare(f"{uid}.policy-dead", passive=True)
            assert pol.message_count == 0
        finally:
            await topology.adelete(conn, management=aapi)
    finally:
        await conn.close()


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def test_definitions_export_import_into_a_fresh_vhost(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    source, target = f"{uid}-a", f"{uid}-b"
    topology = Topology(
        exchanges=[Exchange("events", "topic"), Exchange("dlx", "fanout")],
        queues=[
            Queue("jobs", message_ttl=5000, dead_letter_exchange="dlx"),
            Queue("jobs.dead", queue_type="quorum"),
            Queue("audit", max_length=100, overflow="reject-publish"),
        ],
        bindings=[
            Binding("events", "jobs", "job.*"),
            Binding("dlx", "jobs.dead"),
            Binding("events", "audit", "#"),
        ],
        policies=[
            Policy("limits", "^audit$", apply_to="queues", definition={"max-length-bytes": 10**6}),
        ],
    )
    for vhost in (source, target):
        api.create_vhost(vhost)
        api.set_permissions(vhost, "guest")
    try:
        with rabbitry.Connection(f"{mgmt_node.url.rstrip('/')}/{source}") as conn:
            topology.apply(conn, management=api)
        exported = api.definitions(source)
        assert topology.diff(exported, vhost=source) == []
        assert len(Topology.from_definitions(exported, vhost=source)) == len(topology)
        api.import_definitions(exported, vhost=target)
        assert topology.diff(api.definitions(target), vhost=target) == []
        # The imported entities work over AMQP in the fresh vhost.
        with rabbitry.Connection(f"{mgmt_node.url.rstrip('/')}/{target}") as conn:
            assert topology.verify(conn, management=api).ok
            channel = conn.channel()
            channel.confirm_select()
            _publish(channel, "job.1", 1, exchange="events")
            assert channel.queue_declare("jobs", passive=True).message_count == 1
            assert channel.queue_declare("audit", passive=True).message_count == 1
    finally:
        api.delete_vhost(source)
        api.delete_vhost(target)


def test_cli_topology_apply_verify_diff_with_policies(
    api: ManagementClient, mgmt_node: BrokerNode, mgmt_url: str, uid: str, tmp_path: Path
) -> None:
    document = {
        "queues": [{"name": f"{uid}.jobs", "durable": False, "message_ttl": 60000}],
        "policies": [
            {"name": f"{uid}-p", "pattern": f"^{uid}\\.", "apply_to": "queues",
             "definition": {"message-ttl": 1000, "max-length": 100}}
        ],
    }  # fmt: skip
    file = tmp_path / "topology.json"
    file.write_text(json.dumps(document))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "rabbitry", "--url", mgmt_node.url, *args],
            capture_output=True, text=True, timeout=60, env=os.environ.copy(),
        )  # fmt: skip

    try:
        refused = run("topology", "apply", str(file), "--management-url", "http://127.0.0.1:9")
        assert refused.returncode == 1 and "ManagementError" in refused.stderr
        applied = run("topology", "apply", str(file), "--management-url", mgmt_url)
        assert applied.returncode == 0, applied.stderr
        assert api.policy(f"{uid}-p").definition == {"message-ttl": 1000, "max-length": 100}
        verified = run("--json", "topology", "verify", str(file), "--management-url", mgmt_url)
        assert verified.returncode == 0, verified.stderr
        assert json.loads(verified.stdout)["ok"] is True
        diff = run("topology", "diff", str(file), "--management-url", mgmt_url)
        assert diff.returncode == 1  # the overlap is reported as a difference
        assert (
            f"queue '{uid}.jobs': message-ttl: policy '{uid}-p' sets 1000, argument "
            "x-message-ttl 60000: 1000 applies (the lower value wins)"
        ) in diff.stdout
        as_json = run("--json", "topology", "diff", str(file), "--management-url", mgmt_url)
        assert json.loads(as_json.stdout)["policy_overlaps"] == [
            f"queue '{uid}.jobs': message-ttl: policy '{uid}-p' sets 1000, argument "
            "x-message-ttl 60000: 1000 applies (the lower value wins)"
        ]
        api.set_policy(f"{uid}-p", f"^{uid}\\.", {"message-ttl": 5}, apply_to="queues")
        drifted = run("topology", "verify", str(file), "--management-url", mgmt_url)
        assert drifted.returncode == 1
        assert "max-length: ours 100, theirs (not set)" in drifted.stderr
    finally:
        api.delete_policy(f"{uid}-p")
        with rabbitry.Connection(mgmt_node.url) as conn:
            conn.channel().queue_delete(f"{uid}.jobs")
