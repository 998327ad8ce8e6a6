"""The ``rabbitry`` command line against the real broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner, Result

import rabbitry
from rabbitry import observability
from rabbitry.cli._app import cli
from rabbitry.cli._exit import ExitCode
from rabbitry.topology import (
    ATTEMPTS_HEADER,
    EXCEPTION_MESSAGE_HEADER,
    EXCEPTION_TYPE_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    PARKED_REASON_HEADER,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.integration

_ROOT = Path(__file__).resolve().parents[2]


class Broker:
    """A sync connection for setting up and checking; deletes what it was told about."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = rabbitry.Connection(url, connection_timeout=5)
        self.conn.connect(timeout=10)
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def name(self, suffix: str) -> str:
        return f"rabbitry-test-cli-{uuid.uuid4().hex[:8]}-{suffix}"

    def queue(self, name: str, **kwargs: Any) -> str:
        self.queues.append(name)
        self.conn.channel().queue_declare(name, **kwargs)
        return name

    def count(self, queue: str) -> int:
        ch = self.conn.channel()
        try:
            return ch.queue_declare(queue, passive=True).message_count
        finally:
            ch.close()

    def settled(self, queue: str, expected: int, timeout: float = 10.0) -> int:
        """The ready count once it is ``expected`` (or after ``timeout``): messages a CLI
        run took without acking come back when its channel closes, asynchronously."""
        deadline = time.monotonic() + timeout
        count = self.count(queue)
        while count != expected and time.monotonic() < deadline:
            time.sleep(0.05)
            count = self.count(queue)
        return count

    def publish(self, queue: str, body: bytes, headers: dict[str, Any]) -> None:
        with self.conn.publisher(confirm=True, mandatory=True) as pub:
            pub.publish(
                body,
                routing_key=queue,
                properties=rabbitry.Properties(headers=headers, message_id=body.decode()),
            ).result(10)

    def exists(self, queue: str) -> bool:
        ch = self.conn.channel()
        try:
            ch.queue_declare(queue, passive=True)
        except rabbitry.NotFound:
            return False
        ch.close()
        return True

    def cleanup(self) -> None:
        for kind, names in (("queue", self.queues), ("exchange", self.exchanges)):
            for name in names:
                ch = self.conn.channel()
                try:
                    if kind == "queue":
                        ch.queue_delete(name)
                    else:
                        ch.exchange_delete(name)
                    ch.close()
                except rabbitry.NotFound:
                    pass
        self.conn.close()


@pytest.fixture
def broker(url: str) -> Iterator[Broker]:
    b = Broker(url)
    yield b
    b.cleanup()


def invoke(url: str, *args: str, input: str | None = None) -> Result:
    runner = CliRunner()
    return runner.invoke(cli, ["--url", url, "--timeout", "10", *args], input=input)


def test_publish_with_headers_then_consume_json(url: str, broker: Broker) -> None:
    queue = broker.queue(broker.name("q"))
    result = invoke(
        url, "publish", "-k", queue, "-H", "tenant=acme", "-H", "n:=7",
        "--content-type", "text/plain", "--count", "5", "one", "two",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "5 confirmed" in result.stdout
    assert broker.count(queue) == 5

    # --no-ack is a peek: everything stays.
    peek = invoke(url, "--json", "consume", queue, "--count", "5", "--no-ack")
    assert peek.exit_code == 0, peek.output
    assert broker.count(queue) == 5

    result = invoke(url, "--json", "consume", queue, "--count", "5", "--idle", "5")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["body"] for r in records] == ["one", "two", "one", "two", "one"]
    for record in records:
        assert record["headers"] == {"tenant": "acme", "n": 7}
        assert record["properties"]["content_type"] == "text/plain"
        assert record["properties"]["delivery_mode"] == 2
        assert record["routing_key"] == queue
    assert broker.count(queue) == 0


