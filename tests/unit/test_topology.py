"""rabbitry.topology without a broker: validation, argument mapping, composition,
documents (JSON, YAML, definitions), diff, conflict parsing, the retry policy and builder,
and the topology record."""

from __future__ import annotations

import asyncio
import json
import pickle
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from rabbitry import Message, Properties
from rabbitry.aio._recovery import redeclare_queue
from rabbitry.exceptions import (
    AMQPError,
    TopologyConflict,
    TopologyError,
    TopologyValidationError,
)
from rabbitry.protocol.frames import Int64
from rabbitry.record import RecordedBinding, RecordedExchange, RecordedQueue, TopologyRecord
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
    dlx_name,
    format_expiration,
    handle_failure,
    parking_lot_name,
    parse_inequivalent,
    retry_queue_name,
)
from rabbitry.topology._apply import value_from_reply

NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def error_of(call: Any) -> TopologyValidationError:
    with pytest.raises(TopologyValidationError) as caught:
        call()
    return caught.value


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "field", "rule"),
    [
        ({"message_ttl": -1}, "message_ttl (x-message-ttl)", "integer in 0..4294967295"),
        ({"message_ttl": 2**32}, "message_ttl (x-message-ttl)", "integer in 0..4294967295"),
        ({"message_ttl": 1.5}, "message_ttl (x-message-ttl)", "must be an integer"),
        ({"message_ttl": True}, "message_ttl (x-message-ttl)", "must be an integer"),
        ({"message_ttl": "100"}, "message_ttl (x-message-ttl)", "must be an integer"),
        ({"expires": 0}, "expires (x-expires)", "integer in 1..4294967295"),
        ({"expires": -5}, "expires (x-expires)", "integer in 1..4294967295"),
        ({"max_length": -1}, "max_length (x-max-length)", "integer >= 0"),
        ({"max_length_bytes": -1}, "max_length_bytes (x-max-length-bytes)", "integer >= 0"),
        ({"max_priority": 256}, "max_priority (x-max-priority)", "integer in 0..255"),
        ({"max_priority": -1}, "max_priority (x-max-priority)", "integer in 0..255"),
        ({"overflow": "drop-tail"}, "overflow (x-overflow)", "drop-head, reject-publish"),
        ({"queue_type": "lazy"}, "queue_type (x-queue-type)", "classic, quorum, stream"),
        (
            {"dead_letter_routing_key": "k"},
            "dead_letter_routing_key (x-dead-letter-routing-key)",
            "needs a dead_letter_exchange",
        ),
        ({"delivery_limit": 3}, "delivery_limit (x-delivery-limit)", "only quorum queues"),
        (
            {"delivery_limit": 3, "queue_type": "classic"},
            "delivery_limit (x-delivery-limit)",
            "only quorum queues",
        ),
        (
            {"queue_type": "quorum", "delivery_limit": -1},
            "delivery_limit (x-delivery-limit)",
            "integer >= 0",
        ),
        (
            {"queue_type": "quorum", "durable": False},
            "durable",
            "quorum queues must have durable=True",
        ),
        ({"queue_type": "quorum", "exclusive": True}, "exclusive", "exclusive=False"),
        ({"queue_type": "quorum", "auto_delete": True}, "auto_delete", "auto_delete=False"),
        ({"queue_type": "stream", "durable": False}, "durable", "stream queues must have durable"),
        ({"queue_type": "stream", "exclusive": True}, "exclusive", "exclusive=False"),
        ({"queue_type": "stream", "auto_delete": True}, "auto_delete", "auto_delete=False"),
        ({"queue_type": "stream", "message_ttl": 5}, "message_ttl (x-message-ttl)", "x-max-age"),
        ({"queue_type": "stream", "max_length": 5}, "max_length (x-max-length)", "stream"),
        (
            {"queue_type": "stream", "dead_letter_exchange": "d"},
            "dead_letter_exchange (x-dead-letter-exchange)",
            "stream queues do not support it",
        ),
        ({"queue_type": "stream", "expires": 5}, "expires (x-expires)", "stream"),
        ({"queue_type": "stream", "overflow": "drop-head"}, "overflow (x-overflow)", "stream"),
        ({"queue_type": "quorum", "max_priority": 5}, "max_priority (x-max-priority)", "quorum"),
        ({"durable": "yes"}, "durable", "True or False"),
        ({"single_active_consumer": 1}, "single_active_consumer", "True or False"),
        (
            {"message_ttl": 5, "arguments": {"x-message-ttl": 6}},
            "message_ttl",
            "contradicts arguments['x-message-ttl']=6",
        ),
        (
            {"arguments": {"x-single-active-consumer": "yes"}},
            "single_active_consumer",
            "True or False",
        ),
        ({"arguments": {"x-bad": object()}}, "arguments", "cannot encode"),
        ({"arguments": {"x-max-age": "bogus"}}, "x-max-age", "Y, M, D, h, m or s"),
        ({"arguments": {"x-max-age": 7}}, "x-max-age", "e.g. '7D'"),
        ({"arguments": ["x"]}, "arguments", "must be a mapping"),
        ({"dead_letter_exchange": "x" * 256}, "dead_letter_exchange", "255 UTF-8 bytes"),
    ],
)
def test_queue_rules(kwargs: dict[str, Any], field: str, rule: str) -> None:
    err = error_of(lambda: Queue("jobs", **kwargs))
    assert isinstance(err, ValueError) and isinstance(err, TopologyError)
    assert err.entity == "queue 'jobs'"
    assert field in err.field
    assert rule in err.rule
    assert str(err).startswith("queue 'jobs': ")


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("x" * 256, "at most 255 UTF-8 bytes"),
        ("amq.mine", "reserved by the broker"),
    ],
)
def test_queue_name_rules(name: str, rule: str) -> None:
    err = error_of(lambda: Queue(name))
    assert err.field == "name" and rule in err.rule


