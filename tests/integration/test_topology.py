"""Topology against the real broker: every argument, expiry, AE, conflicts, verify, diff,
delete, server-named queues, and the retry path through every tier into the parking lot."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pytest
from tests.support.broker_ctl import rabbitmqctl

import rabbitry
from rabbitry import AsyncChannel, AsyncConnection, Message, Properties
from rabbitry.exceptions import TopologyConflict, TopologyError
from rabbitry.topology import (
    ATTEMPTS_HEADER,
    EXCEPTION_MESSAGE_HEADER,
    EXCEPTION_TYPE_HEADER,
    FIRST_FAILURE_HEADER,
    LAST_FAILURE_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    PARKED_REASON_HEADER,
    Binding,
    Exchange,
    Queue,
    RetryPolicy,
    Topology,
    format_expiration,
    handle_failure,
)

if TYPE_CHECKING:
    from tests.integration.conftest import Names

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WAIT = 5.0


def track(names: Names, topology: Topology) -> Topology:
    """Register every named entity of ``topology`` for cleanup; returns it."""
    for x in topology.exchanges:
        if x.name not in names.exchanges:
            names.track_exchange(x.name)
    for q in topology.queues:
        if q.name and q.name not in names.queues:
            names.track_queue(q.name)
    return topology


async def get(channel: AsyncChannel, queue: str, wait: float = WAIT) -> Message:
    """basic.get until a message arrives (at most ``wait`` seconds)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        message = await channel.basic_get(queue)
        if message is not None:
            return message
        if loop.time() > deadline:
            raise AssertionError(f"no message in {queue!r} within {wait} s")
        await asyncio.sleep(0.02)


async def publish(
    channel: AsyncChannel,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: Properties | None = None,
    mandatory: bool = False,
) -> None:
    """A confirmed publish (turns confirms on first if needed)."""
    if not channel.confirm_mode:
        await channel.confirm_select()
    confirm = await channel.basic_publish(
        exchange, routing_key, body, properties=properties, mandatory=mandatory
    )
    assert confirm is not None
    await asyncio.wait_for(confirm, WAIT)


async def assert_usable(conn: AsyncConnection, names: Names) -> None:
    assert conn.is_open
    ch = await conn.channel()
    ok = await ch.queue_declare(names.queue("after"), auto_delete=True)
    assert ok.queue
    await ch.close()


# --------------------------------------------------------------------------- arguments


async def test_every_argument_is_accepted_by_the_broker(
    conn: AsyncConnection, names: Names
) -> None:
    dlx = names.exchange("dlx")
    ae = names.exchange("ae")
    topology = Topology(
        exchanges=[
            Exchange(dlx, "fanout"),
            Exchange(ae, "fanout", durable=False, auto_delete=True),
            Exchange(names.exchange("direct"), "direct", alternate_exchange=ae),
            Exchange(names.exchange("topic"), "topic", internal=True),
            Exchange(names.exchange("headers"), "headers", arguments={"x-custom": 1}),
        ],
        queues=[
            Queue(
                names.queue("classic"),
                queue_type="classic",
                message_ttl=60_000,
                expires=600_000,
                dead_letter_exchange=dlx,
                dead_letter_routing_key="dead",
                max_length=100,
                max_length_bytes=1_000_000,
                overflow="reject-publish-dlx",
                max_priority=10,
                single_active_consumer=True,
            ),
            Queue(names.queue("plain"), durable=False, auto_delete=True),
            Queue(names.queue("exclusive"), durable=False, exclusive=True),
            Queue(names.queue("drop-head"), overflow="drop-head", max_length=0),
            Queue(names.queue("reject"), overflow="reject-publish"),
            Queue(
                names.queue("quorum"),
                queue_type="quorum",
                delivery_limit=5,
                message_ttl=1000,
                expires=600_000,
                max_length=10,
                max_length_bytes=10_000,
                overflow="reject-publish",
                dead_letter_exchange=dlx,
                dead_letter_routing_key="q-dead",
                single_active_consumer=True,
            ),
            Queue(
                names.queue("stream"),
                queue_type="stream",
                max_length_bytes=1_000_000,
                arguments={"x-max-age": "1h"},
            ),
        ],
    )
    track(names, topology)
    first = await topology.aapply(conn)
    again = await topology.aapply(conn)  # idempotent: the same declarations again
    assert first.queue_names == again.queue_names
    report = await topology.averify(conn)
    assert report.ok, str(report)
    assert len(report.present) == len(topology.exchanges) + len(topology.queues)
    await assert_usable(conn, names)