def test_publish_from_stdin_and_file(url: str, broker: Broker, tmp_path: Path) -> None:
    queue = broker.queue(broker.name("q"))
    result = invoke(url, "--json", "publish", "-k", queue, input="a\nb\nc\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["acked"] == 3
    path = tmp_path / "bodies.txt"
    path.write_text("x\ny\n")
    result = invoke(url, "-q", "publish", "-k", queue, "--file", str(path), "--rate", "1000")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert broker.count(queue) == 5


def test_consume_fewer_than_count_before_timeout_fails(url: str, broker: Broker) -> None:
    queue = broker.queue(broker.name("q"))
    broker.publish(queue, b"only", {})
    result = invoke(url, "consume", queue, "--count", "2", "--idle", "0.5")
    assert result.exit_code == ExitCode.FAILED
    assert "got 1 of 2" in result.stderr


def test_publish_unroutable_and_missing_exchange_exit_1(url: str, broker: Broker) -> None:
    result = invoke(url, "--json", "publish", "-k", broker.name("nowhere"), "hi")
    assert result.exit_code == ExitCode.FAILED
    assert json.loads(result.stdout)["unroutable"] == 1
    result = invoke(url, "publish", "-e", broker.name("no-exchange"), "hi")
    assert result.exit_code == ExitCode.FAILED
    assert "NOT_FOUND" in result.stderr


def test_consume_missing_queue_is_a_one_line_error(url: str, broker: Broker) -> None:
    result = invoke(url, "consume", broker.name("missing"), "--count", "1")
    assert result.exit_code == ExitCode.FAILED
    assert result.stderr.startswith("rabbitry: error: NotFound")
    assert "Traceback" not in result.output


def test_topology_apply_verify_diff(
    url: str, broker: Broker, tmp_path: Path, management_url: str | None
) -> None:
    exchange = broker.name("x")
    queue = broker.name("q")
    broker.exchanges.append(exchange)
    broker.queues.append(queue)
    doc = tmp_path / "topology.yaml"
    doc.write_text(
        f"exchanges:\n  - name: {exchange}\n    type: topic\n"
        f"queues:\n  - name: {queue}\n    message_ttl: 60000\n"
        f"bindings:\n  - source: {exchange}\n    destination: {queue}\n"
        "    routing_key: 'order.*'\n"
    )
    result = invoke(url, "--json", "topology", "verify", str(doc))
    assert result.exit_code == ExitCode.FAILED
    assert not json.loads(result.stdout)["ok"]

    result = invoke(url, "topology", "apply", str(doc))
    assert result.exit_code == 0, result.output
    assert "1 exchanges, 1 queues, 1 bindings" in result.stdout

    result = invoke(url, "--json", "topology", "verify", str(doc))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["missing"] == []

    # The binding routes: a message published to the exchange reaches the queue.
    result = invoke(url, "publish", "-e", exchange, "-k", "order.new", "hello")
    assert result.exit_code == 0, result.output
    assert broker.count(queue) == 1

    result = invoke(url, "topology", "diff", str(doc), "--against", str(doc))
    assert result.exit_code == 0, result.output
    assert "matches" in result.stdout

    changed = tmp_path / "changed.json"
    changed.write_text(
        json.dumps(
            {
                "exchanges": [{"name": exchange, "type": "topic"}],
                "queues": [{"name": queue, "message_ttl": 1000}],
                "bindings": [{"source": exchange, "destination": queue, "routing_key": "order.*"}],
            }
        )
    )
    result = invoke(url, "--json", "topology", "diff", str(doc), "--against", str(changed))
    assert result.exit_code == ExitCode.FAILED
    differences = json.loads(result.stdout)["differences"]
    assert any("x-message-ttl" in line for line in differences), differences

    # Against the broker itself: needs the management plugin; without it the error is
    # a connection error (3), and never shows the password. The 4.x node of --rabbitmq4
    # has the plugin on its AMQP port + 10000, which the CLI finds by its cluster name
    # (whatever answers on 15672 belongs to another broker); on another non-default AMQP
    # port without a confirmed API, the CLI asks for --management-url (2).
    result = invoke(url, "topology", "diff", str(doc))
    if management_url is not None:
        assert result.exit_code == ExitCode.OK, result.output
        assert "matches the broker" in result.stdout
    else:
        allowed = (ExitCode.OK, ExitCode.CONNECTION, ExitCode.USAGE)
        assert result.exit_code in allowed, result.output
    params = rabbitry.parse_url(url)
    if params.password and params.password != params.username:
        assert params.password not in result.output

    # Applying a conflicting definition is exit 1 with a one-line message.
    result = invoke(url, "topology", "apply", str(changed))
    assert result.exit_code == ExitCode.FAILED
    assert "TopologyConflict" in result.stderr


def _park(broker: Broker, work: str, body: str, exception: str) -> None:
    broker.publish(
        f"{work}.parking-lot",
        body.encode(),
        {
            ORIGINAL_EXCHANGE_HEADER: "",
            ORIGINAL_ROUTING_KEY_HEADER: work,
            ATTEMPTS_HEADER: 4,
            EXCEPTION_TYPE_HEADER: exception,
            EXCEPTION_MESSAGE_HEADER: f"{body} failed",
            PARKED_REASON_HEADER: "max-attempts",
        },
    )


def test_dlq_inspect_replay_purge(url: str, broker: Broker) -> None:
    work = broker.queue(broker.name("work"))
    parking = broker.queue(f"{work}.parking-lot")
    _park(broker, work, "m1", "app.errors.BadInput")
    _park(broker, work, "m2", "builtins.ValueError")
    _park(broker, work, "m3", "app.errors.BadInput")

    result = invoke(url, "--json", "dlq", "inspect", work)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["queue"] == parking and report["message_count"] == 3
    assert [m["message_id"] for m in report["messages"]] == ["m1", "m2", "m3"]
    first = report["messages"][0]
    assert first["exception_type"] == "app.errors.BadInput"
    assert first["attempts"] == 4
    assert first["parked_reason"] == "max-attempts"
    assert first["original_routing_key"] == work
    assert broker.settled(parking, 3) == 3  # inspect removes nothing

    table = invoke(url, "dlq", "inspect", parking)
    assert table.exit_code == 0, table.output
    assert "BadInput" in table.stdout and "ValueError" in table.stdout
    assert broker.settled(parking, 3) == 3

    result = invoke(url, "--json", "dlq", "replay", work, "--filter", "exception=BadInput")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["replayed"] == 2 and summary["skipped"] == 1 and summary["remaining"] == 1
    assert broker.count(work) == 2
    assert broker.settled(parking, 1) == 1

    ch = broker.conn.channel()
    replayed = [ch.basic_get(work, no_ack=True) for _ in range(2)]
    assert [m.properties.message_id for m in replayed if m] == ["m1", "m3"]
    for message in replayed:
        assert message is not None
        assert not any(k.startswith("x-rabbitry-") for k in message.headers)
    ch.close()

    result = invoke(url, "dlq", "replay", work, "--count", "5")
    assert result.exit_code == 0, result.output
    assert "replayed 1" in result.stdout
    assert broker.count(parking) == 0
    assert broker.count(work) == 1

    # Replay to an explicit target that routes nowhere: nothing is lost, exit 1.
    _park(broker, work, "m4", "ValueError")
    result = invoke(url, "dlq", "replay", work, "--to", "", "-k", broker.name("nowhere"))
    assert result.exit_code == ExitCode.FAILED
    assert "Unroutable" in result.stderr
    assert broker.settled(parking, 1) == 1

    _park(broker, work, "m5", "ValueError")
    result = invoke(url, "dlq", "purge", work)  # no --yes, stdin is not a terminal
    assert result.exit_code == ExitCode.USAGE
    assert broker.count(parking) == 2
    result = invoke(url, "--json", "dlq", "purge", work, "--yes")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"queue": parking, "purged": 2}
    assert broker.count(parking) == 0