@pytest.mark.parametrize("kind", ["quorum", "stream"])
def test_replicated_queues_cannot_be_server_named(kind: str) -> None:
    err = error_of(lambda: Queue("", queue_type=kind))
    assert err.field == "name" and "cannot be server-named" in err.rule


@pytest.mark.parametrize(
    ("args", "kwargs", "field", "rule"),
    [
        (("",), {}, "name", "must not be empty"),
        (("amq.mine",), {}, "name", "reserved"),
        (("x" * 256,), {}, "name", "255 UTF-8 bytes"),
        (("x", "fanot"), {}, "type", "plugin type starting with 'x-'"),
        (("x", ""), {}, "type", "must not be empty"),
        (("x",), {"durable": 1}, "durable", "True or False"),
        (("x",), {"internal": None}, "internal", "True or False"),
        (("x",), {"alternate_exchange": ""}, "alternate_exchange", "must not be empty"),
        (("x",), {"alternate_exchange": 5}, "alternate_exchange", "must be a str"),
        (
            ("x",),
            {"alternate_exchange": "a", "arguments": {"alternate-exchange": "b"}},
            "alternate_exchange",
            "contradicts",
        ),
        (("x", "x-delayed-message"), {}, "x-delayed-type", "needs x-delayed-type"),
        (("x",), {"arguments": {"k": {1, 2}}}, "arguments", "cannot encode"),
        (("x",), {"arguments": {"": 1}}, "arguments", "must not be empty"),
    ],
)
def test_exchange_rules(
    args: tuple[Any, ...], kwargs: dict[str, Any], field: str, rule: str
) -> None:
    err = error_of(lambda: Exchange(*args, **kwargs))
    assert field in err.field and rule in err.rule
    assert err.entity.startswith("exchange ")


@pytest.mark.parametrize(
    ("args", "kwargs", "field", "rule"),
    [
        (("", "q"), {}, "source", "default exchange"),
        (("x", ""), {}, "destination", "pass the Queue object"),
        (("x", "q"), {"destination_type": "topic"}, "destination_type", "'queue' or 'exchange'"),
        (("x", "q", "k" * 256), {}, "routing_key", "255 UTF-8 bytes"),
        (("x", "q"), {"arguments": {"x-match": object()}}, "arguments", "cannot encode"),
    ],
)
def test_binding_rules(
    args: tuple[Any, ...], kwargs: dict[str, Any], field: str, rule: str
) -> None:
    err = error_of(lambda: Binding(*args, **kwargs))
    assert field in err.field and rule in err.rule


def test_builtin_exchanges_and_generated_queue_names_are_allowed() -> None:
    assert Exchange("amq.topic", "topic").name == "amq.topic"
    assert Queue("amq.gen-abc", exclusive=True).name == "amq.gen-abc"
    error_of(lambda: Exchange("amq.gen-abc"))
    error_of(lambda: Queue("amq.topic"))


