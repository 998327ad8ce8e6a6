"""``rabbitry list queues|exchanges|bindings`` against the management node."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from click.testing import CliRunner

from rabbitry import Connection
from rabbitry.cli._app import cli

if TYPE_CHECKING:
    from tests.support.node import BrokerNode


def _list(node: BrokerNode, mgmt_url: str, *args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(
        cli, ["list", *args, "--url", node.url, "--management-url", mgmt_url, "--json"]
    )
    assert result.exit_code == 0, result.output
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def test_list_shows_declared_queues_exchanges_and_bindings(
    mgmt_node: BrokerNode, mgmt_url: str, uid: str
) -> None:
    queue, exchange = f"{uid}-q", f"{uid}-x"
    with Connection(mgmt_node.url) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "topic")
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(queue, exchange, "orders.*")
        try:
            queues = {row["name"]: row for row in _list(mgmt_node, mgmt_url, "queues")}
            assert queues[queue]["type"] == "quorum"
            exchanges = {row["name"]: row for row in _list(mgmt_node, mgmt_url, "exchanges")}
            assert exchanges[exchange]["type"] == "topic"
            bindings = _list(mgmt_node, mgmt_url, "bindings")
            assert {
                "source": exchange,
                "destination": queue,
                "destination_type": "queue",
                "routing_key": "orders.*",
            }.items() <= next(b for b in bindings if b["source"] == exchange).items()
            table = CliRunner().invoke(
                cli, ["list", "queues", "--url", mgmt_node.url, "--management-url", mgmt_url]
            )
            assert table.exit_code == 0 and queue in table.stdout
        finally:
            channel.queue_delete(queue)
            channel.exchange_delete(exchange)


def test_list_without_a_management_api_is_a_connection_error(mgmt_node: BrokerNode) -> None:
    result = CliRunner().invoke(
        cli,
        ["list", "queues", "--url", mgmt_node.url, "--management-url", "http://127.0.0.1:1"],
    )
    assert result.exit_code == 3, result.output
    assert "management" in result.output