def test_bench_small_run_reports_numbers_and_cleans_up(url: str, broker: Broker) -> None:
    result = invoke(url, "--json", "bench", "--count", "300", "--size", "64")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["count"] == 300 and report["publish_failed"] == 0
    assert report["publish_rate"] > 0 and report["consume_rate"] > 0
    latency = report["latency_ms"]
    assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    assert not broker.exists(report["queue"])

    table = invoke(url, "bench", "-n", "100", "-s", "10")
    assert table.exit_code == 0, table.output
    assert "latency p99 ms" in table.stdout


def test_entry_point_in_a_subprocess(url: str, broker: Broker) -> None:
    queue = broker.queue(broker.name("q"))
    env = {**os.environ, "RABBITMQ_URL": url}
    script = Path(sys.executable).with_name("rabbitry")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "rabbitry.cli"]
    done = subprocess.run(
        [*command, "--json", "publish", "-k", queue, "via-entry-point"],
        env=env, capture_output=True, text=True, timeout=60, cwd=_ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["acked"] == 1
    done = subprocess.run(
        [sys.executable, "-m", "rabbitry.cli", "--json", "consume", queue, "-n", "1"],
        env=env, capture_output=True, text=True, timeout=60, cwd=_ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["body"] == "via-entry-point"


def test_wrong_password_is_exit_3_without_the_password(url: str) -> None:
    params = rabbitry.parse_url(url)
    bad = f"amqp://{params.username}:Sup3rS3cretPw@{params.address}/"
    result = CliRunner().invoke(cli, ["--url", bad, "publish", "-k", "q", "x"])
    assert result.exit_code == ExitCode.CONNECTION, result.output
    assert "Sup3rS3cretPw" not in result.output
    assert "***" in result.stderr


def test_ctrl_c_is_exit_130(url: str, broker: Broker) -> None:
    queue = broker.queue(broker.name("q"))
    env = {**os.environ, "RABBITMQ_URL": url}
    process = subprocess.Popen(
        [sys.executable, "-m", "rabbitry.cli", "consume", queue],
        env=env, cwd=_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell may start us with SIGINT ignored; the CLI must see it like a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        # Wait until the consumer is registered, so the signal hits the consume loop.
        while time.monotonic() < deadline:
            ch = broker.conn.channel()
            consumers = ch.queue_declare(queue, passive=True).consumer_count
            ch.close()
            if consumers:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == ExitCode.INTERRUPTED, err
    assert "interrupted" in err
    assert "Traceback" not in err


def test_global_options_after_the_subcommand(url: str, broker: Broker) -> None:
    queue = broker.queue(broker.name("q"))
    runner = CliRunner()
    published = runner.invoke(cli, ["publish", "-k", queue, "a", "b", "--json", "--url", url])
    assert published.exit_code == 0, published.output
    assert json.loads(published.stdout)["acked"] == 2
    args = ["consume", queue, "--count", "2", "--idle", "5", "--url", url, "--timeout", "10"]
    consumed = runner.invoke(cli, [*args, "--json"])
    assert consumed.exit_code == 0, consumed.output
    assert [json.loads(line)["body"] for line in consumed.stdout.splitlines()] == ["a", "b"]


def test_bench_with_several_producers_consumers_and_queues(url: str, broker: Broker) -> None:
    result = invoke(
        url, "--json", "bench", "-n", "600", "--producers", "2", "--consumers", "3", "--queues", "2"
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["published"] == report["consumed"] == 600
    assert report["producers"] == 2 and report["consumers"] == 3 and len(report["queues"]) == 2
    assert not any(broker.exists(queue) for queue in report["queues"])


def test_bench_for_a_duration_at_a_rate_prints_progress_lines(url: str) -> None:
    result = invoke(url, "bench", "--duration", "2.5", "--rate", "200", "--interval", "0.5")
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stdout.splitlines() if line.startswith("time ")]
    assert progress, result.stdout  # at least one line came before the summary
    assert "msg/s" in progress[0] and "latency p50" in progress[0]
    assert "publish (confirmed) msgs/s" in result.stdout


def test_bench_rate_caps_what_is_published(url: str) -> None:
    result = invoke(url, "--json", "bench", "--duration", "1", "--rate", "50")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # Paced from the start: at most rate x duration, plus the one sent at time 0.
    assert 0 < report["published"] <= 51


def test_bench_refuses_count_with_duration(url: str) -> None:
    result = invoke(url, "bench", "-n", "10", "--duration", "1")
    assert result.exit_code == 2
    assert "not both" in result.output


def test_bench_metrics_reports_the_publisher_counts(url: str) -> None:
    result = invoke(url, "--json", "bench", "--count", "200", "--size", "16", "--metrics")
    assert result.exit_code == 0, result.output
    points = {
        p["name"]: p for p in json.loads(result.stdout)["metrics"] if "value" in p or "count" in p
    }
    assert points["rabbitry.publisher.published"]["value"] == 200
    assert points["rabbitry.publisher.confirmed"]["value"] == 200
    assert points["rabbitry.publisher.confirm.duration"]["count"] == 200
    assert not observability.is_instrumented()

    table = invoke(url, "bench", "-n", "50", "-s", "10", "--metrics")
    assert table.exit_code == 0, table.output
    assert "rabbitry.publisher.confirmed{messaging.destination.name=amq.default} 50" in (
        table.stdout
    )


def test_consume_metrics_prints_the_connection_metrics_at_the_end(url: str, broker: Broker) -> None:
    queue = broker.queue(broker.name("q"))
    assert invoke(url, "publish", "-k", queue, "one", "two").exit_code == 0
    result = invoke(url, "--json", "consume", queue, "--count", "2", "--metrics")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["body"] for r in lines[:2]] == ["one", "two"]
    names = {p["name"] for p in lines[2]["metrics"]}
    assert "rabbitry.connection.state" in names
    assert not observability.is_instrumented()

    assert invoke(url, "publish", "-k", queue, "three").exit_code == 0
    text = invoke(url, "consume", queue, "--count", "1", "--metrics")
    assert text.exit_code == 0, text.output
    metrics = text.stdout.split("metrics:\n", 1)[1]
    assert "\n  rabbitry.connection.state{" in f"\n{metrics}"