async def test_message_ttl_expires_a_real_message(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    dead = names.queue("dead")
    work = names.queue("work")
    await Topology(
        queues=[
            Queue(dead),
            Queue(work, message_ttl=100, dead_letter_exchange="", dead_letter_routing_key=dead),
        ]
    ).aapply(conn)
    await publish(channel, "", work, b"short-lived")
    message = await get(channel, dead)
    message.ack()
    assert message.body == b"short-lived"
    death = message.headers["x-death"][0]
    assert (death["queue"], death["reason"]) == (work, "expired")
    assert await channel.basic_get(work) is None


async def test_per_message_expiration(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    dead = names.queue("dead")
    work = names.queue("work")
    await Topology(
        queues=[Queue(dead), Queue(work, dead_letter_exchange="", dead_letter_routing_key=dead)]
    ).aapply(conn)
    await publish(channel, "", work, b"keep")
    await publish(channel, "", work, b"expire", Properties(expiration=format_expiration(100)))
    await asyncio.sleep(0.3)
    # Per-message TTL expires only at the head of a classic queue: take "keep" first.
    kept = await get(channel, work)
    kept.ack()
    assert kept.body == b"keep"
    expired = await get(channel, dead)
    expired.ack()
    assert expired.body == b"expire"
    assert expired.headers["x-death"][0]["reason"] == "expired"
    assert expired.properties.expiration is None  # removed on dead-lettering


async def test_queue_deleted_by_expires(conn: AsyncConnection, names: Names) -> None:
    queue = names.queue("expiring")
    await Topology(queues=[Queue(queue, expires=500)]).aapply(conn)
    topology = Topology(queues=[Queue(queue)])
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0  # against a hang; the broker's expiry timer is 500 ms
    # A passive declare counts as use and renews the lease, so poll less often than
    # the 500 ms expiry.
    await asyncio.sleep(0.8)
    while (await topology.averify(conn)).ok:
        assert loop.time() < deadline, "x-expires did not delete the queue"
        await asyncio.sleep(0.8)
    await assert_usable(conn, names)


async def test_alternate_exchange_catches_unroutable(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    main, ae, caught = names.exchange("main"), names.exchange("ae"), names.queue("caught")
    await Topology(
        exchanges=[Exchange(ae, "fanout"), Exchange(main, alternate_exchange=ae)],
        queues=[Queue(caught)],
        bindings=[Binding(ae, caught)],
    ).aapply(conn)
    await publish(channel, main, "nobody-binds-this", b"stray")
    message = await get(channel, caught)
    message.ack()
    assert (message.body, message.exchange, message.routing_key) == (
        b"stray",
        main,
        "nobody-binds-this",
    )


async def test_alternate_exchange_loop_stops(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    a, b = names.exchange("a"), names.exchange("b")
    # A's AE is B and B's AE is A: RabbitMQ follows the chain once and stops at the loop.
    await Topology(
        exchanges=[Exchange(a, alternate_exchange=b), Exchange(b, alternate_exchange=a)]
    ).aapply(conn)
    returned: list[Message] = []
    channel.add_return_callback(returned.append)
    await publish(channel, a, "nowhere", b"loop")  # confirmed, delivered nowhere
    await publish(channel, a, "nowhere", b"loop-mandatory", mandatory=True)
    assert [m.body for m in returned] == [b"loop-mandatory"]
    assert returned[0].reply_code == 312
    assert channel.is_open
    await assert_usable(conn, names)


# --------------------------------------------------------------------------- conflicts


async def test_conflict_names_the_argument_and_both_values(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await Topology(queues=[Queue(queue, message_ttl=200)]).aapply(conn)

    with pytest.raises(TopologyConflict) as caught:
        await Topology(queues=[Queue(queue, message_ttl=100)]).aapply(conn)
    conflict = caught.value
    assert (conflict.kind, conflict.name, conflict.argument) == ("queue", queue, "x-message-ttl")
    assert (conflict.ours, conflict.theirs) == (100, 200)
    assert "inequivalent arg 'x-message-ttl'" in conflict.reply_text
    assert isinstance(conflict.__cause__, rabbitry.PreconditionFailed)
    assert "x-message-ttl=200" in str(conflict) and "x-message-ttl=100" in str(conflict)
    await assert_usable(conn, names)

    # An argument we add that the queue does not have ("received ... but current is none").
    with pytest.raises(TopologyConflict) as caught:
        await Topology(queues=[Queue(queue, message_ttl=200, max_length=5)]).aapply(conn)
    assert (caught.value.argument, caught.value.ours, caught.value.theirs) == (
        "x-max-length",
        5,
        None,
    )

    # One we leave out that the queue has ("received none but current is the value ...").
    with pytest.raises(TopologyConflict) as caught:
        await Topology(queues=[Queue(queue)]).aapply(conn)
    assert (caught.value.argument, caught.value.ours, caught.value.theirs) == (
        "x-message-ttl",
        None,
        200,
    )

    with pytest.raises(TopologyConflict) as caught:
        await Topology(queues=[Queue(queue, durable=False, message_ttl=200)]).aapply(conn)
    assert (caught.value.argument, caught.value.ours, caught.value.theirs) == (
        "durable",
        False,
        True,
    )
    await assert_usable(conn, names)


async def test_exchange_conflicts(conn: AsyncConnection, names: Names) -> None:
    name = names.exchange()
    # The alternate exchanges do not exist: beside the point here ("warn" lets it be).
    await Topology(exchanges=[Exchange(name, "direct", alternate_exchange="ae-1")]).aapply(
        conn, missing_exchanges="warn"
    )
    with pytest.raises(TopologyConflict) as caught:
        await Topology(exchanges=[Exchange(name, "fanout", alternate_exchange="ae-1")]).aapply(
            conn, missing_exchanges="warn"
        )
    assert (caught.value.kind, caught.value.argument) == ("exchange", "type")
    assert (caught.value.ours, caught.value.theirs) == ("fanout", "direct")
    with pytest.raises(TopologyConflict) as caught:
        await Topology(exchanges=[Exchange(name, "direct", alternate_exchange="ae-2")]).aapply(
            conn, missing_exchanges="warn"
        )
    assert (caught.value.argument, caught.value.ours, caught.value.theirs) == (
        "alternate-exchange",
        "ae-2",
        "ae-1",
    )
    with pytest.raises(TopologyConflict) as caught:
        await Topology(
            exchanges=[Exchange(name, "direct", durable=False, alternate_exchange="ae-1")]
        ).aapply(conn, missing_exchanges="warn")
    assert (caught.value.argument, caught.value.ours, caught.value.theirs) == (
        "durable",
        False,
        True,
    )
    await assert_usable(conn, names)


async def test_binding_to_a_missing_exchange_names_the_binding(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    missing = names.exchange("missing")
    with pytest.raises(rabbitry.NotFound) as caught:
        await Topology(queues=[Queue(queue)], bindings=[Binding(missing, queue, "k")]).aapply(conn)
    assert any(missing in note for note in caught.value.__notes__)
    await assert_usable(conn, names)


async def test_other_refusals_name_the_entity(
    url: str, conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue("mode")
    # Not a conflict with an existing queue: the broker refuses the argument's value.
    with pytest.raises(TopologyError) as caught:
        await Topology(queues=[Queue(queue, arguments={"x-queue-mode": "bogus"})]).aapply(conn)
    assert not isinstance(caught.value, TopologyConflict)
    assert f"queue {queue!r}: the broker refused the declaration" in str(caught.value)
    assert isinstance(caught.value.__cause__, rabbitry.PreconditionFailed)

    # An exclusive queue of another connection: 405, passed on with a note; verify
    # counts it as present.
    owned = names.queue("owned")
    async with AsyncConnection(url) as other:
        await Topology(queues=[Queue(owned, durable=False, exclusive=True)]).aapply(other)
        with pytest.raises(rabbitry.ResourceLocked) as locked:
            await Topology(queues=[Queue(owned, durable=False, exclusive=True)]).aapply(conn)
        assert any(owned in note for note in locked.value.__notes__)
        report = await Topology(queues=[Queue(owned, durable=False, exclusive=True)]).averify(conn)
        assert report.ok and [q.name for q in report.present] == [owned]
        assert str(report) == "all 1 exchanges and queues exist"
    await assert_usable(conn, names)


# --------------------------------------------------------------------------- verify, diff, delete


async def test_verify_reports_missing(conn: AsyncConnection, names: Names) -> None:
    present_q, missing_q, missing_x = (
        names.queue("here"),
        names.queue("gone"),
        names.exchange("gone"),
    )
    await Topology(queues=[Queue(present_q)]).aapply(conn)
    topology = Topology(
        exchanges=[Exchange(missing_x)],
        queues=[Queue(present_q), Queue(missing_q)],
        bindings=[Binding(missing_x, present_q)],
    )
    report = await topology.averify(conn)
    assert not report.ok
    assert [item.name for item in report.missing] == [missing_x, missing_q]
    assert [item.name for item in report.present] == [present_q]
    assert report.message_counts == {present_q: 0}
    assert len(report.unchecked) == 1  # the binding: no passive bind in AMQP
    assert report.lines() == [f"exchange {missing_x!r}: missing", f"queue {missing_q!r}: missing"]
    await assert_usable(conn, names)


def _broker_definitions(url: str, management_url: str | None = None) -> dict[str, Any]:
    """The broker's definitions: through its management API when the run knows it
    (``--rabbitmq4``), else through rabbitmqctl (the broker of ``url`` is local)."""
    if management_url is not None:
        from rabbitry.management import ManagementClient

        with ManagementClient(management_url) as api:
            definitions: dict[str, Any] = api.definitions()
            return definitions
    out = rabbitmqctl(url, "export_definitions", "-", "--format", "json", "--quiet")
    data: dict[str, Any] = json.loads(out[out.index("{") :])
    return data


async def test_diff_against_the_broker_definitions(
    url: str, conn: AsyncConnection, names: Names, management_url: str | None
) -> None:
    x, q = names.exchange(), names.queue()
    topology = Topology(
        exchanges=[Exchange(x, "topic")],
        queues=[Queue(q, message_ttl=1000, max_length=10)],
        bindings=[Binding(x, q, "a.*")],
    )
    await topology.aapply(conn)
    definitions = await asyncio.to_thread(_broker_definitions, url, management_url)
    assert topology.diff(definitions, extra=False) == []

    wanted = Topology(
        exchanges=[Exchange(x, "fanout")],
        queues=[Queue(q, message_ttl=2000, max_length=10), Queue(names.queue("absent"))],
        bindings=[Binding(x, q, "b.*")],
    )
    lines = wanted.diff(definitions, extra=False)
    assert f"exchange {x!r}: type: ours 'fanout', theirs 'topic'" in lines
    assert f"queue {q!r}: x-message-ttl: ours 2000, theirs 1000" in lines
    assert any(line.endswith("'absent': missing") or "absent" in line for line in lines)
    assert f"binding {x!r} -> queue {q!r} (routing key 'b.*'): missing" in lines
    # Topology against topology: the definitions read back equal what was applied.
    assert topology.diff(Topology.from_definitions(definitions), extra=False) == []


async def test_delete_removes_entities_and_forgets_them(
    conn: AsyncConnection, names: Names
) -> None:
    x, x2, q = names.exchange(), names.exchange("2"), names.queue()
    topology = Topology(
        exchanges=[Exchange(x), Exchange(x2, "fanout")],
        queues=[Queue(q)],
        bindings=[Binding(x, q, "k"), Binding(x, x2, "e", destination_type="exchange")],
    )
    result = await topology.aapply(conn)
    assert result.name_of(q) == q and result.name_of(Queue(q)) == q
    with pytest.raises(KeyError):
        result.name_of("other")
    record = conn.topology_record
    assert record.exchange(x) is not None and record.queue(q) is not None
    assert [b.destination for b in record.bindings_of(x)] == [q, x2]
    await topology.adelete(conn)
    assert record.exchange(x) is None and record.queue(q) is None and not record.bindings_of(x)
    report = await topology.averify(conn)
    assert {item.name for item in report.missing} == {x, x2, q}
    assert not report and "missing" in str(report)
    await topology.adelete(conn)  # already gone: nothing to do, no error
    await assert_usable(conn, names)


async def test_apply_records_in_order(conn: AsyncConnection, names: Names) -> None:
    x1, x2, q = names.exchange("1"), names.exchange("2"), names.queue()
    topology = Topology(
        exchanges=[Exchange(x1, "topic"), Exchange(x2, alternate_exchange=x1)],
        queues=[Queue(q, message_ttl=5000)],
        bindings=[Binding(x1, q, "#"), Binding(x1, x2, "k", destination_type="exchange")],
    )
    await topology.aapply(conn)
    record = conn.topology_record
    assert [e.name for e in record.exchanges][-2:] == [x1, x2]
    assert record.exchange(x2) is not None
    assert dict(record.exchange(x2).arguments) == {"alternate-exchange": x1}  # type: ignore[union-attr]
    assert dict(record.queue(q).arguments) == {"x-message-ttl": 5000}  # type: ignore[union-attr]
    assert [(b.destination_type, b.destination) for b in record.bindings[-2:]] == [
        ("queue", q),
        ("exchange", x2),
    ]


async def test_server_named_queue_name_flows_into_bindings(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    x = names.exchange()
    anonymous = Queue("", durable=False, exclusive=True)
    topology = Topology(
        exchanges=[Exchange(x, "direct")],
        queues=[anonymous],
        bindings=[Binding(x, anonymous, "to-anon")],
    )
    result = await topology.aapply(conn)
    name = result.name_of(anonymous)
    assert name.startswith("amq.gen-")
    assert result.queue_names == (name,)
    assert result.topology.queues[0].name == name
    assert result.topology.bindings[0].destination == name
    recorded = conn.topology_record.queue(name)
    assert recorded is not None and recorded.server_named
    await publish(channel, x, "to-anon", b"found you")
    message = await get(channel, name)
    message.ack()
    assert message.body == b"found you"


async def test_builtin_exchanges_and_generated_names_are_checked_not_declared(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    q = names.queue()
    anonymous = Queue("", durable=False, exclusive=True)
    topology = Topology(
        exchanges=[Exchange("amq.topic", "topic")],
        queues=[Queue(q), anonymous],
        bindings=[Binding("amq.topic", q, f"{q}.#"), Binding("amq.topic", anonymous, f"{q}.#")],
    )
    result = await topology.aapply(conn)
    assert conn.topology_record.exchange("amq.topic") is None  # built in: nothing to replay
    await publish(channel, "amq.topic", f"{q}.x", b"via amq.topic")
    for name in (q, result.name_of(anonymous)):
        message = await get(channel, name)
        message.ack()
        assert message.body == b"via amq.topic"
    # The resolved topology names the generated queue: it applies again (amq.* names
    # are checked with a passive declare) and deletes, leaving amq.topic alone.
    again = await result.topology.aapply(conn)
    assert again.queue_names == result.queue_names
    await result.topology.adelete(conn)
    report = await result.topology.averify(conn)
    assert [item.name for item in report.missing] == [q, result.name_of(anonymous)]
    assert [item.name for item in report.present] == ["amq.topic"]
    await assert_usable(conn, names)


# --------------------------------------------------------------------------- sync API


def test_sync_apply_verify_conflict_delete(url: str, names: Names) -> None:
    x, q = names.exchange(), names.queue()
    topology = Topology(
        exchanges=[Exchange(x, "topic")],
        queues=[Queue(q, message_ttl=1000)],
        bindings=[Binding(x, q, "#")],
    )
    with rabbitry.Connection(url) as conn:
        result = topology.apply(conn)
        assert result.queue_names == (q,)
        assert conn.topology_record.queue(q) is not None
        assert topology.verify(conn).ok
        with pytest.raises(TopologyConflict) as caught:
            Topology(queues=[Queue(q, message_ttl=5)]).apply(conn)
        assert (caught.value.ours, caught.value.theirs) == (5, 1000)
        channel = conn.channel()  # still usable
        channel.basic_publish(x, "any", b"sync")
        channel.close()
        with pytest.raises(TypeError, match="aapply"):
            asyncio.run(topology.aapply(conn))  # type: ignore[arg-type]
        topology.delete(conn)
        assert conn.topology_record.queue(q) is None
        assert not topology.verify(conn).ok


async def test_async_connection_refused_by_sync_apply(conn: AsyncConnection) -> None:
    with pytest.raises(TypeError, match="aapply"):
        Topology().apply(conn)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- retry


def _retry_topology(names: Names, policy: RetryPolicy) -> tuple[str, str, Topology]:
    app = names.exchange("app")
    work = names.queue("work")
    topology = Topology(
        exchanges=[Exchange(app, "topic")],
        queues=[Queue(work)],
        bindings=[Binding(app, work, "order.*")],
    ).with_retry(work, policy)
    return app, work, track(names, topology)


async def test_retry_tiers_into_the_parking_lot(
    conn: AsyncConnection, channel: AsyncChannel, names: Names, broker_version: tuple[int, ...]
) -> None:
    """Version-specific at the end: RabbitMQ 3.x keeps the ``x-death`` header of a
    client-republished message and adds to it, so it lists every tier; 4.x ignores an
    ``x-death`` set by a publisher, so it lists only the last tier's expiry. The attempt
    count is rabbitry's own header, the same on both."""
    policy = RetryPolicy(delays=[0.1, 0.2, 0.3], max_attempts=4)
    assert not policy.broker_driven
    app, work, topology = _retry_topology(names, policy)
    await topology.aapply(conn)
    await publish(
        channel,
        app,
        "order.created",
        b"poison",
        Properties(message_id="m-1", content_type="text/plain", headers={"tenant": "t1"}),
    )
    seen: list[tuple[int, float]] = []
    loop = asyncio.get_running_loop()
    last = loop.time()
    outcomes = []
    for _ in range(4):
        message = await get(channel, work)
        seen.append((policy.attempts(message, work), loop.time() - last))
        last = loop.time()
        assert message.body == b"poison"
        assert message.properties.message_id == "m-1"
        outcomes.append(
            await handle_failure(channel, message, ValueError("boom"), policy, queue=work)
        )
    assert outcomes == ["retry", "retry", "retry", "park"]
    assert [attempts for attempts, _ in seen] == [0, 1, 2, 3]
    # Each retry waited at least its tier's delay.
    for (_, waited), delay in zip(seen[1:], policy.delays, strict=True):
        assert waited >= delay * 0.9, (waited, delay)

    parked = await get(channel, f"{work}.parking-lot")
    parked.ack()
    headers = parked.headers
    assert parked.body == b"poison"
    assert parked.properties.message_id == "m-1"
    assert parked.properties.content_type == "text/plain"
    assert headers["tenant"] == "t1"
    assert headers[ATTEMPTS_HEADER] == 4
    assert headers[EXCEPTION_TYPE_HEADER] == "ValueError"
    assert headers[EXCEPTION_MESSAGE_HEADER] == "boom"
    assert headers[ORIGINAL_EXCHANGE_HEADER] == app
    assert headers[ORIGINAL_ROUTING_KEY_HEADER] == "order.created"
    assert headers[PARKED_REASON_HEADER] == "max-attempts"
    first = datetime.fromisoformat(headers[FIRST_FAILURE_HEADER])
    last_failure = datetime.fromisoformat(headers[LAST_FAILURE_HEADER])
    assert (last_failure - first).total_seconds() >= sum(policy.delays) * 0.9
    # It went through every tier: the broker recorded one expiry per retry queue (3.x),
    # or the last one only (4.x).
    expired = {d["queue"] for d in headers["x-death"] if d["reason"] == "expired"}
    tiers = {f"{work}.retry.100ms", f"{work}.retry.200ms", f"{work}.retry.300ms"}
    assert expired == ({f"{work}.retry.300ms"} if broker_version >= (4,) else tiers)
    for name in (work, *tiers):
        assert await channel.basic_get(name) is None


async def test_broker_driven_retry_into_the_parking_lot(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    policy = RetryPolicy(delays=[0.1], max_attempts=3)
    assert policy.broker_driven
    app, work, topology = _retry_topology(names, policy)
    await topology.aapply(conn)
    await publish(channel, app, "order.paid", b"poison", Properties(headers={"k": "v"}))
    outcomes = []
    attempts = []
    for _ in range(3):
        message = await get(channel, work)
        attempts.append(policy.attempts(message, work))
        if attempts[-1]:
            # Broker-driven: the count is the broker's x-death entry, not our header.
            assert ATTEMPTS_HEADER not in message.headers
        outcomes.append(
            await handle_failure(channel, message, KeyError("missing"), policy, queue=work)
        )
    assert outcomes == ["retry", "retry", "park"]
    assert attempts == [0, 1, 2]
    parked = await get(channel, f"{work}.parking-lot")
    parked.ack()
    headers = parked.headers
    assert headers["k"] == "v"
    assert headers[ATTEMPTS_HEADER] == 3
    assert headers[EXCEPTION_TYPE_HEADER] == "KeyError"
    assert headers[ORIGINAL_EXCHANGE_HEADER] == app
    assert headers[ORIGINAL_ROUTING_KEY_HEADER] == "order.paid"
    assert headers[PARKED_REASON_HEADER] == "max-attempts"
    rejected = [d for d in headers["x-death"] if d["reason"] == "rejected"]
    assert rejected[0]["queue"] == work and rejected[0]["count"] == 2
    assert await channel.basic_get(work) is None


async def test_not_retryable_goes_straight_to_the_parking_lot(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    class Fatal(Exception):
        retryable = False

    policy = RetryPolicy(delays=[0.1, 0.2])
    app, work, topology = _retry_topology(names, policy)
    await topology.aapply(conn)
    await publish(channel, app, "order.x", b"bad")
    message = await get(channel, work)
    assert await handle_failure(channel, message, Fatal("no"), policy, queue=work) == "park"
    parked = await get(channel, f"{work}.parking-lot")
    parked.ack()
    assert parked.headers[PARKED_REASON_HEADER] == "not-retryable"
    assert parked.headers[ATTEMPTS_HEADER] == 1
    assert parked.headers[EXCEPTION_TYPE_HEADER].endswith("Fatal")


async def test_unroutable_move_keeps_the_original(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    work = names.queue("work")
    policy = RetryPolicy(delays=[0.1, 0.2])
    dlx = names.track_exchange(f"{work}.dlx")
    # The hub exchange exists but nothing is bound to it: the move comes back unroutable.
    await Topology(exchanges=[Exchange(dlx)], queues=[Queue(work)]).aapply(conn)
    await publish(channel, "", work, b"precious")
    message = await get(channel, work)
    with pytest.raises(TopologyError, match="unroutable"):
        await handle_failure(channel, message, ValueError("x"), policy, queue=work)
    assert not message.settled
    message.nack(requeue=True)  # still ours to settle: nothing was lost
    again = await get(channel, work)
    again.ack()
    assert again.body == b"precious"


async def test_move_without_retry_topology_keeps_the_original(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    work = names.queue("work")
    await Topology(queues=[Queue(work)]).aapply(conn)  # no retry machinery at all
    await publish(channel, "", work, b"precious")
    message = await get(channel, work)
    with pytest.raises(TopologyError, match="does not exist"):
        await handle_failure(channel, message, ValueError("x"), RetryPolicy([0.1, 0.2]), queue=work)
    assert not message.settled
    # The 404 closed the channel, so the broker put the unacked original back.
    fresh = await conn.channel()
    again = await get(fresh, work)
    again.ack()
    assert again.body == b"precious"
    await fresh.close()


async def test_retry_on_a_quorum_work_queue(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    app, work = names.exchange("app"), names.queue("work")
    policy = RetryPolicy(delays=[0.1, 0.2])
    topology = track(
        names,
        Topology(
            exchanges=[Exchange(app, "topic")],
            queues=[Queue(work, queue_type="quorum", delivery_limit=10)],
            bindings=[Binding(app, work, "#")],
        ).with_retry(work, policy),
    )
    await topology.aapply(conn)
    assert all(q.queue_type == "quorum" for q in topology.queues)
    await publish(channel, app, "k", b"q")
    for expected in ("retry", "retry", "park"):
        message = await get(channel, work)
        assert (
            await handle_failure(channel, message, ValueError("q"), policy, queue=work) == expected
        )
    parked = await get(channel, f"{work}.parking-lot")
    parked.ack()
    assert parked.headers[ATTEMPTS_HEADER] == 3


# --------------------------------------------------------------------------- dangling exchanges


async def test_apply_refuses_a_dead_letter_exchange_that_exists_nowhere(
    conn: AsyncConnection, names: Names
) -> None:
    queue, typo = names.queue(), names.exchange("dlx-typo")
    topology = Topology(queues=[Queue(queue, dead_letter_exchange=typo)])
    with pytest.raises(rabbitry.TopologyMissingExchange) as caught:
        await topology.aapply(conn)
    assert caught.value.missing == ((f"queue {queue!r}", "dead_letter_exchange", typo),)
    assert repr(typo) in str(caught.value) and repr(queue) in str(caught.value)
    # Refused before anything was declared.
    ch = await conn.channel()
    with pytest.raises(rabbitry.NotFound):
        await ch.queue_declare(queue, passive=True)
    assert conn.topology_record.queue(queue) is None


async def test_apply_refuses_an_alternate_exchange_that_exists_nowhere(
    conn: AsyncConnection, names: Names
) -> None:
    exchange, typo = names.exchange(), names.exchange("ae-typo")
    with pytest.raises(rabbitry.TopologyMissingExchange) as caught:
        await Topology([Exchange(exchange, "topic", alternate_exchange=typo)]).aapply(conn)
    assert caught.value.missing == ((f"exchange {exchange!r}", "alternate_exchange", typo),)


async def test_apply_accepts_named_exchanges_in_the_topology_or_on_the_broker(
    conn: AsyncConnection, names: Names
) -> None:
    queue, dlx, ae = names.queue(), names.exchange("dlx"), names.exchange("ae")
    exchange = names.exchange()
    ch = await conn.channel()
    await ch.exchange_declare(ae, "fanout")  # on the broker, not in the topology
    topology = Topology(
        [Exchange(dlx, "fanout"), Exchange(exchange, "direct", alternate_exchange=ae)],
        [Queue(queue, dead_letter_exchange=dlx)],
    )
    await topology.aapply(conn)
    report = await topology.averify(conn)
    assert report.ok and report.dangling == ()


async def test_missing_exchanges_warn_applies_and_logs_and_verify_reports_it(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue, typo = names.queue(), names.exchange("dlx-typo")
    topology = Topology(queues=[Queue(queue, dead_letter_exchange=typo)])
    with caplog.at_level(logging.ERROR, logger="rabbitry.topology"):
        await topology.aapply(conn, missing_exchanges="warn")
    (record,) = [r for r in caplog.records if typo in r.getMessage()]
    assert record.levelno == logging.ERROR and "dropped" in record.getMessage()
    with pytest.raises(rabbitry.TopologyMissingExchange):
        await topology.averify(conn)
    report = await topology.averify(conn, missing_exchanges="warn")
    assert not report.ok
    assert f"queue {queue!r}: dead_letter_exchange {typo!r} does not exist" in report.lines()


def test_sync_verify_refuses_a_dangling_dead_letter_exchange(url: str, names: Names) -> None:
    queue, typo = names.queue(), names.exchange("dlx-typo")
    with rabbitry.Connection(url) as conn:
        topology = Topology(queues=[Queue(queue, dead_letter_exchange=typo)])
        with pytest.raises(rabbitry.TopologyMissingExchange):
            topology.verify(conn)
        with pytest.raises(rabbitry.ConfigurationError, match="missing_exchanges"):
            topology.apply(conn, missing_exchanges="ignore")  # type: ignore[arg-type]
