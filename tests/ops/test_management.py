"""ManagementClient / AsyncManagementClient against a real node with the plugin."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry.exceptions import ManagementError, ManagementNotFound
from rabbitry.management import AsyncManagementClient, ManagementClient, QueueInfo
from rabbitry.protocol.spec import BasicProperties

if TYPE_CHECKING:
    from tests.support.node import BrokerNode


def _wait(predicate, timeout: float = 10.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_overview_vhosts_and_listing(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    overview = api.overview()
    assert overview["rabbitmq_version"].startswith("3.")
    assert "/" in {v["name"] for v in api.vhosts()}
    with rabbitry.Connection(mgmt_node.url, connection_name=uid) as conn:
        channel = conn.channel()
        channel.exchange_declare(f"{uid}.x", "topic", durable=False)
        channel.queue_declare(f"{uid}.q", durable=False)
        channel.queue_bind(f"{uid}.q", f"{uid}.x", "a.*")
        channel.queue_declare(f"{uid}.q2", durable=False, auto_delete=True)
        channel.basic_consume(f"{uid}.q2", lambda m: None)
        channel.confirm_select()
        for i in range(3):
            channel.basic_publish("", f"{uid}.q", b"m%d" % i)
        assert {f"{uid}.q", f"{uid}.q2"} <= {q.name for q in api.queues("/")}
        assert f"{uid}.x" in {x["name"] for x in api.exchanges("/")}
        assert api.exchange(f"{uid}.x")["type"] == "topic"
        binding = [b for b in api.bindings("/") if b["source"] == f"{uid}.x"]
        assert [(b["destination"], b["routing_key"]) for b in binding] == [(f"{uid}.q", "a.*")]
        # Depth and consumers (statistics refresh every 500 ms on this node).
        info = _wait(lambda: (q := api.queue(f"{uid}.q")).messages == 3 and q, what="depth 3")
        assert isinstance(info, QueueInfo)
        assert (info.messages_ready, info.messages_unacknowledged, info.consumers) == (3, 0, 0)
        assert info.vhost == "/" and info.type == "classic" and info.durable is False
        assert _wait(lambda: api.queue(f"{uid}.q2").consumers == 1, what="a consumer")
        names = [
            c for c in api.connections()
            if (c.get("client_properties") or {}).get("connection_name") == uid
        ]  # fmt: skip
        assert len(names) == 1
        api.purge_queue(f"{uid}.q")
        assert channel.queue_declare(f"{uid}.q", passive=True).message_count == 0
        api.delete_queue(f"{uid}.q")
        with pytest.raises(ManagementNotFound):
            api.queue(f"{uid}.q")
        channel.exchange_delete(f"{uid}.x")


def test_close_connection_by_name_and_the_client_recovers(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    with rabbitry.Connection(mgmt_node.url, connection_name=uid) as conn:
        channel = conn.channel()
        channel.queue_declare(f"{uid}.q", durable=False)
        entry = _wait(
            lambda: next(
                (
                    c for c in api.connections()
                    if (c.get("client_properties") or {}).get("connection_name") == uid
                ),
                None,
            ),
            what="the connection in the API",
        )  # fmt: skip
        api.close_connection(entry["name"], reason="ops test")
        # Recovery (on by default) reconnects; the channel works again.
        deadline = time.monotonic() + 20
        while True:
            try:
                conn.wait_recovered(timeout=20)
                assert channel.queue_declare(f"{uid}.q", passive=True).message_count == 0
                break
            except rabbitry.AMQPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        channel.queue_delete(f"{uid}.q")
    with pytest.raises(ManagementNotFound):
        api.close_connection("no such connection")


def test_errors_are_typed(mgmt_url: str, api: ManagementClient) -> None:
    with pytest.raises(ManagementNotFound) as caught:
        api.queue("does-not-exist", "/")
    assert caught.value.status == 404
    assert caught.value.path == "/queues/%2F/does-not-exist"
    with ManagementClient(mgmt_url, "guest", "wrong-secret") as bad:
        with pytest.raises(ManagementError) as refused:
            bad.overview()
        assert refused.value.status == 401
        assert "wrong-secret" not in str(refused.value)
        assert "wrong-secret" not in repr(bad)
    # A policy key RabbitMQ 3.10 does not know the apply-to of: the API's reason comes back.
    with pytest.raises(ManagementError) as invalid:
        api.set_policy("bad-apply", "^x$", {"message-ttl": 1}, apply_to="streams")
    assert invalid.value.status == 400
    assert invalid.value.reason
    with ManagementClient("http://127.0.0.1:9", timeout=1) as nobody:
        with pytest.raises(ManagementError) as unreachable:
            nobody.overview()
        assert unreachable.value.status is None


def test_policies_crud(api: ManagementClient, uid: str) -> None:
    policy = api.set_policy(
        uid, f"^{uid}\\.", {"message-ttl": 60000, "max-length": 10}, apply_to="queues", priority=3
    )
    try:
        assert api.policy(uid) == policy
        assert uid in {p.name for p in api.policies("/")}
        assert uid in {p.name for p in api.policies()}
    finally:
        api.delete_policy(uid)
    with pytest.raises(ManagementNotFound):
        api.policy(uid)


def test_vhost_and_permissions(api: ManagementClient, mgmt_node: BrokerNode, uid: str) -> None:
    api.create_vhost(uid)
    try:
        api.set_permissions(uid, "guest")
        with rabbitry.Connection(mgmt_node.url.rstrip("/") + "/" + uid) as conn:
            conn.channel().queue_declare("in-vhost", durable=False)
        assert [q.name for q in api.queues(uid)] == ["in-vhost"]
    finally:
        api.delete_vhost(uid)
    assert uid not in {v["name"] for v in api.vhosts()}


async def test_async_client_has_the_same_operations(
    aapi: AsyncManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    assert (await aapi.overview())["rabbitmq_version"]
    conn = rabbitry.AsyncConnection(mgmt_node.url)
    await conn.connect()
    try:
        channel = await conn.channel()
        await channel.queue_declare(f"{uid}.q", durable=False)
        await channel.confirm_select()
        fut = await channel.basic_publish(
            "", f"{uid}.q", b"x", properties=BasicProperties(message_id="1")
        )
        assert fut is not None
        await fut
        for _ in range(100):
            if (await aapi.queue(f"{uid}.q")).messages == 1:
                break
            await asyncio.sleep(0.1)
        assert (await aapi.queue(f"{uid}.q")).messages == 1
        await aapi.set_policy(uid, f"^{uid}\\.", {"max-length": 5}, apply_to="queues")
        assert (await aapi.policy(uid)).definition == {"max-length": 5}
        await aapi.delete_policy(uid)
        exported = await aapi.definitions("/")
        assert f"{uid}.q" in {q["name"] for q in exported["queues"]}
        await aapi.delete_queue(f"{uid}.q")
        with pytest.raises(ManagementNotFound):
            await aapi.queue(f"{uid}.q")
    finally:
        await conn.close()
