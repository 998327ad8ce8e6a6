"""Operations without a broker: Policy validation, policies in Topology documents and
diff (precedence of policy vs queue argument), the management client's request and
error handling, the shovel's endpoints and options, API twins."""

from __future__ import annotations

import inspect
import sys

import pytest

from rabbitry import AsyncConnection, ManagementError, ManagementNotFound
from rabbitry.exceptions import (
    ConfigurationError,
    LocalProtocolError,
    TopologyError,
    TopologyValidationError,
)
from rabbitry.management import AsyncManagementClient, ManagementClient, MissingExtraError, _ops
from rabbitry.shovel import AsyncShovel, Endpoint, Shovel, parse_destination, parse_source
from rabbitry.topology import (
    ARGUMENT_WINS,
    LOWER_WINS,
    MODULUS_HASH,
    PLUGIN_EXCHANGE_TYPES,
    Binding,
    Exchange,
    Policy,
    Queue,
    Topology,
)
from rabbitry.topology._policy import broker_policies

# --------------------------------------------------------------------------- Policy


def test_policy_accepts_the_documented_keys() -> None:
    policy = Policy(
        "limits",
        "^orders\\.",
        apply_to="queues",
        definition={
            "message-ttl": 60000,
            "expires": 1,
            "dead-letter-exchange": "",
            "dead-letter-routing-key": "dead",
            "max-length": 0,
            "max-length-bytes": 10,
            "overflow": "reject-publish-dlx",
            "queue-mode": "lazy",
            "delivery-limit": 3,
            "max-age": "7D",
        },
        priority=-1,
    )
    assert policy.label == "policy 'limits'"
    assert Policy("ae", ".*", apply_to="exchanges", definition={"alternate-exchange": "u"})
    unlimited = Policy("dl", ".*", apply_to="quorum_queues", definition={"delivery-limit": -1})
    assert unlimited.definition == {"delivery-limit": -1}


@pytest.mark.parametrize(
    ("changes", "field", "rule"),
    [
        ({"name": ""}, "name", "must not be empty"),
        ({"pattern": "("}, "pattern", "valid regular expression"),
        ({"pattern": None}, "pattern", "must be a str"),
        ({"apply_to": "queue"}, "apply_to", "must be one of all, queues, exchanges"),
        ({"priority": True}, "priority", "must be an integer"),
        ({"priority": 1.5}, "priority", "must be an integer"),
        ({"definition": {}}, "definition", "at least one key"),
        ({"definition": {"x-message-ttl": 1}}, "definition['x-message-ttl']", "no 'x-' prefix"),
        ({"definition": {"mesage-ttl": 1}}, "definition['mesage-ttl']", "unknown policy key"),
        ({"definition": {"message-ttl": -1}}, "definition['message-ttl']", "0..4294967295"),
        ({"definition": {"message-ttl": 2**32}}, "definition['message-ttl']", "0..4294967295"),
        ({"definition": {"message-ttl": "60"}}, "definition['message-ttl']", "integer"),
        ({"definition": {"expires": 0}}, "definition['expires']", "1..4294967295"),
        ({"definition": {"max-length": True}}, "definition['max-length']", "integer >= 0"),
        ({"definition": {"overflow": "drop"}}, "definition['overflow']", "drop-head"),
        ({"definition": {"queue-mode": "fast"}}, "definition['queue-mode']", "default, lazy"),
        ({"definition": {"max-age": "7 days"}}, "definition['max-age']", "unit"),
        ({"definition": {"dead-letter-exchange": 1}}, "definition['dead-letter-exchange']",
         "must be a str"),
        ({"definition": {"dead-letter-exchange": "x" * 256}},
         "definition['dead-letter-exchange']", "255"),
        ({"definition": {"ha-mode": "all"}}, "definition['ha-mode']", "removed in RabbitMQ 4.0"),
        ({"definition": {"ha-params": 2}}, "definition['ha-params']", "removed in RabbitMQ 4.0"),
        ({"definition": {"delivery-limit": -2}}, "definition['delivery-limit']", "or -1"),
        ({"definition": {"delivery-limit": "20"}}, "definition['delivery-limit']", "or -1"),
        ({"apply_to": "exchanges", "definition": {"message-ttl": 1}},
         "definition['message-ttl']", "queue key"),
        ({"apply_to": "queues", "definition": {"alternate-exchange": "u"}},
         "definition['alternate-exchange']", "exchange key"),
        ({"definition": {"shards-per-node": 0}}, "definition['shards-per-node']", ">= 1"),
        ({"definition": {"shards-per-node": "2"}}, "definition['shards-per-node']", "integer"),
        ({"definition": {"shards-per-node": 2, "routing-key": 7}},
         "definition['routing-key']", "must be a str"),
        ({"definition": {"routing-key": "k"}}, "definition['routing-key']",
         "needs 'shards-per-node'"),
        ({"apply_to": "queues", "definition": {"shards-per-node": 2}},
         "definition['shards-per-node']", "exchange key"),
    ],
)  # fmt: skip
def test_policy_rules_name_the_field(changes: dict[str, object], field: str, rule: str) -> None:
    values: dict[str, object] = {"name": "p", "pattern": ".*", "definition": {"max-length": 1}}
    values.update(changes)
    with pytest.raises(TopologyValidationError) as caught:
        Policy(**values)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert rule in caught.value.rule
    assert caught.value.entity.startswith("policy ")


