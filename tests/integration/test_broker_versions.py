"""What differs between RabbitMQ 3.x and 4.x, and what rabbitry does about it.

Every test here runs against the broker at ``RABBITMQ_URL``: ``make test`` runs this
directory once against the shared 3.x node and once against a 4.x node it starts
(``pytest --rabbitmq4``). A test whose expectations differ by version says so and
asserts each version's behaviour, keyed on :func:`broker_version`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

import rabbitry
from rabbitry import AsyncConnection, Message, MessageTooLarge, Requeue
from rabbitry.broker import RABBITMQ_3_MAX_MESSAGE_SIZE, RABBITMQ_4_MAX_MESSAGE_SIZE
from rabbitry.cli._app import cli
from rabbitry.exceptions import TopologyValidationError
from rabbitry.topology import (
    DELIVERY_LIMIT_REASON,
    HELPER_DELIVERY_LIMIT,
    WORK_QUEUE_DELIVERY_LIMIT,
    Policy,
    Queue,
    RetryPolicy,
    Topology,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.integration.conftest import Names

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MiB = 1024 * 1024
#: Upper bound for something that should happen (never a timing assertion).
WAIT = 30.0


async def _ready(conn: AsyncConnection, queue: str) -> int:
    ch = await conn.channel()
    try:
        return (await ch.queue_declare(queue, passive=True)).message_count
    finally:
        await ch.close()


async def _wait_ready(conn: AsyncConnection, queue: str, expected: int) -> None:
    deadline = time.monotonic() + WAIT
    seen = await _ready(conn, queue)
    while seen != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        seen = await _ready(conn, queue)
    assert seen == expected, f"{queue}: {seen} ready, expected {expected}"


async def _publish(conn: AsyncConnection, queue: str, *bodies: bytes) -> None:
    ch = await conn.channel()
    await ch.confirm_select()
    for body in bodies:
        props = rabbitry.Properties(message_id=body.decode())
        confirm = await ch.basic_publish("", queue, body, properties=props)
        assert confirm is not None
        await asyncio.wait_for(confirm, WAIT)
    await ch.close()


def _track(names: Names, work: str, policy: RetryPolicy) -> None:
    retry = policy.names(work)
    names.track_exchange(retry.dlx)
    for name in (*retry.retry_queues, retry.parking_lot):
        if name:
            names.track_queue(name)


@contextlib.asynccontextmanager
async def _running(consumer: rabbitry.AsyncConsumer) -> AsyncIterator[None]:
    await consumer.start(timeout=WAIT)
    try:
        yield
    finally:
        await consumer.stop(timeout=WAIT)


# --------------------------------------------------------------------------- the version


async def test_the_connection_knows_the_brokers_version(
    conn: AsyncConnection, broker_version: tuple[int, ...]
) -> None:
    assert conn.server_version == broker_version
    assert conn.server_version >= (3, 8), conn.server_properties.get("version")
    assert conn.server_capabilities["publisher_confirms"] is True
    assert conn.server_capabilities["consumer_cancel_notify"] is True


async def test_a_body_over_the_brokers_limit_is_refused_before_sending(
    conn: AsyncConnection, names: Names, broker_version: tuple[int, ...]
) -> None:
    """Version-specific: RabbitMQ 4.x refuses bodies over 16 MiB by default, 3.x over
    128 MiB. The client's default limit follows the broker, so a 20 MiB body is refused
    here on 4.x (typed, naming the limit, nothing sent, the channel still open) instead of
    the broker closing the channel and the publish's outcome being unknown; on 3.x the
    broker takes it."""
    queue = names.queue()
    ch = await conn.channel()
    await ch.queue_declare(queue, auto_delete=False)
    await ch.confirm_select()
    body = b"x" * (20 * MiB)
    if broker_version >= (4,):
        assert conn.max_message_size == RABBITMQ_4_MAX_MESSAGE_SIZE
        with pytest.raises(MessageTooLarge) as refused:
            await ch.basic_publish("", queue, body)
        assert refused.value.limit == 16 * MiB and refused.value.size == 20 * MiB
        assert "max_message_size 16777216 (16 MiB)" in str(refused.value)
        async with await conn.publisher(confirm=True) as publisher:
            with pytest.raises(MessageTooLarge):
                await publisher.send(body, routing_key=queue)
        expected = 0
    else:
        assert conn.max_message_size == RABBITMQ_3_MAX_MESSAGE_SIZE
        confirm = await ch.basic_publish("", queue, body)
        assert confirm is not None
        await asyncio.wait_for(confirm, WAIT)
        expected = 1
    # The channel is still usable either way.
    confirm = await ch.basic_publish("", queue, b"small")
    assert confirm is not None
    await asyncio.wait_for(confirm, WAIT)
    assert (await ch.queue_declare(queue, passive=True)).message_count == expected + 1


# --------------------------------------------------------------------------- delivery limit


async def test_delivery_limit_minus_one_by_version(
    conn: AsyncConnection, names: Names, broker_version: tuple[int, ...]
) -> None:
    """Version-specific: ``x-delivery-limit: -1`` is "unlimited" on RabbitMQ 4.x; 3.x
    takes the same declaration but dead-letters at the first return. That is why
    rabbitry never sets -1 itself (``with_retry`` uses a limit that is never reached)."""
    queue, dead = names.queue(), names.queue("dead")
    ch = await conn.channel()
    await ch.queue_declare(dead, durable=True)
    arguments = {
        "x-queue-type": "quorum",
        "x-delivery-limit": -1,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead,
    }
    await ch.queue_declare(queue, durable=True, arguments=arguments)
    await _publish(conn, queue, b"m")
    returns = 0
    while returns < 25:
        message = await ch.basic_get(queue)
        if message is None:
            if await _ready(conn, dead) == 1:
                break  # dead-lettered for its delivery limit
            await asyncio.sleep(0.05)  # the return is still on its way
            continue
        ch.basic_nack(message.delivery_tag, requeue=True)
        returns += 1
    if broker_version >= (4,):
        assert returns == 25
        await _wait_ready(conn, queue, 1)
        assert await _ready(conn, dead) == 0
    else:
        assert returns == 1
        await _wait_ready(conn, dead, 1)
        assert await _ready(conn, queue) == 0


async def test_apply_refuses_an_unlimited_delivery_limit_on_3x(
    conn: AsyncConnection, names: Names, broker_version: tuple[int, ...]
) -> None:
    """Version-specific: ``Topology.apply`` declares ``delivery_limit=-1`` on 4.x and
    refuses it on 3.x before sending anything (there it would drop messages)."""
    queue = names.queue()
    topology = Topology(queues=[Queue(queue, queue_type="quorum", delivery_limit=-1)])
    if broker_version >= (4,):
        await topology.aapply(conn)
        assert await _ready(conn, queue) == 0
    else:
        with pytest.raises(TopologyValidationError, match=r"unlimited only on RabbitMQ 4\.0"):
            await topology.aapply(conn)
        ch = await conn.channel()
        with pytest.raises(rabbitry.NotFound):
            await ch.queue_declare(queue, passive=True)


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(RetryPolicy([0.2], republish=True), id="one-delay"),
        pytest.param(RetryPolicy([0.1, 0.2, 0.3]), id="three-delays"),
    ],
)
async def test_a_message_requeued_forever_is_parked_with_the_reason(
    conn: AsyncConnection, names: Names, policy: RetryPolicy, broker_version: tuple[int, ...]
) -> None:
    """A quorum work queue from ``with_retry`` has an explicit delivery limit (20) on every
    version, and what goes over it is parked with the broker's reason, never dropped."""
    work = names.queue("work")
    _track(names, work, policy)
    topology = Topology(queues=[Queue(work, queue_type="quorum")]).with_retry(work, policy)
    await topology.aapply(conn)
    parking_lot = policy.names(work).parking_lot
    assert parking_lot is not None
    await _publish(conn, work, b"requeued-forever")
    calls: list[Message] = []

    async def handler(message: Message) -> None:
        calls.append(message)
        raise Requeue("not now")

    consumer = conn.consumer(work, handler, retry=policy, prefetch=1)
    async with _running(consumer):
        await _wait_ready(conn, parking_lot, 1)
    # The first delivery and WORK_QUEUE_DELIVERY_LIMIT returns.
    assert len(calls) == WORK_QUEUE_DELIVERY_LIMIT + 1
    assert all(m.body == b"requeued-forever" for m in calls)
    assert await _ready(conn, work) == 0
    for retry_queue in policy.names(work).retry_queues:
        assert await _ready(conn, retry_queue) == 0
    ch = await conn.channel()
    parked = await ch.basic_get(parking_lot, no_ack=True)
    assert parked is not None and parked.body == b"requeued-forever"
    headers = parked.headers
    assert headers["x-first-death-reason"] == DELIVERY_LIMIT_REASON
    assert headers["x-first-death-queue"] == work
    (death,) = headers["x-death"]
    assert (death["reason"], death["queue"], death["count"]) == (DELIVERY_LIMIT_REASON, work, 1)