def test_well_formed_entities() -> None:
    assert Exchange("x", "x-consistent-hash").type == "x-consistent-hash"
    assert Exchange("d", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    assert Queue("", exclusive=True).server_named
    assert Queue("s", queue_type="stream", arguments={"x-max-age": "7D"}, max_length_bytes=10)
    assert Queue("q", dead_letter_exchange="")  # the default exchange is a valid DLX
    assert Queue("q", message_ttl=0, max_priority=0, max_length=0).message_ttl == 0


# --------------------------------------------------------------------------- arguments


def test_typed_fields_become_x_arguments_with_amqp_types() -> None:
    q = Queue(
        "jobs",
        queue_type="quorum",
        message_ttl=2**32 - 1,
        expires=60_000,
        dead_letter_exchange="dlx",
        dead_letter_routing_key="dead",
        max_length=10,
        max_length_bytes=2048,
        overflow="reject-publish",
        delivery_limit=5,
        single_active_consumer=True,
        arguments={"x-quorum-initial-group-size": 3},
    )
    args = q.declare_arguments()
    assert args == {
        "x-queue-type": "quorum",
        "x-message-ttl": 2**32 - 1,
        "x-expires": 60_000,
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "dead",
        "x-max-length": 10,
        "x-max-length-bytes": 2048,
        "x-overflow": "reject-publish",
        "x-delivery-limit": 5,
        "x-single-active-consumer": True,
        "x-quorum-initial-group-size": 3,
    }
    assert type(args["x-message-ttl"]) is int  # encoded as l (it does not fit I)
    assert type(args["x-single-active-consumer"]) is bool
    assert Queue("p", max_priority=10).declare_arguments() == {"x-max-priority": 10}
    assert Queue("plain").declare_arguments() == {}
    assert Exchange("x", alternate_exchange="ae").declare_arguments() == {
        "alternate-exchange": "ae"
    }


def test_arguments_are_lifted_into_typed_fields() -> None:
    raw = Queue("q", arguments={"x-message-ttl": 5, "x-queue-type": "classic", "x-other": "v"})
    assert raw == Queue("q", message_ttl=5, queue_type="classic", arguments={"x-other": "v"})
    assert raw.message_ttl == 5 and raw.arguments == {"x-other": "v"}
    # The same value given both ways is fine; Int64 compares equal to int.
    assert Queue("q", message_ttl=5, arguments={"x-message-ttl": Int64(5)}).arguments is None
    # x-single-active-consumer=false stays an explicit argument (RabbitMQ tells it apart).
    off = Queue("q", arguments={"x-single-active-consumer": False})
    assert off.declare_arguments() == {"x-single-active-consumer": False}
    assert off != Queue("q")
    assert Exchange("x", arguments={"alternate-exchange": "ae"}) == Exchange(
        "x", alternate_exchange="ae"
    )
    # Lifted values are validated like typed ones.
    assert error_of(lambda: Queue("q", arguments={"x-expires": 0})).field == "expires (x-expires)"


def test_format_expiration() -> None:
    assert format_expiration(1500) == "1500"
    assert format_expiration("250") == "250"
    assert format_expiration(timedelta(seconds=1.5)) == "1500"
    for bad, rule in [
        (-1, "integer in 0..4294967295"),
        (2**32, "integer in 0..4294967295"),
        ("1.5", "string of digits"),
        ("-1", "string of digits"),
        ("١٢", "string of digits"),  # non-ASCII digits
        (1.5, "timedelta"),
        (True, "timedelta"),
    ]:
        err = error_of(lambda bad=bad: format_expiration(bad))
        assert err.field == "expiration" and rule in err.rule


# --------------------------------------------------------------------------- topology


def test_composition_keeps_order_and_dedupes() -> None:
    a = Topology([Exchange("x")], [Queue("q1")], [Binding("x", "q1")])
    b = Topology([Exchange("x"), Exchange("y", "fanout")], [Queue("q2")], [Binding("x", "q1")])
    c = a + b
    assert [x.name for x in c.exchanges] == ["x", "y"]
    assert [q.name for q in c.queues] == ["q1", "q2"]
    assert len(c.bindings) == 1
    assert len(c) == 5
    assert c.exchange("y") == Exchange("y", "fanout") and c.exchange("z") is None
    assert c.queue("q2") == Queue("q2") and c.queue("") is None
    assert (a + Topology()) == a
    with pytest.raises(TypeError):
        _ = a + 1


def test_conflicting_duplicates_are_rejected() -> None:
    err = error_of(lambda: Topology(queues=[Queue("q", message_ttl=1), Queue("q", message_ttl=2)]))
    assert err.entity == "queue 'q'" and "defined twice" in err.rule and "message_ttl" in err.rule
    err = error_of(lambda: Topology([Exchange("x")]) + Topology([Exchange("x", "topic")]))
    assert "type: 'direct' vs 'topic'" in err.rule


def test_topology_rejects_wrong_items() -> None:
    assert "must be a Queue" in error_of(lambda: Topology(queues=[Exchange("x")])).rule  # type: ignore[list-item]
    assert "sequence" in error_of(lambda: Topology(queues="q")).rule  # type: ignore[arg-type]


def test_server_named_queues_are_bound_by_object() -> None:
    anon1, anon2 = Queue("", exclusive=True), Queue("", exclusive=True)
    topology = Topology(
        [Exchange("x")], [anon1, anon2], [Binding("x", anon1, "a"), Binding("x", anon2, "b")]
    )
    assert len(topology.queues) == 2  # equal objects, different queues
    assert topology.bindings[0].destination is anon1
    assert topology.bindings[0].destination_name == ""
    err = error_of(lambda: Topology(bindings=[Binding("x", Queue("", exclusive=True))]))
    assert "not in this topology" in err.rule


def test_binding_accepts_entity_objects() -> None:
    b = Binding("x", Exchange("y", "fanout"))  # type: ignore[arg-type]
    assert (b.destination, b.destination_type) == ("y", "exchange")
    assert Binding("x", Queue("q")).destination == "q"
    assert Binding(Exchange("x"), "q").source == "x"  # type: ignore[arg-type]
    assert "routing key 'k'" in Binding("x", "q", "k").label


# --------------------------------------------------------------------------- documents

SAMPLE = Topology(
    exchanges=[
        Exchange("events", "topic", alternate_exchange="unrouted"),
        Exchange("unrouted", "fanout"),
    ],
    queues=[
        Queue("jobs", queue_type="quorum", delivery_limit=5, dead_letter_exchange="dlx"),
        Queue("audit", durable=False, max_length=100, arguments={"x-custom": "v"}),
    ],
    bindings=[
        Binding("events", "jobs", "job.*"),
        Binding("events", "unrouted", "#", destination_type="exchange"),
        Binding("unrouted", "audit", arguments={"x-match": "all"}),
    ],
)


def test_dict_json_yaml_round_trips() -> None:
    data = SAMPLE.to_dict()
    assert data["exchanges"][0] == {
        "name": "events",
        "type": "topic",
        "alternate_exchange": "unrouted",
    }
    assert data["queues"][1] == {
        "name": "audit",
        "durable": False,
        "max_length": 100,
        "arguments": {"x-custom": "v"},
    }
    assert Topology.from_dict(data) == SAMPLE
    assert Topology.from_json(SAMPLE.to_json()) == SAMPLE
    assert Topology.from_yaml(SAMPLE.to_yaml()) == SAMPLE


def test_yaml_as_written_by_hand() -> None:
    text = """
exchanges:
  - name: orders
    type: topic
queues:
  - name: billing
    queue_type: quorum
    message_ttl: 60000
bindings:
  - source: orders
    destination: billing
    routing_key: "order.*"
"""
    topology = Topology.from_yaml(text)
    assert topology.queues[0] == Queue("billing", queue_type="quorum", message_ttl=60000)
    assert topology.bindings[0].routing_key == "order.*"
    assert Topology.from_yaml("") == Topology()


def test_load_by_suffix(tmp_path: Any) -> None:
    (tmp_path / "t.json").write_text(SAMPLE.to_json())
    (tmp_path / "t.yaml").write_text(SAMPLE.to_yaml())
    (tmp_path / "t.yml").write_text(SAMPLE.to_yaml())
    for name in ("t.json", "t.yaml", "t.yml"):
        assert Topology.load(tmp_path / name) == SAMPLE
    (tmp_path / "t.txt").write_text("{}")
    assert error_of(lambda: Topology.load(tmp_path / "t.txt")).field == "suffix"


@pytest.mark.parametrize(
    ("data", "field", "rule"),
    [
        ({"queues": [{"name": "q", "durabel": True}]}, "durabel", "unknown field"),
        ({"queus": []}, "queus", "unknown section"),
        ({"queues": [{"durable": True}]}, "name", "is required"),
        ({"queues": {"name": "q"}}, "queues", "must be a list"),
        ({"queues": ["q"]}, "queues[0]", "must be a mapping"),
        ({"bindings": [{"source": "x"}]}, "fields", "destination"),
        ({"queues": [{"name": "q", "message_ttl": -1}]}, "message_ttl", "0..4294967295"),
    ],
)
def test_from_dict_errors(data: dict[str, Any], field: str, rule: str) -> None:
    err = error_of(lambda: Topology.from_dict(data))
    assert field in err.field and rule in err.rule


def test_bad_documents() -> None:
    assert "invalid JSON" in error_of(lambda: Topology.from_json("{")).rule
    assert "invalid YAML" in error_of(lambda: Topology.from_yaml("a: [")).rule
    assert "mapping" in error_of(lambda: Topology.from_json("[1]")).rule


def test_yaml_without_pyyaml_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes ``import yaml`` fail
    with pytest.raises(ImportError, match=r"rabbitry\[yaml\]"):
        Topology.from_yaml("queues: []")


# A trimmed `rabbitmqctl export_definitions` of a RabbitMQ 3.10 broker.
EXPORT: dict[str, Any] = {
    "rabbit_version": "3.10.8",
    "rabbitmq_version": "3.10.8",
    "users": [{"name": "guest", "tags": ["administrator"]}],
    "vhosts": [{"name": "/"}, {"name": "other"}],
    "permissions": [],
    "policies": [],
    "queues": [
        {
            "name": "jobs",
            "vhost": "/",
            "durable": True,
            "auto_delete": False,
            "arguments": {"x-queue-type": "quorum", "x-delivery-limit": 5},
        },
        {"name": "else", "vhost": "other", "durable": True, "auto_delete": False, "arguments": {}},
    ],
    "exchanges": [
        {
            "name": "events",
            "vhost": "/",
            "type": "topic",
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "arguments": {"alternate-exchange": "unrouted"},
        }
    ],
    "bindings": [
        {
            "source": "events",
            "vhost": "/",
            "destination": "jobs",
            "destination_type": "queue",
            "routing_key": "job.*",
            "arguments": {},
        }
    ],
}


def test_from_definitions_reads_one_vhost() -> None:
    topology = Topology.from_definitions(EXPORT)
    assert topology.queues == (Queue("jobs", queue_type="quorum", delivery_limit=5),)
    assert topology.exchanges == (Exchange("events", "topic", alternate_exchange="unrouted"),)
    assert topology.bindings == (Binding("events", "jobs", "job.*"),)
    assert [q.name for q in Topology.from_definitions(EXPORT, vhost="other").queues] == ["else"]
    # The JSON/YAML loaders recognise an export.
    assert Topology.from_json(json.dumps(EXPORT)) == topology


def test_definitions_round_trip_and_skips() -> None:
    anon = Queue("", exclusive=True)
    topology = SAMPLE + Topology(
        queues=[Queue("mine", exclusive=True), anon],
        bindings=[Binding("events", "mine"), Binding("events", anon)],
    )
    exported = topology.to_definitions(vhost="v")
    assert {q["name"] for q in exported["queues"]} == {"jobs", "audit"}
    assert all(entry["vhost"] == "v" for section in exported.values() for entry in section)
    assert exported["exchanges"][0]["arguments"] == {"alternate-exchange": "unrouted"}
    assert exported["queues"][0]["arguments"]["x-delivery-limit"] == 5
    assert Topology.from_definitions(exported, vhost="v") == SAMPLE
    assert SAMPLE.diff(exported, vhost="v") == []
    json.dumps(exported)  # plain data
    with pytest.raises(TopologyValidationError, match="server-named"):
        topology.to_dict()


# --------------------------------------------------------------------------- diff


def test_diff_lines() -> None:
    ours = Topology(
        [Exchange("x", "topic")],
        [Queue("q", message_ttl=1000), Queue("only-ours")],
        [Binding("x", "q", "a")],
    )
    theirs = Topology(
        [Exchange("x", "direct")],
        [Queue("q", message_ttl=2000, max_length=5), Queue("only-theirs")],
        [Binding("x", "q", "b")],
    )
    assert ours.diff(theirs) == [
        "exchange 'x': type: ours 'topic', theirs 'direct'",
        "queue 'q': x-message-ttl: ours 1000, theirs 2000",
        "queue 'q': x-max-length: ours (not set), theirs 5",
        "queue 'only-ours': missing",
        "binding 'x' -> queue 'q' (routing key 'a'): missing",
        "queue 'only-theirs': not in ours",
        "binding 'x' -> queue 'q' (routing key 'b'): not in ours",
    ]
    assert len(ours.diff(theirs, extra=False)) == 5
    assert ours.diff(ours) == []


def test_diff_normalises_like_the_broker() -> None:
    assert (
        Topology(queues=[Queue("q", queue_type="classic")]).diff(Topology(queues=[Queue("q")]))
        == []
    )
    assert (
        Topology(queues=[Queue("q", arguments={"x-n": Int64(5)})]).diff(
            Topology(queues=[Queue("q", arguments={"x-n": 5})])
        )
        == []
    )
    assert Topology(queues=[Queue("q", arguments={"x-n": True})]).diff(
        Topology(queues=[Queue("q", arguments={"x-n": 1})])
    ) == ["queue 'q': x-n: ours True, theirs 1"]


# --------------------------------------------------------------------------- conflicts

TEXTS = {
    "same": "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': "
    "received '100' but current is '200'",
    "ours-missing": "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost "
    "'/': received none but current is the value '200' of type 'signedint'",
    "theirs-missing": "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'it''s' in "
    "vhost 'v': received the value '5' of type 'signedint' but current is none",
    "bool": "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'x' in vhost '/': "
    "received 'false' but current is 'true'",
    "str": "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'q' in vhost "
    "'/': received none but current is the value 'd x' of type 'longstr'",
}


def test_parse_inequivalent() -> None:
    parsed = parse_inequivalent(TEXTS["same"])
    assert parsed is not None
    assert (parsed.argument, parsed.kind, parsed.name, parsed.vhost) == (
        "x-message-ttl",
        "queue",
        "q",
        "/",
    )
    assert (parsed.received, parsed.current) == ("'100'", "'200'")
    other = parse_inequivalent(TEXTS["theirs-missing"])
    assert other is not None and other.name == "it''s" and other.vhost == "v"
    assert other.current == "none"
    assert parse_inequivalent("PRECONDITION_FAILED - invalid arg 'x-max-priority'") is None


def test_value_from_reply() -> None:
    assert value_from_reply("'200'", like=100) == 200
    assert value_from_reply("'true'", like=False) is True
    assert value_from_reply("'direct'", like="fanout") == "direct"
    assert value_from_reply("none") is None
    assert value_from_reply("the value '200' of type 'signedint'") == 200
    assert value_from_reply("the value 'false' of type 'bool'") is False
    assert value_from_reply("the value 'd x' of type 'longstr'") == "d x"
    assert value_from_reply("the value '1.5' of type 'double'") == 1.5
    assert value_from_reply("'abc'", like=1) == "abc"  # not a number after all: keep the text


def test_conflict_exception() -> None:
    conflict = TopologyConflict("queue", "q", "x-message-ttl", 100, 200, TEXTS["same"])
    assert (
        str(conflict)
        == "queue 'q' exists with x-message-ttl=200, but the topology declares x-message-ttl=100"
    )
    assert isinstance(conflict, TopologyError) and isinstance(conflict, AMQPError)
    copy = pickle.loads(pickle.dumps(conflict))
    assert (copy.kind, copy.argument, copy.ours, copy.theirs, copy.reply_text) == (
        "queue",
        "x-message-ttl",
        100,
        200,
        TEXTS["same"],
    )
    absent = TopologyConflict("queue", "q", "x-max-length", 5, None, "t")
    assert "x-max-length=(not set)" in str(absent)
    assert "cannot be declared" in str(TopologyConflict("queue", "q", None, None, None, "why"))
    err = pickle.loads(pickle.dumps(TopologyValidationError("queue 'q'", "f", "r")))
    assert (err.entity, err.field, err.rule) == ("queue 'q'", "f", "r")


# --------------------------------------------------------------------------- retry policy


def test_policy_math() -> None:
    policy = RetryPolicy([0.1, timedelta(seconds=1), 5], max_attempts=6)
    assert policy.delays == (0.1, 1.0, 5.0)
    assert policy.delays_ms == (100, 1000, 5000)
    assert policy.tiers == (100, 1000, 5000)
    assert not policy.broker_driven
    # The last delay repeats for the retries past the list.
    assert [policy.delay_ms_for(n) for n in range(1, 6)] == [100, 1000, 5000, 5000, 5000]
    assert RetryPolicy([2]).max_attempts == 2
    assert RetryPolicy(0.5, max_attempts=4).broker_driven
    assert RetryPolicy([1, 1, 1]).broker_driven  # one distinct delay
    assert RetryPolicy([1, 1, 1]).tiers == (1000,)
    assert RetryPolicy(max_attempts=1).tiers == ()
    with pytest.raises(ValueError, match="no retries"):
        RetryPolicy(max_attempts=1).delay_ms_for(1)


@pytest.mark.parametrize(
    ("args", "kwargs", "field", "rule"),
    [
        (([-1],), {}, "delays[0]", "0..4294967 seconds"),
        ((["1"],), {}, "delays[0]", "seconds (a number) or a timedelta"),
        (([1, 2, 3],), {"max_attempts": 3}, "delays", "only 2 retries"),
        (([],), {"max_attempts": 3}, "delays", "at least one delay"),
        (([1],), {"max_attempts": 0}, "max_attempts", "integer >= 1"),
        (([1],), {"max_attempts": True}, "max_attempts", "integer >= 1"),
        (([1],), {"parking_lot": "yes"}, "parking_lot", "True or False"),
        (([1],), {"fatal": [ValueError, "x"]}, "fatal", "exception types"),
        (([1],), {"queue": ""}, "queue", "non-empty"),
    ],
)
def test_policy_rules(args: tuple[Any, ...], kwargs: dict[str, Any], field: str, rule: str) -> None:
    err = error_of(lambda: RetryPolicy(*args, **kwargs))
    assert err.entity == "retry policy" and err.field == field and rule in err.rule


def test_names() -> None:
    assert dlx_name("jobs") == "jobs.dlx"
    assert parking_lot_name("jobs") == "jobs.parking-lot"
    assert retry_queue_name("jobs", 5000) == "jobs.retry.5s"
    assert retry_queue_name("jobs", 250) == "jobs.retry.250ms"
    assert retry_queue_name("jobs", 1500) == "jobs.retry.1500ms"
    assert retry_queue_name("jobs", 0) == "jobs.retry.0ms"
    names = RetryPolicy([0.25, 5], queue="jobs").names()
    assert (names.dlx, names.retry_queues, names.parking_lot) == (
        "jobs.dlx",
        ("jobs.retry.250ms", "jobs.retry.5s"),
        "jobs.parking-lot",
    )
    assert RetryPolicy([1], parking_lot=False).names("q").parking_lot is None
    with pytest.raises(ValueError, match="which work queue"):
        RetryPolicy([1]).names()


def message(
    headers: dict[str, Any] | None = None, exchange: str = "app", key: str = "rk"
) -> Message:
    return Message(
        b"body",
        Properties(headers=headers, message_id="m1", expiration="100"),
        delivery_tag=7,
        exchange=exchange,
        routing_key=key,
    )


def x_death(queue: str, reason: str, count: int, **extra: Any) -> dict[str, Any]:
    return {"queue": queue, "reason": reason, "count": count, **extra}


def test_attempts_from_our_header_or_x_death() -> None:
    policy = RetryPolicy([1])
    assert policy.attempts(message()) == 0
    assert policy.attempts(message({ATTEMPTS_HEADER: 3})) == 3
    deaths = [
        x_death("jobs.retry.1s", "expired", 2),
        x_death("jobs", "rejected", 2),
        x_death("other", "rejected", 9),
    ]
    assert policy.attempts(message({"x-death": deaths}), "jobs") == 2
    assert policy.attempts(message({"x-death": deaths}), "nope") == 0
    assert policy.attempts(message({"x-death": deaths})) == 2  # first rejection of any queue
    assert policy.attempts(message({ATTEMPTS_HEADER: True})) == 0  # not a count
    assert policy.attempts(message({"x-death": "garbage"})) == 0


def test_plan_tiers() -> None:
    policy = RetryPolicy([0.1, 0.2], max_attempts=4, queue="jobs")
    first = policy.plan(message({"tenant": "t"}), ValueError("boom"), NOW)
    assert (first.kind, first.via, first.exchange, first.routing_key) == (
        "retry",
        "publish",
        "jobs.dlx",
        "jobs.retry.100ms",
    )
    assert (first.attempts, first.delay) == (1, 0.1)
    h = first.headers
    assert h["tenant"] == "t"
    assert h[ATTEMPTS_HEADER] == 1
    assert (h[ORIGINAL_EXCHANGE_HEADER], h[ORIGINAL_ROUTING_KEY_HEADER]) == ("app", "rk")
    assert h[FIRST_FAILURE_HEADER] == h[LAST_FAILURE_HEADER] == "2026-01-02T03:04:05.678Z"
    assert (h[EXCEPTION_TYPE_HEADER], h[EXCEPTION_MESSAGE_HEADER]) == ("ValueError", "boom")

    # Came back from the retry queue: keeps the original route and first failure time.
    later = NOW + timedelta(seconds=1)
    back = message(dict(h), exchange="jobs.dlx", key="jobs")
    second = policy.plan(back, KeyError("k"), later)
    assert (second.kind, second.routing_key, second.attempts, second.delay) == (
        "retry",
        "jobs.retry.200ms",
        2,
        0.2,
    )
    assert second.headers[ORIGINAL_EXCHANGE_HEADER] == "app"
    assert second.headers[FIRST_FAILURE_HEADER] == "2026-01-02T03:04:05.678Z"
    assert second.headers[LAST_FAILURE_HEADER] == "2026-01-02T03:04:06.678Z"
    third = policy.plan(message({**second.headers}), ValueError(), later)
    assert (third.kind, third.routing_key) == ("retry", "jobs.retry.200ms")  # last tier repeats
    parked = policy.plan(message({**third.headers}), ValueError("final"), later)
    assert (parked.kind, parked.via, parked.exchange, parked.routing_key) == (
        "park",
        "publish",
        "jobs.dlx",
        "jobs.parking-lot",
    )
    assert parked.headers[ATTEMPTS_HEADER] == 4
    assert parked.headers[PARKED_REASON_HEADER] == "max-attempts"
    assert parked.delay is None


def test_plan_broker_driven() -> None:
    policy = RetryPolicy([0.1], max_attempts=3)
    first = policy.plan(message(), ValueError(), NOW, queue="jobs")
    assert (first.kind, first.via, first.routing_key, first.headers) == (
        "retry",
        "nack",
        "jobs.retry.100ms",
        {},
    )
    rejected_at = datetime(2026, 1, 1, tzinfo=UTC)
    deaths = [
        x_death(
            "jobs.retry.100ms",
            "expired",
            2,
            exchange="jobs.dlx",
            **{"routing-keys": ["jobs.retry.100ms"]},
        ),
        x_death(
            "jobs",
            "rejected",
            2,
            exchange="orders",
            time=rejected_at,
            **{"routing-keys": ["order.new"]},
        ),
    ]
    last = policy.plan(
        message({"x-death": deaths}, exchange="jobs.dlx", key="jobs"),
        ValueError("x"),
        NOW,
        queue="jobs",
    )
    assert (last.kind, last.attempts) == ("park", 3)
    # Original route and first failure come from the broker's x-death entry.
    assert (last.headers[ORIGINAL_EXCHANGE_HEADER], last.headers[ORIGINAL_ROUTING_KEY_HEADER]) == (
        "orders",
        "order.new",
    )
    assert last.headers[FIRST_FAILURE_HEADER] == "2026-01-01T00:00:00.000Z"


def test_plan_not_retryable_and_drop() -> None:
    class Fatal(Exception):
        pass

    class Flagged(Exception):
        retryable = False

    policy = RetryPolicy([1, 2], fatal=[Fatal], queue="q")
    assert not policy.is_retryable(Fatal()) and not policy.is_retryable(Flagged())
    assert policy.is_retryable(ValueError())
    for exc in (Fatal(), Flagged()):
        decision = policy.plan(message(), exc, NOW)
        assert (decision.kind, decision.attempts) == ("park", 1)
        assert decision.headers[PARKED_REASON_HEADER] == "not-retryable"
        assert decision.headers[EXCEPTION_TYPE_HEADER].endswith(type(exc).__qualname__)
    assert policy.plan(message(), ValueError(), NOW, retryable=False).kind == "park"
    dropping = RetryPolicy([1], parking_lot=False, queue="q")
    assert dropping.plan(message({ATTEMPTS_HEADER: 1}), ValueError(), NOW).kind == "drop"
    assert RetryPolicy(max_attempts=1, queue="q").plan(message(), ValueError(), NOW).kind == "park"


def test_exception_text_is_bounded() -> None:
    decision = RetryPolicy(max_attempts=1, queue="q").plan(message(), ValueError("x" * 5000), NOW)
    assert len(decision.headers[EXCEPTION_MESSAGE_HEADER]) == 1024


# --------------------------------------------------------------------------- with_retry


def test_with_retry_tiers() -> None:
    base = Topology([Exchange("app", "topic")], [Queue("jobs")], [Binding("app", "jobs", "#")])
    built = base.with_retry("jobs", RetryPolicy([0.1, 0.5], max_attempts=4))
    assert [x.name for x in built.exchanges] == ["app", "jobs.dlx"]
    assert [q.name for q in built.queues] == [
        "jobs",
        "jobs.retry.100ms",
        "jobs.retry.500ms",
        "jobs.parking-lot",
    ]
    work = built.queue("jobs")
    assert work is not None
    assert (work.dead_letter_exchange, work.dead_letter_routing_key) == (
        "jobs.dlx",
        "jobs.parking-lot",
    )
    retry = built.queue("jobs.retry.500ms")
    assert retry is not None
    assert (retry.message_ttl, retry.dead_letter_exchange, retry.dead_letter_routing_key) == (
        500,
        "jobs.dlx",
        "jobs",
    )
    assert [(b.source, b.destination, b.routing_key) for b in built.bindings] == [
        ("app", "jobs", "#"),
        ("jobs.dlx", "jobs", "jobs"),
        ("jobs.dlx", "jobs.retry.100ms", "jobs.retry.100ms"),
        ("jobs.dlx", "jobs.retry.500ms", "jobs.retry.500ms"),
        ("jobs.dlx", "jobs.parking-lot", "jobs.parking-lot"),
    ]
    assert base.queue("jobs") == Queue("jobs")  # the original is unchanged


def test_with_retry_broker_driven_and_variants() -> None:
    base = Topology(queues=[Queue("jobs", queue_type="quorum")])
    built = base.with_retry("jobs", RetryPolicy([1], max_attempts=5))
    work = built.queue("jobs")
    assert work is not None and work.dead_letter_routing_key == "jobs.retry.1s"
    assert all(q.queue_type == "quorum" for q in built.queues)
    no_lot = base.with_retry("jobs", RetryPolicy([1, 2], parking_lot=False))
    assert no_lot.queue("jobs.parking-lot") is None
    assert no_lot.queue("jobs") == Queue("jobs", queue_type="quorum")  # nothing to dead-letter to
    straight = base.with_retry("jobs", RetryPolicy(max_attempts=1))
    assert [q.name for q in straight.queues] == ["jobs", "jobs.parking-lot"]
    transient = Topology(queues=[Queue("t", durable=False, exclusive=True)]).with_retry(
        "t", RetryPolicy([1])
    )
    assert all(not q.durable and q.exclusive for q in transient.queues)
    # Applying the builder twice gives the same topology.
    assert built.with_retry("jobs", RetryPolicy([1], max_attempts=5)) == built


@pytest.mark.parametrize(
    ("topology", "queue", "policy", "rule"),
    [
        (Topology(), "jobs", RetryPolicy([1]), "not in this topology"),
        (
            Topology(queues=[Queue("s", queue_type="stream")]),
            "s",
            RetryPolicy([1]),
            "cannot dead-letter",
        ),
        (Topology(queues=[Queue("q")]), "q", RetryPolicy([1], queue="other"), "for queue 'other'"),
        (
            Topology(queues=[Queue("q", dead_letter_exchange="elsewhere")]),
            "q",
            RetryPolicy([1]),
            "already dead-letters to 'elsewhere'",
        ),
        (Topology(queues=[Queue("q" * 250)]), "q" * 250, RetryPolicy([1]), "255 UTF-8 bytes"),
    ],
)
def test_with_retry_errors(topology: Topology, queue: str, policy: RetryPolicy, rule: str) -> None:
    assert rule in str(error_of(lambda: topology.with_retry(queue, policy)))


# --------------------------------------------------------------------------- handle_failure


class FakeChannel:
    """Just enough of AsyncChannel for the paths that publish nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self.sent.append(("nack", delivery_tag, requeue))

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.sent.append(("ack", delivery_tag))


def test_handle_failure_broker_driven_nacks_and_drop_acks() -> None:
    channel = cast("Any", FakeChannel())
    msg = message()
    kind = asyncio.run(handle_failure(channel, msg, ValueError(), RetryPolicy([1]), queue="q"))
    assert (kind, channel.sent, msg.settled) == ("retry", [("nack", 7, False)], True)
    with pytest.raises(Exception, match="already settled"):
        asyncio.run(handle_failure(channel, msg, ValueError(), RetryPolicy([1]), queue="q"))
    channel.sent.clear()
    kind = asyncio.run(
        handle_failure(
            channel,
            message(),
            ValueError(),
            RetryPolicy(max_attempts=1, parking_lot=False),
            queue="q",
        )
    )
    assert (kind, channel.sent) == ("drop", [("ack", 7)])


# --------------------------------------------------------------------------- record


def test_record_order_and_forgetting() -> None:
    record = TopologyRecord()
    record.add_exchange(RecordedExchange("x", "topic", arguments={"alternate-exchange": "ae"}))
    record.add_exchange(RecordedExchange("y"))
    record.add_queue(RecordedQueue("q1"))
    record.add_queue(RecordedQueue("q2", arguments={"x-message-ttl": 5}))
    record.add_binding(RecordedBinding("x", "q1", "a"))
    record.add_binding(RecordedBinding("x", "q1", "a"))  # the same binding: kept once
    record.add_binding(RecordedBinding("x", "q1", "a", {"x-match": "all"}))  # another one
    record.add_binding(RecordedBinding("x", "y", "b", destination_type="exchange"))
    record.add_binding(RecordedBinding("y", "q2"))
    assert [e.name for e in record.exchanges] == ["x", "y"]
    assert [q.name for q in record.queues] == ["q1", "q2"]
    assert len(record.bindings) == 4 and len(record) == 8
    assert [type(item).__name__ for item in record][:3] == [
        "RecordedExchange",
        "RecordedExchange",
        "RecordedQueue",
    ]
    # Re-recording replaces in place.
    record.add_exchange(RecordedExchange("x", "fanout"))
    assert [e.type for e in record.exchanges] == ["fanout", "direct"]
    record.forget_queue("q1")
    assert [b.destination for b in record.bindings] == ["y", "q2"]
    record.forget_exchange("y")  # source of one binding, destination of another
    assert len(record.bindings) == 0 and record.exchange("y") is None
    record.forget_binding(RecordedBinding("nope", "nope"))
    assert "exchanges=1 queues=1 bindings=0" in repr(record)
    record.clear()
    assert len(record) == 0


def test_record_copies_arguments_and_renames() -> None:
    args = {"x-message-ttl": 5}
    record = TopologyRecord()
    record.add_queue(RecordedQueue("amq.gen-1", exclusive=True, arguments=args, server_named=True))
    record.add_queue(RecordedQueue("later"))
    args["x-message-ttl"] = 6
    assert record.queue("amq.gen-1").arguments == {"x-message-ttl": 5}  # type: ignore[union-attr]
    record.add_binding(RecordedBinding("x", "amq.gen-1", "k"))
    record.rename_queue("amq.gen-1", "amq.gen-2")
    assert [q.name for q in record.queues] == ["amq.gen-2", "later"]
    assert record.bindings[0].destination == "amq.gen-2"
    record.rename_queue("missing", "x")
    assert [q.name for q in record.queues] == ["amq.gen-2", "later"]


def test_redeclare_queue_follows_a_server_named_queue_and_rebinds_it() -> None:
    calls: list[tuple[Any, ...]] = []

    class Reply:
        queue = "amq.gen-new"

    class Channel:
        async def queue_declare(self, queue: str, **kwargs: Any) -> Reply:
            calls.append(("declare", queue, kwargs["exclusive"], kwargs["arguments"]))
            return Reply()

        async def queue_bind(
            self, queue: str, exchange: str, routing_key: str = "", **kwargs: Any
        ) -> None:
            calls.append(("bind", queue, exchange, routing_key))

    record = TopologyRecord()
    record.add_queue(
        RecordedQueue("amq.gen-old", exclusive=True, arguments={"x-a": 1}, server_named=True)
    )
    record.add_binding(RecordedBinding("x", "amq.gen-old", "k"))
    assert asyncio.run(redeclare_queue(record, Channel(), "amq.gen-old")) == "amq.gen-new"  # type: ignore[arg-type]
    assert calls == [("declare", "", True, {"x-a": 1}), ("bind", "amq.gen-new", "x", "k")]
    assert record.queue("amq.gen-new") is not None
    assert asyncio.run(redeclare_queue(record, Channel(), "unknown")) is None  # type: ignore[arg-type]