def test_sharding_policy_keys_and_with_sharding() -> None:
    sharding = Policy(
        "s", "^img$", apply_to="exchanges", definition={"shards-per-node": 2, "routing-key": "k"}
    )
    assert sharding.definition == {"shards-per-node": 2, "routing-key": "k"}
    topology = Topology(exchanges=[Exchange("img.x", MODULUS_HASH)]).with_sharding("img.x", 4)
    (policy,) = topology.policies
    assert (policy.name, policy.apply_to, policy.definition) == (
        "img.x.sharding",
        "exchanges",
        {"shards-per-node": 4},
    )
    assert policy.applies_to_exchange("img.x") and not policy.applies_to_exchange("imgXx")
    assert topology.sharded_exchanges() == {"img.x": 4}
    # A higher-priority policy without the key unshards it, as on the broker.
    other = Policy("o", ".*", apply_to="exchanges", definition={"alternate-exchange": "u"},
                   priority=5)  # fmt: skip
    assert (topology + Topology(policies=[other])).sharded_exchanges() == {}
    with pytest.raises(TopologyValidationError, match="not in this topology"):
        Topology().with_sharding("img.x", 1)
    with pytest.raises(TopologyValidationError) as caught:
        topology + Topology(queues=[Queue("q")], bindings=[Binding("amq.direct", "img.x", "k")])
    assert caught.value.field == "destination" and "sharded exchange" in caught.value.rule
    assert PLUGIN_EXCHANGE_TYPES[MODULUS_HASH] == "rabbitmq_sharding"


def test_broker_policies_keep_what_the_broker_accepted(caplog: pytest.LogCaptureFixture) -> None:
    with broker_policies():
        policy = Policy("fed", ".*", definition={"federation-upstream-set": "all", "new-key": 1})
        odd = Policy("odd", ".*", definition={"message-ttl": -5, "delivery-limit": -3})
        mirrored = Policy("ha", ".*", definition={"ha-mode": "all", "ha-sync-mode": "automatic"})
    assert policy.definition == {"federation-upstream-set": "all", "new-key": 1}
    # A value rabbitry's checks refuse is kept with a warning: reading the vhost goes on.
    assert odd.definition == {"message-ttl": -5, "delivery-limit": -3}
    assert mirrored.definition == {"ha-mode": "all", "ha-sync-mode": "automatic"}
    warnings = [r.getMessage() for r in caplog.records if r.name == "rabbitry.topology"]
    assert any("definition['message-ttl']" in w and "kept" in w for w in warnings)
    assert any("definition['delivery-limit']" in w for w in warnings)
    assert any("definition['ha-mode']" in w and "removed in RabbitMQ 4.0" in w for w in warnings)
    with pytest.raises(TopologyValidationError, match="unknown policy key"):
        Policy("fed", ".*", definition={"new-key": 1})
    with pytest.raises(TopologyValidationError, match="message-ttl"):
        Policy("bad", ".*", definition={"message-ttl": -5})


def test_policy_matching() -> None:
    policy = Policy("p", "^jobs\\.", apply_to="queues", definition={"max-length": 1})
    assert policy.applies_to_queue("jobs.a") and not policy.applies_to_queue("other")
    assert not policy.applies_to_exchange("jobs.a")
    quorum_only = Policy("q", ".*", apply_to="quorum_queues", definition={"delivery-limit": 1})
    assert quorum_only.applies_to_queue("x", "quorum")
    assert not quorum_only.applies_to_queue("x", "classic")
    assert not quorum_only.applies_to_queue("x")


