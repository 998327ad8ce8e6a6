"""Publishing through the management API (``ManagementClient.publish``, ``rabbitry publish
--via http``) against the node with the management plugin."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

import rabbitry
from rabbitry.cli._app import cli
from rabbitry.exceptions import LocalProtocolError, ManagementNotFound
from rabbitry.protocol.spec import BasicProperties

if TYPE_CHECKING:
    from tests.support.node import BrokerNode

    from rabbitry.management import AsyncManagementClient, ManagementClient


def _get(channel: rabbitry.Channel, queue: str, timeout: float = 10.0) -> rabbitry.Message:
    deadline = time.monotonic() + timeout
    while True:
        message = channel.basic_get(queue, no_ack=True)
        if message is not None:
            return message
        if time.monotonic() > deadline:
            raise AssertionError(f"no message arrived in {queue}")
        time.sleep(0.05)


def test_publish_routes_bytes_and_properties_to_the_queue(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    body = bytes(range(256))  # not UTF-8: only base64 carries it unchanged
    properties = BasicProperties(
        content_type="application/octet-stream",
        headers={"n": 7, "s": "x", "flag": True, "ratio": 0.5, "list": [1, "a"], "t": {"k": 1}},
        correlation_id="c-1",
        message_id="m-1",
        priority=4,
        timestamp=1_700_000_000,
    )
    with rabbitry.Connection(mgmt_node.url) as conn:
        channel = conn.channel()
        channel.queue_declare(f"{uid}.q", durable=False)
        channel.exchange_declare(f"{uid}.x", "direct", durable=False)
        channel.queue_bind(f"{uid}.q", f"{uid}.x", "k")
        try:
            routed = api.publish(
                f"{uid}.x", "k", body, properties=properties, persistent=True, expiration=60_000
            )
            assert routed is True
            message = _get(channel, f"{uid}.q")
            assert message.body == body
            got = message.properties
            assert got.headers == properties.headers
            assert (got.content_type, got.correlation_id, got.message_id, got.priority) == (
                "application/octet-stream",
                "c-1",
                "m-1",
                4,
            )
            assert got.delivery_mode == 2 and got.expiration == "60000"
            assert got.timestamp is not None and got.timestamp.timestamp() == 1_700_000_000
            # A str body goes as text; the default exchange is "" as over AMQP.
            assert api.publish("", f"{uid}.q", "héllo") is True
            assert _get(channel, f"{uid}.q").body == "héllo".encode()
        finally:
            channel.queue_delete(f"{uid}.q")
            channel.exchange_delete(f"{uid}.x")


def test_publish_to_no_queue_answers_not_routed(api: ManagementClient, uid: str) -> None:
    assert api.publish("", f"{uid}.nowhere", b"x") is False
    assert api.publish("amq.topic", f"{uid}.nobody.listens", b"x") is False


def test_per_message_ttl_from_the_api_expires_the_message(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    with rabbitry.Connection(mgmt_node.url) as conn:
        channel = conn.channel()
        channel.queue_declare(f"{uid}.q", durable=False)
        try:
            assert api.publish("", f"{uid}.q", b"short", expiration=timedelta(milliseconds=1))
            assert api.publish("", f"{uid}.q", b"kept", expiration=600_000)
            # The expired one is dropped when it reaches the head; the kept one remains.
            message = _get(channel, f"{uid}.q")
            assert (message.body, message.properties.expiration) == (b"kept", "600000")
            assert channel.basic_get(f"{uid}.q") is None
        finally:
            channel.queue_delete(f"{uid}.q")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"expiration": -1}, "expiration"),
        ({"expiration": 1.5}, "expiration"),
        ({"expiration": 2**32}, "expiration"),
        ({"properties": BasicProperties(expiration="10s")}, "basic.properties.expiration"),
        ({"properties": BasicProperties(delivery_mode=3)}, "basic.properties.delivery_mode"),
        ({"properties": BasicProperties(priority=256)}, "basic.properties.priority"),
        ({"properties": BasicProperties(message_id="x" * 256)}, "basic.properties.message_id"),
        ({"properties": BasicProperties(headers={"b": b"raw"})}, "basic.properties.headers['b']"),
        ({"properties": BasicProperties(headers={"n": None})}, "basic.properties.headers['n']"),
        ({"properties": {"content_type": "text/plain"}}, "basic.properties"),
        ({"persistent": "yes"}, "persistent"),
    ],
)
def test_publish_refuses_bad_properties_before_any_request(
    api: ManagementClient, mgmt_node: BrokerNode, uid: str, kwargs: dict[str, object], field: str
) -> None:
    with rabbitry.Connection(mgmt_node.url) as conn:
        channel = conn.channel()
        channel.queue_declare(f"{uid}.q", durable=False)
        try:
            with pytest.raises(LocalProtocolError) as info:
                api.publish("", f"{uid}.q", b"x", **kwargs)  # type: ignore[arg-type]
            assert str(info.value).startswith(field)
            assert channel.queue_declare(f"{uid}.q", passive=True).message_count == 0
        finally:
            channel.queue_delete(f"{uid}.q")


def test_publish_refuses_a_body_that_is_not_bytes_or_str(api: ManagementClient) -> None:
    with pytest.raises(LocalProtocolError, match=r"^basic\.publish\.body: must be bytes"):
        api.publish("", "q", 42)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match=r"^basic\.publish\.routing_key: shortstr"):
        api.publish("", "k" * 256, b"x")


async def test_async_publish_routes_and_reports(
    aapi: AsyncManagementClient, mgmt_node: BrokerNode, uid: str
) -> None:
    async with rabbitry.AsyncConnection(mgmt_node.url) as conn:
        channel = await conn.channel()
        await channel.queue_declare(f"{uid}.q", durable=False)
        try:
            assert await aapi.publish("", f"{uid}.q", b"a", persistent=False) is True
            assert await aapi.publish("", f"{uid}.none", b"a") is False
            with pytest.raises(LocalProtocolError, match=r"^expiration"):
                await aapi.publish("", f"{uid}.q", b"a", expiration=-5)
            for _ in range(200):
                message = await channel.basic_get(f"{uid}.q", no_ack=True)
                if message is not None:
                    break
                await asyncio.sleep(0.05)
            assert message is not None
            assert (message.body, message.properties.delivery_mode) == (b"a", 1)
        finally:
            await channel.queue_delete(f"{uid}.q")


def test_cli_publish_via_http(mgmt_node: BrokerNode, mgmt_url: str, uid: str) -> None:
    with rabbitry.Connection(mgmt_node.url) as conn:
        channel = conn.channel()
        channel.queue_declare(f"{uid}.q", durable=False)
        try:
            runner = CliRunner()
            args = ["--url", mgmt_node.url, "--json", "publish", "--via", "http"]
            args += ["--management-url", mgmt_url, "-k", f"{uid}.q", "--expiration", "60000"]
            result = runner.invoke(cli, [*args, "-H", "h=v", "one", "two"])
            assert result.exit_code == 0, result.output
            assert json.loads(result.stdout)["acked"] == 2
            first = _get(channel, f"{uid}.q")
            assert (first.body, first.properties.expiration) == (b"one", "60000")
            assert first.properties.headers == {"h": "v"}
            assert _get(channel, f"{uid}.q").body == b"two"
            # A message no queue gets is a failure with --mandatory (the default): exit 1.
            args[-3] = f"{uid}.nowhere"
            result = runner.invoke(cli, [*args, "lost"])
            assert result.exit_code == 1
            assert "unroutable" in result.output or "not confirmed" in result.output
        finally:
            channel.queue_delete(f"{uid}.q")


def test_publish_to_a_missing_exchange_raises_management_not_found(
    api: ManagementClient, uid: str
) -> None:
    with pytest.raises(ManagementNotFound) as caught:
        api.publish(f"{uid}.missing", "k", b"x")
    # The API answers 400 and passes the broker's 404 on in its reason.
    assert caught.value.status == 400
    assert f"404 NOT_FOUND - no exchange '{uid}.missing'" in caught.value.reason
    assert f"{uid}.missing" in caught.value.path


async def test_async_publish_to_a_missing_exchange_raises_management_not_found(
    aapi: AsyncManagementClient, uid: str
) -> None:
    with pytest.raises(ManagementNotFound):
        await aapi.publish(f"{uid}.missing", "k", "x")