def _inspect(url: str, queue: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--url", url, "--json", "dlq", "inspect", queue])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout.strip().splitlines()[-1])
    return len(document["messages"]), result.stderr


async def test_dlq_inspect_25_times_on_a_quorum_parking_lot_loses_nothing(
    conn: AsyncConnection, names: Names, url: str, broker_version: tuple[int, ...]
) -> None:
    """``dlq inspect`` takes messages without acking and gives them back, which a quorum
    queue counts as returns; the parking lots of ``with_retry`` have a limit that is never
    reached. On RabbitMQ 4.x such a queue would otherwise drop them after 20 runs."""
    work = names.queue("work")
    policy = RetryPolicy([0.1, 0.2])
    _track(names, work, policy)
    topology = Topology(queues=[Queue(work, queue_type="quorum")]).with_retry(work, policy)
    parking = topology.queue(f"{work}.parking-lot")
    assert parking is not None and parking.delivery_limit == HELPER_DELIVERY_LIMIT
    await topology.aapply(conn)
    await _publish(conn, f"{work}.parking-lot", b"p1", b"p2", b"p3")
    for run in range(25):
        # The previous run's channel close gives the messages back asynchronously: wait
        # until all three are ready again (which is also the check that none was lost).
        await _wait_ready(conn, f"{work}.parking-lot", 3)
        seen, stderr = await asyncio.to_thread(_inspect, url, work)
        assert seen == 3, f"run {run + 1}"
        if run > 0:  # the messages now carry a delivery count (on 4.x from the 2nd run)
            assert "is a quorum queue" in stderr
    await _wait_ready(conn, f"{work}.parking-lot", 3)


# --------------------------------------------------------------------------- policies


@pytest.mark.rabbitmq4
async def test_delivery_limit_minus_one_round_trips_through_the_management_api(
    conn: AsyncConnection, names: Names, management_url: str | None, broker_version: tuple[int, ...]
) -> None:
    """Version-specific: 4.x only (``-1`` is unlimited there, and 3.x drops at the first
    return with it). Needs the broker's management API, which ``--rabbitmq4`` enables."""
    assert broker_version >= (4,), "delivery-limit -1 is RabbitMQ 4.x's; 3.x drops with it"
    if management_url is None:
        pytest.skip("no management API for this broker (set RABBITRY_TEST_MANAGEMENT_URL)")
    from rabbitry.management import AsyncManagementClient

    queue = names.queue()
    policy = Policy(f"{queue}-dl", f"^{queue}$", "quorum_queues", {"delivery-limit": -1})
    wanted = Topology(queues=[Queue(queue, queue_type="quorum", delivery_limit=-1)])
    async with AsyncManagementClient(management_url) as api:
        await api.put_policy(policy)
        try:
            await wanted.aapply(conn)
            read = [p for p in await api.policies() if p.name == policy.name]
            assert read == [policy]
            definitions = await api.definitions()
            broker = Topology.from_definitions(definitions)
            assert broker.queue(queue) == wanted.queue(queue)
            assert broker.policy(policy.name) == policy
            assert wanted.diff(definitions, extra=False) == []
        finally:
            await api.delete_policy(policy.name)


@pytest.mark.rabbitmq4
async def test_policies_with_values_rabbitry_refuses_do_not_break_reading(
    management_url: str | None, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    """A policy set outside rabbitry with a value its model refuses (here a negative
    delivery-limit other than -1, which 4.x also reads as unlimited) is kept, with a
    warning, instead of making every policy of the vhost unreadable. Runs in the
    RabbitMQ 4.x run, whose node has the management API."""
    if management_url is None:
        pytest.skip("no management API for this broker (set RABBITRY_TEST_MANAGEMENT_URL)")
    import httpx

    from rabbitry.management import AsyncManagementClient

    name = f"{names.prefix}-odd"
    base = management_url.split("@", 1)[1].rstrip("/")
    async with httpx.AsyncClient(
        base_url=f"http://{base}/api", auth=("guest", "guest"), timeout=WAIT
    ) as http:
        # Set as another tool would: rabbitry's own set_policy refuses the value.
        answer = await http.put(
            f"/policies/%2F/{name}",
            json={"pattern": "^nothing-matches-this$", "definition": {"delivery-limit": -7}},
        )
        assert answer.status_code in (201, 204), answer.text
        try:
            async with AsyncManagementClient(management_url) as api:
                (read,) = [p for p in await api.policies() if p.name == name]
            assert read.definition == {"delivery-limit": -7}
        finally:
            await http.delete(f"/policies/%2F/{name}")
    assert any("definition['delivery-limit']" in r.getMessage() for r in caplog.records)