# --------------------------------------------------------------------------- Topology


TTL = Policy("ttl", "^jobs", apply_to="queues", definition={"message-ttl": 500})


def test_topology_holds_policies_and_round_trips() -> None:
    topology = Topology(queues=[Queue("jobs")], policies=[TTL, TTL])
    assert topology.policies == (TTL,) and len(topology) == 2
    assert topology.policy("ttl") is TTL and topology.policy("nope") is None
    assert (topology + Topology(policies=[TTL])).policies == (TTL,)
    other = Policy("ttl", "^jobs", definition={"message-ttl": 1})
    with pytest.raises(TopologyValidationError, match="defined twice"):
        Topology(policies=[TTL, other])
    as_dict = topology.to_dict()
    assert as_dict["policies"] == [
        {"name": "ttl", "pattern": "^jobs", "apply_to": "queues",
         "definition": {"message-ttl": 500}}
    ]  # fmt: skip
    assert Topology.from_dict(as_dict) == topology
    assert Topology.from_json(topology.to_json()) == topology
    exported = topology.to_definitions("v")
    assert exported["policies"] == [
        {"vhost": "v", "name": "ttl", "pattern": "^jobs", "apply-to": "queues",
         "definition": {"message-ttl": 500}, "priority": 0}
    ]  # fmt: skip
    assert Topology.from_definitions(exported, "v") == topology
    assert Topology.from_definitions(exported, "other").policies == ()
    with pytest.raises(TopologyValidationError, match="unknown field"):
        Topology.from_dict({"policies": [{"name": "p", "pattern": ".*", "apply-to": "all"}]})


def test_diff_reports_policy_differences() -> None:
    ours = Topology(policies=[TTL])
    assert ours.diff(Topology()) == ["policy 'ttl': missing"]
    changed = Policy("ttl", "^jobs", apply_to="all", definition={"message-ttl": 900}, priority=1)
    assert ours.diff(Topology(policies=[changed])) == [
        "policy 'ttl': apply-to: ours 'queues', theirs 'all'",
        "policy 'ttl': priority: ours 0, theirs 1",
        "policy 'ttl': message-ttl: ours 500, theirs 900",
    ]
    extra = Policy("extra", ".*", definition={"max-length": 1})
    assert Topology().diff(Topology(policies=[extra])) == ["policy 'extra': not in ours"]
    assert Topology().diff(Topology(policies=[extra]), extra=False) == []


@pytest.mark.parametrize(
    ("queue", "definition", "winner", "effective", "rule"),
    [
        (Queue("jobs", message_ttl=1000), {"message-ttl": 500}, "policy", 500, "lower"),
        (Queue("jobs", message_ttl=100), {"message-ttl": 500}, "argument", 100, "lower"),
        (Queue("jobs", max_length=5), {"max-length": 50}, "argument", 5, "lower"),
        (Queue("jobs", expires=5000), {"expires": 10}, "policy", 10, "lower"),
        (Queue("jobs", dead_letter_exchange="a"), {"dead-letter-exchange": "b"}, "argument",
         "a", "queue argument wins"),
        (Queue("jobs", overflow="drop-head"), {"overflow": "reject-publish"}, "argument",
         "drop-head", "queue argument wins"),
        (Queue("jobs", queue_type="quorum", expires=5000), {"expires": 9000}, "policy", 9000,
         "quorum"),
        (Queue("jobs", arguments={"x-max-age": "1D"}), {"max-age": "7D"}, "unknown", None,
         "no documented rule"),
        # RabbitMQ 4.0's unlimited (-1) yields to any finite limit, from either side.
        (Queue("jobs", queue_type="quorum", delivery_limit=-1), {"delivery-limit": 5}, "policy",
         5, "-1 is unlimited"),
        (Queue("jobs", queue_type="quorum", delivery_limit=5), {"delivery-limit": -1},
         "argument", 5, "-1 is unlimited"),
        (Queue("jobs", queue_type="quorum", delivery_limit=-1), {"delivery-limit": -1},
         "argument", -1, "-1 is unlimited"),
        (Queue("jobs", queue_type="quorum", delivery_limit=7), {"delivery-limit": 3}, "policy",
         3, "the lower value wins"),
    ],
)  # fmt: skip
def test_policy_argument_precedence(
    queue: Queue, definition: dict[str, object], winner: str, effective: object, rule: str
) -> None:
    policy = Policy("p", "^jobs$", apply_to="queues", definition=definition)
    (overlap,) = Topology(queues=[queue], policies=[policy]).policy_overlaps()
    assert (overlap.winner, overlap.effective) == (winner, effective)
    assert rule in overlap.rule
    assert overlap.line().startswith(f"queue 'jobs': {overlap.key}: policy 'p' sets ")


