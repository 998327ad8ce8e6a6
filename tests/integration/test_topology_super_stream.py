"""Super streams over AMQP 0-9-1 on the real broker: declared, verified, routed by the
stream clients' hash, diffed against the broker's definitions and deleted.

Nothing here needs the ``rabbitmq_stream`` plugin: the exchange, the stream queues and the
bindings are plain AMQP 0-9-1 entities."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest
from tests.support.broker_ctl import rabbitmqctl

from rabbitry.topology import SuperStream, Topology, partition_for, super_stream

if TYPE_CHECKING:
    from tests.integration.conftest import Names

    import rabbitry
    from rabbitry.message import Message

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WAIT = 10.0


def _track(names: Names, topology: Topology) -> Topology:
    for exchange in topology.exchanges:
        names.track_exchange(exchange.name)
    for queue in topology.queues:
        names.track_queue(queue.name)
    return topology


async def _read(conn: rabbitry.AsyncConnection, queue: str, count: int) -> list[Message]:
    """The first ``count`` messages of stream ``queue``."""
    got: list[Message] = []
    enough = asyncio.Event()

    async def handler(message: Message) -> None:
        got.append(message)
        if len(got) >= count:
            enough.set()

    consumer = conn.consumer(queue, handler, prefetch=100, arguments={"x-stream-offset": "first"})
    async with consumer:
        await asyncio.wait_for(enough.wait(), WAIT)
    return got[:count]


def _definitions(url: str, management_url: str | None) -> dict[str, Any]:
    if management_url is not None:
        from rabbitry.management import ManagementClient

        with ManagementClient(management_url) as api:
            found: dict[str, Any] = api.definitions()
            return found
    out = rabbitmqctl(url, "export_definitions", "-", "--format", "json", "--quiet")
    data: dict[str, Any] = json.loads(out[out.index("{") :])
    return data


async def test_declare_verify_and_route_by_hash(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    name = names.exchange("orders")
    layout = SuperStream(name, 3)
    topology = _track(names, super_stream(name, 3, max_age="1D"))
    await topology.aapply(conn)
    await topology.aapply(conn)  # idempotent
    report = await topology.averify(conn)
    assert report.ok, str(report)
    assert {item.name for item in report.present} == {name, *layout.queues}

    keys = [f"customer-{n}" for n in range(30)]
    async with await conn.publisher(mandatory=True) as publisher:
        outcomes = [
            await publisher.send(key, exchange=name, routing_key=layout.binding_key_for(key))
            for key in keys
        ]
        # Confirmed, not returned: every binding key reaches its partition.
        await asyncio.wait_for(asyncio.gather(*outcomes), WAIT)

    expected: dict[int, list[str]] = {index: [] for index in range(3)}
    for key in keys:
        expected[partition_for(key, 3)].append(key)
    assert all(expected.values()), expected  # every partition gets some of the 30 keys
    for index, queue in enumerate(layout.queues):
        got = await _read(conn, queue, len(expected[index]))
        assert [m.body.decode() for m in got] == expected[index]  # in publish order


async def test_diff_against_the_broker_and_delete(
    url: str, conn: rabbitry.AsyncConnection, names: Names, management_url: str | None
) -> None:
    name = names.exchange("events")
    topology = _track(names, super_stream(name, binding_keys=["eu", "us"]))
    await topology.aapply(conn)
    definitions = await asyncio.to_thread(_definitions, url, management_url)
    assert topology.diff(definitions, extra=False) == []
    found = SuperStream.from_topology(Topology.from_definitions(definitions), name)
    assert found == SuperStream(name, binding_keys=["eu", "us"])
    assert found.queues == (f"{name}-eu", f"{name}-us")

    lines = super_stream(name, binding_keys=["eu", "us", "ap"]).diff(definitions, extra=False)
    assert f"queue '{name}-ap': missing" in lines, lines

    await topology.adelete(conn)
    report = await topology.averify(conn)
    assert {item.name for item in report.missing} == {name, f"{name}-eu", f"{name}-us"}
