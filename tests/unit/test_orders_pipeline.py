"""The reference pipeline's pure parts: the event generator, the config, the CLI checks.

The pipeline itself runs in tests/spark/test_orders_pipeline.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orders_pipeline import (
    FAULT_HEADER,
    Mix,
    PipelineConfig,
    PipelineError,
    Summary,
    build_topology,
    generate,
    main,
)
from orders_pipeline._events import RATES_TO_EUR
from orders_pipeline._partitions import routing_key
from orders_pipeline._pipeline import _check_partitions_read, source_options, steady_batches
from orders_pipeline._report import summary_rows
from rabbitry.exceptions import ConfigurationError
from rabbitry.topology import SuperStream


def test_generator_is_deterministic_and_mixes_every_fault() -> None:
    a = generate(5000, run_id="r", seed=3)
    b = generate(5000, run_id="r", seed=3)
    assert a.events == b.events
    assert len(a.events) == 5000
    for kind in ("ok", "malformed", "invalid", "transient", "poison", "unroutable"):
        assert a.kinds[kind] > 0, kind
    assert a.duplicates == a.kinds["duplicate"] > 0
    assert generate(5000, run_id="r", seed=4).events != a.events


def test_generator_events_match_their_kind() -> None:
    plan = generate(3000, run_id="r", seed=1)
    ids = [e.message_id for e in plan.unique]
    assert len(ids) == len(set(ids))
    originals = {e.message_id: e for e in plan.unique}
    for event in plan.events:
        if event.duplicate:  # same id, body and fault as an earlier original
            original = originals[event.message_id]
            assert (event.body, event.fault, event.routing_key) == (
                original.body,
                original.fault,
                original.routing_key,
            )
            assert original.kind != "unroutable"
            continue
        if event.kind == "malformed":
            with pytest.raises(ValueError):
                json.loads(event.body)
            continue
        order = json.loads(event.body)
        if event.kind == "invalid":
            assert (
                order.get("amount", 1) <= 0
                or order.get("currency") not in RATES_TO_EUR
                or "category" not in order
                or order.get("ts") == "yesterday"
            )
        else:
            assert order["amount"] > 0 and order["currency"] in RATES_TO_EUR
        assert event.fault == (event.kind if event.kind in ("transient", "poison") else None)
        assert event.routing_key.startswith(
            "legacy.order." if event.kind == "unroutable" else "order.created."
        )
    assert plan.valid_ids.isdisjoint(plan.parked_ids)
    unroutable = {e.message_id for e in plan.events if e.kind == "unroutable"}
    assert len(plan.valid_ids) + len(plan.parked_ids) + len(unroutable) == len(plan.unique)
    revenue = plan.revenue()
    assert sum(count for _, count in revenue.values()) == len(plan.valid_ids)
    assert FAULT_HEADER == "x-demo-fault"


def test_no_faults_means_only_clean_orders() -> None:
    plan = generate(
        500, run_id="r", mix=Mix(malformed=0, invalid=0, transient=0, poison=0, unroutable=0,
                                 duplicates=0),
    )  # fmt: skip
    assert {e.kind for e in plan.events} == {"ok"}
    assert plan.duplicates == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"events": 0}, "events"),
        ({"events": True}, "events"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 40_000}, "batch_size"),
        ({"run_id": "a b"}, "run_id"),
        ({"prefix": ""}, "prefix"),
        ({"timeout": 0}, "timeout"),
        ({"mix": Mix(invalid=-1)}, "mix.invalid"),
        ({"mix": Mix(malformed=60, invalid=50)}, "mix"),
        ({"partitions": 0}, "partitions"),
        ({"partitions": -2}, "partitions"),
        ({"partitions": True}, "partitions"),
        ({"partitions": "4"}, "partitions"),
        ({"dedup_window": 0}, "dedup_window"),
        ({"dedup_window": 0.5}, "dedup_window"),
        ({"dedup_window": 8 * 86_400}, "dedup_window"),
        ({"dedup_window": True}, "dedup_window"),
        ({"dedup_window": "600"}, "dedup_window"),
    ],
)
def test_config_errors_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field}"):
        PipelineConfig(**options)  # type: ignore[arg-type]


def test_config_checks_the_url_and_the_retry_policy() -> None:
    with pytest.raises(ValueError):
        PipelineConfig(url="http://nope/")
    with pytest.raises(ValueError, match="max_attempts"):
        PipelineConfig(max_attempts=0)


def test_topology_has_alternate_exchange_retry_tiers_and_parking_lot() -> None:
    config = PipelineConfig(run_id="abc", prefix="p")
    names = config.names
    topology = build_topology(names, config.policy)
    exchange = topology.exchange(names.exchange)
    assert exchange is not None
    assert exchange.type == "topic" and exchange.alternate_exchange == names.unrouted_exchange
    queue_names = {q.name for q in topology.queues}
    assert {
        names.work,
        names.unrouted,
        f"{names.work}.retry.1s",
        f"{names.work}.retry.3s",
        f"{names.work}.parking-lot",
    } <= queue_names
    assert PipelineConfig(run_id="x", output_dir="out").run_dir == Path("out", "x")


def test_main_says_java_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert main(["-n", "10"]) == 2
    err = capsys.readouterr().err
    assert "Java runtime (17 or newer)" in err and "openjdk-17" in err


# main() checks that pyspark and pyarrow import before it reads the arguments.
@pytest.mark.spark
def test_main_rejects_bad_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("orders_pipeline.java_problem", lambda: None)
    assert main(["-n", "0"]) == 2
    assert "events: must be an integer >= 1" in capsys.readouterr().err


# main() checks that pyspark and pyarrow import before it reads the arguments.
@pytest.mark.spark
def test_main_rejects_a_partition_count_below_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("orders_pipeline.java_problem", lambda: None)
    assert main(["--partitions", "0"]) == 2
    err = capsys.readouterr().err
    assert "partitions: must be an integer >= 1" in err and "got 0" in err
    with pytest.raises(SystemExit) as exited:
        main(["--partitions", "four"])
    assert exited.value.code == 2
    assert "argument --partitions" in capsys.readouterr().err


# main() checks that pyspark and pyarrow import before it reads the arguments.
@pytest.mark.spark
def test_main_rejects_a_dedup_window_under_a_second(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("orders_pipeline.java_problem", lambda: None)
    assert main(["--dedup-window", "0.2"]) == 2
    err = capsys.readouterr().err
    assert "dedup_window: must be a number of seconds in 1..604800" in err and "got 0.2" in err


def test_every_event_has_its_customer_and_a_duplicate_keeps_it() -> None:
    plan = generate(3000, run_id="r", seed=2)
    originals = {e.message_id: e for e in plan.unique}
    for event in plan.events:
        assert event.customer.startswith("c-") and len(event.customer) == 7
        if event.duplicate:
            assert event.customer == originals[event.message_id].customer
        elif event.kind != "malformed":
            assert json.loads(event.body)["customer"] == event.customer


def test_default_run_reads_the_work_queue() -> None:
    config = PipelineConfig(run_id="abc", prefix="p", batch_size=500)
    assert config.partitions is None and config.super_stream is None
    assert source_options(config) == [{"queue": "p.abc.work", "maxMessagesPerBatch": "500"}]


def test_partitioned_run_reads_every_partition_and_the_retries() -> None:
    config = PipelineConfig(run_id="abc", prefix="p", batch_size=500, partitions=4)
    layout = config.super_stream
    assert layout is not None
    assert layout.name == config.names.exchange == "p.abc.orders"
    assert layout.queues == tuple(f"p.abc.orders-{i}" for i in range(4))
    assert source_options(config) == [
        {
            "superStream": "p.abc.orders",
            "superStreamPartitions": "4",
            "maxRecordsPerTrigger": "500",
        },
        {"queue": "p.abc.work", "maxMessagesPerBatch": "500"},
    ]


def test_partitioned_topology_replaces_the_orders_exchange_by_a_super_stream() -> None:
    config = PipelineConfig(run_id="abc", prefix="p", partitions=3)
    names, policy = config.names, config.policy
    topology = build_topology(names, policy, 3)
    exchange = topology.exchange(names.exchange)
    assert exchange is not None and exchange.type == "direct"
    assert exchange.alternate_exchange == names.unrouted_exchange
    assert (exchange.arguments or {})["x-super-stream"] is True
    for index in range(3):
        name = f"{names.exchange}-{index}"
        queue = topology.queue(name)
        assert queue is not None and queue.queue_type == "stream"
        bound = [(b.source, b.routing_key) for b in topology.bindings if b.destination == name]
        assert bound == [(names.exchange, str(index))]
    # The work queue only gets the retries back from the retry tiers, as by default.
    assert [
        (b.source, b.routing_key) for b in topology.bindings if b.destination == names.work
    ] == [(policy.names().dlx, names.work)]
    default = build_topology(names, policy)
    for name in (*policy.names().retry_queues, policy.names().parking_lot or "", names.work):
        assert topology.queue(name) == default.queue(name), name
    assert topology.queue(names.unrouted) is not None
    # The default topology is unchanged.
    assert build_topology(names, policy, None) == default
    assert all(q.queue_type != "stream" for q in default.queues)


def test_orders_are_published_to_their_customers_partition() -> None:
    layout = SuperStream("p.abc.orders", 4)
    plan = generate(2000, run_id="r", seed=5)
    partitions: dict[str, set[str]] = {}
    for event in plan.events:
        key = routing_key(layout, event)
        if event.kind == "unroutable":  # a legacy key, which no partition binds
            assert key == event.routing_key and key.startswith("legacy.order.")
            continue
        assert key == layout.binding_key_for(event.customer)
        partitions.setdefault(event.customer, set()).add(key)
    assert all(len(keys) == 1 for keys in partitions.values())
    assert {k for keys in partitions.values() for k in keys} == {"0", "1", "2", "3"}


def test_the_summary_names_the_super_stream_of_a_partitioned_run() -> None:
    names = PipelineConfig(run_id="abc", prefix="p").names
    default = [what for what, _, _ in summary_rows(Summary("abc", names))]
    assert not any("super stream" in what for what in default)
    rows = summary_rows(Summary("abc", names, partitions=4))
    assert rows[rows.index(next(r for r in rows if r[0].startswith("consumed"))) + 1] == (
        "  source: super stream",
        "4 partitions",
        "p.abc.orders",
    )
    assert len(rows) == len(default) + 1


def test_a_partitioned_run_fails_when_routed_messages_were_not_read() -> None:
    config = PipelineConfig(run_id="abc", prefix="p", partitions=2)
    layout = config.super_stream
    assert layout is not None
    summary = Summary("abc", config.names, confirmed=100, unroutable=3, retried=5, consumed=102)
    _check_partitions_read(summary, layout)  # 97 orders + 5 retries, all read
    summary.consumed = 101
    with pytest.raises(PipelineError, match=r"^1 of the 102 message\(s\) routed to the partitions"):
        _check_partitions_read(summary, layout)


def test_the_steady_rate_leaves_out_the_first_batch_with_rows() -> None:
    # Batch 0 had no rows (the query started before publishing); batch 1 carried Spark's
    # start-up; empty batches count nowhere.
    progress = {3: (300, 2.0), 0: (0, 0.5), 1: (100, 10.0), 2: (0, 0.3), 4: (200, 1.0)}
    assert steady_batches(progress) == (500, 3.0)
    assert steady_batches({}) == (0, 0)
    assert steady_batches({0: (0, 1.0), 1: (50, 4.0)}) == (0, 0)


def test_the_summary_shows_the_rate_after_the_first_batch() -> None:
    names = PipelineConfig(run_id="abc", prefix="p").names
    summary = Summary("abc", names, steady_rows=30_000, steady_seconds=2.5)
    rows = {what.strip(): (number, note) for what, number, note in summary_rows(summary)}
    assert rows["after the first batch"] == ("2.5 s", "12,000 msg/s, 30,000 rows")