def test_precedence_tables_do_not_overlap() -> None:
    assert not set(LOWER_WINS) & set(ARGUMENT_WINS)


def test_diff_shows_overlaps_with_different_values_and_which_applies() -> None:
    queue = Queue("jobs", message_ttl=1000, max_length=10)
    policy = Policy("p", "^jobs$", apply_to="queues", definition={"message-ttl": 500,
                                                                  "max-length": 10})  # fmt: skip
    ours = Topology(queues=[queue], policies=[policy])
    assert ours.diff(ours) == [
        "queue 'jobs': message-ttl: policy 'p' sets 500, argument x-message-ttl 1000: "
        "500 applies (the lower value wins)"
    ]
    # The broker's policies count too when ours has none.
    mine = Topology(queues=[queue])
    assert mine.diff(ours, extra=False) == ours.diff(ours)
    # Only the highest-priority matching policy is in force.
    strong = Policy("strong", "^jobs", apply_to="queues", definition={"max-length": 3},
                    priority=5)  # fmt: skip
    both = Topology(queues=[queue], policies=[policy, strong])
    assert both.effective_policy("jobs") == strong
    assert [o.key for o in both.policy_overlaps()] == ["max-length"]


def test_apply_with_policies_needs_management_before_anything_is_sent() -> None:
    topology = Topology(queues=[Queue("q")], policies=[TTL])
    conn = AsyncConnection("amqp://guest:guest@127.0.0.1:1/")  # never connected

    async def run() -> None:
        await topology.aapply(conn)

    import asyncio

    with pytest.raises(TopologyError, match=r"1 policies \('ttl'\).*management="):
        asyncio.run(run())


# --------------------------------------------------------------------------- management


def test_management_client_without_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(MissingExtraError, match=r"rabbitry\[management\]") as caught:
        ManagementClient()
    assert isinstance(caught.value, ImportError)
    with pytest.raises(ImportError, match="httpx"):
        AsyncManagementClient()


def test_management_client_never_shows_the_password() -> None:
    with ManagementClient("http://admin:s3cr%40t@example.invalid:15672/prefix/") as client:
        assert client.url == "http://example.invalid:15672/prefix"
        assert client.user == "admin"
        assert "s3cr" not in repr(client) and "s3cr" not in str(vars(client))
        assert (
            repr(client) == "ManagementClient('http://example.invalid:15672/prefix', user='admin')"
        )
    with ManagementClient("http://h", "u", "p") as client:
        assert (client.user, client.url) == ("u", "http://h")


@pytest.mark.parametrize(
    ("url", "options", "match"),
    [
        ("amqp://h", {}, "http:// or https://"),
        ("", {}, "must be an http"),
        ("http://h", {"timeout": 0}, "timeout"),
        ("http://h", {"timeout": True}, "timeout"),
    ],
)
def test_management_client_options(url: str, options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ManagementClient(url, **options)  # type: ignore[arg-type]


def test_management_requests_encode_names() -> None:
    assert _ops.queue("a/b c", "/").path == "/queues/%2F/a%2Fb%20c"
    assert _ops.queues(None).path == "/queues" and _ops.queues("v 1").path == "/queues/v%201"
    assert _ops.definitions("/").path == "/definitions/%2F"
    put = _ops.put_policy(TTL, "/")
    assert (put.method, put.path) == ("PUT", "/policies/%2F/ttl")
    assert put.body == {"pattern": "^jobs", "definition": {"message-ttl": 500}, "priority": 0,
                        "apply-to": "queues"}  # fmt: skip
    with pytest.raises(TypeError, match="Policy"):
        _ops.put_policy({"name": "x"}, "/")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mapping"):
        _ops.import_definitions([], "/")  # type: ignore[arg-type]


def test_management_errors() -> None:
    error = _ops.error_for(404, '{"error":"Object Not Found","reason":"Not Found"}', "GET", "/x")
    assert isinstance(error, ManagementNotFound) and error.status == 404
    assert str(error) == "GET /x: HTTP 404: Object Not Found: Not Found"
    bad = _ops.error_for(400, '{"error":"bad_request","reason":"Validation failed"}', "PUT", "/p")
    assert type(bad) is ManagementError and bad.reason == "bad_request: Validation failed"
    plain = _ops.error_for(500, "oops", "GET", "/y")
    assert plain.reason == "oops"
    import pickle

    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ManagementNotFound and again.status == 404


def test_queue_info_from_the_api() -> None:
    info = _ops.queue_from_api(
        {"name": "q", "vhost": "/", "type": "quorum", "durable": True, "arguments": {},
         "messages": 7, "messages_ready": 5, "messages_unacknowledged": 2, "consumers": 1,
         "policy": "p", "effective_policy_definition": {"max-length": 9},
         "message_stats": {"publish_details": {"rate": 2.5}}}
    )  # fmt: skip
    assert (info.messages, info.messages_ready, info.consumers) == (7, 5, 1)
    assert (info.publish_rate, info.deliver_rate, info.type, info.policy) == (
        2.5,
        0.0,
        "quorum",
        "p",
    )
    sparse = _ops.queue_from_api({"name": "q"})
    assert (sparse.messages, sparse.type, sparse.policy) == (0, "classic", None)


def _signature(cls: type, name: str) -> inspect.Signature:
    return inspect.signature(getattr(cls, name))


@pytest.mark.parametrize(
    ("sync", "async_"), [(ManagementClient, AsyncManagementClient), (Shovel, AsyncShovel)]
)
def test_twins_have_the_same_methods_and_signatures(sync: type, async_: type) -> None:
    # Methods only: tests/unit/test_api_twins.py compares every member, including the
    # configuration that is an instance attribute on one twin and a property on the other.
    def public(cls: type) -> set[str]:
        return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}

    assert public(sync) == public(async_)
    for name in public(sync) | {"__init__"}:
        member = getattr(sync, name)
        if not callable(member):
            continue
        assert _signature(sync, name) == _signature(async_, name), name
        if name not in ("__init__", "stop"):  # the I/O methods are awaitable on the twin
            assert inspect.iscoroutinefunction(getattr(async_, name)), name
            assert not inspect.iscoroutinefunction(member), name


# --------------------------------------------------------------------------- shovel


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("amqp://u:p@h:5673/jobs", Endpoint("amqp://u:p@h:5673/%2F", "jobs")),
        ("amqp://h/%2F/jobs", Endpoint("amqp://h/%2F", "jobs")),
        ("amqp://h/v1/jobs?heartbeat=5", Endpoint("amqp://h/v1?heartbeat=5", "jobs")),
        ("amqp://h/v%2Fx/a%2Fb", Endpoint("amqp://h/v%2Fx", "a/b")),
        ("jobs", Endpoint("amqp://g:g@base/vh", "jobs")),
    ],
)
def test_parse_source(text: str, endpoint: Endpoint) -> None:
    assert parse_source(text, "amqp://g:g@base/vh") == endpoint


@pytest.mark.parametrize(
    ("text", "endpoint"),
    [
        ("amqp://h/orders", Endpoint("amqp://h/%2F", "orders", None)),
        ("amqp://h/v1/orders", Endpoint("amqp://h/v1", "orders", None)),
        ("amqp://h/v1/orders/new.key", Endpoint("amqp://h/v1", "orders", "new.key")),
        ("amqp://h/%2F//queue", Endpoint("amqp://h/%2F", "", "queue")),
        ("amqps://h/%2F/x/", Endpoint("amqps://h/%2F", "x", "")),
        ("orders", Endpoint("amqp://base/%2F", "orders", None)),
        ("orders/key", Endpoint("amqp://base/%2F", "orders", "key")),
        ("/queue", Endpoint("amqp://base/%2F", "", "queue")),
    ],
)
def test_parse_destination(text: str, endpoint: Endpoint) -> None:
    assert parse_destination(text, "amqp://base/") == endpoint


@pytest.mark.parametrize(
    ("parse", "text", "match"),
    [
        (parse_source, "http://h/q", "amqp://"),
        (parse_source, "amqp://h/a/b/c", "QUEUE"),
        (parse_source, "amqp://h/v/", "no queue"),
        (parse_source, "", "no queue"),
        (parse_destination, "amqp://h/a/b/c/d", "EXCHANGE"),
        (parse_destination, "amqp://h/%2F/", "routing key"),
        (parse_destination, "", "routing key"),
    ],
)
def test_parse_endpoint_errors(parse: object, text: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        parse(text, "amqp://base/")  # type: ignore[operator]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"count": 0}, "count"),
        ({"count": True}, "count"),
        ({"window": 0}, "window"),
        ({"idle_timeout": 0}, "idle_timeout"),
        ({"timeout": -1}, "timeout"),
        ({"routing_key": None}, "routing_key"),
    ],
)
def test_shovel_options(options: dict[str, object], match: str) -> None:
    values: dict[str, object] = {"routing_key": "q2"}
    values.update(options)
    with pytest.raises(ConfigurationError, match=match):
        Shovel("amqp://h/", "q", "amqp://h/", "", **values)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="queue"):
        AsyncShovel("amqp://h/", "", "amqp://h/", "x")


def test_shovel_repr_masks_passwords_and_starts_with_zero_stats() -> None:
    shovel = Shovel("amqp://u:secret@h/", "q", "amqp://v:other@k/", "x")
    assert "secret" not in repr(shovel) and "other" not in repr(shovel)
    assert repr(shovel).startswith("<Shovel amqp://u:***@h")
    assert shovel.stats.moved == 0 and shovel.stats.as_dict()["possible_duplicates"] == 0


def test_apply_refuses_the_wrong_kind_of_management_client() -> None:
    import asyncio

    topology = Topology(policies=[TTL])
    conn = AsyncConnection("amqp://guest:guest@127.0.0.1:1/")
    with ManagementClient("http://h") as sync_client:

        async def run() -> None:
            await topology.aapply(conn, management=sync_client)  # type: ignore[arg-type]

        with pytest.raises(TypeError, match="AsyncManagementClient"):
            asyncio.run(run())


def test_policy_overlaps_count_the_other_sides_policies() -> None:
    queue = Queue("jobs", max_length=10)
    policy = Policy("b", "^jobs$", apply_to="queues", definition={"max-length": 10})
    broker = Topology(policies=[policy])
    mine = Topology(queues=[queue])
    assert mine.policy_overlaps() == []
    (overlap,) = mine.policy_overlaps(broker)
    assert (overlap.policy, overlap.effective, overlap.winner) == ("b", 10, "argument")
    assert mine.diff(broker + mine, extra=False) == []  # the same value: no difference
    assert mine.policy_overlaps(broker.to_definitions("v"), vhost="v") == [overlap]
    # Our own policy of the same name replaces the other side's.
    ours = Topology(
        queues=[queue], policies=[Policy("b", "^nothing$", definition={"max-length": 1})]
    )
    assert ours.policy_overlaps(broker) == []


def test_a_shovel_runs_once() -> None:
    import asyncio

    from rabbitry import AMQPConnectionError
    from rabbitry.exceptions import InvalidStateError

    shovel = AsyncShovel("amqp://g:g@127.0.0.1:1/", "q", "amqp://g:g@127.0.0.1:1/", "x",
                         timeout=2)  # fmt: skip
    with pytest.raises(AMQPConnectionError):
        asyncio.run(shovel.run())
    with pytest.raises(InvalidStateError, match="runs once"):
        asyncio.run(shovel.run())


def test_management_client_takes_a_ca_bundle_path(tmp_path: object) -> None:
    import pathlib

    import trustme

    ca = trustme.CA()
    bundle = pathlib.Path(str(tmp_path)) / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    with ManagementClient("https://broker.example:15671", verify=str(bundle)) as client:
        assert client.url == "https://broker.example:15671"


def test_publish_request_is_built_and_validated_without_io() -> None:
    from rabbitry.protocol.spec import BasicProperties

    request = _ops.publish(
        "", "jobs", b"\x00\xff", BasicProperties(headers={"n": 1}), True, 1500, "/"
    )
    assert (request.method, request.path, request.reads_answer) == (
        "POST",
        "/exchanges/%2F/amq.default/publish",
        True,
    )
    assert request.body == {
        "properties": {"headers": {"n": 1}, "delivery_mode": 2, "expiration": "1500"},
        "routing_key": "jobs",
        "payload": "AP8=",
        "payload_encoding": "base64",
    }
    assert _ops.publish("x y", "k", "text", None, None, None, "v/h").body["payload_encoding"] == (
        "string"
    )
    assert request.parse({"routed": False}) is False
    with pytest.raises(ManagementError, match="no 'routed' flag"):
        request.parse({})
    with pytest.raises(LocalProtocolError, match=r"^basic\.properties\.priority"):
        _ops.publish("", "q", b"", BasicProperties(priority=300), None, None, "/")
