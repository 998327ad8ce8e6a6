"""``topology diff`` and ``list`` on a broker URL with a non-default AMQP port: the CLI
reads the management API that answers for the same cluster, never another broker's."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result
from tests.support.fake_management import FakeManagementApi
from tests.support.proxy import TcpProxy

import rabbitry
import rabbitry.cli._mgmt
from rabbitry.cli._app import cli
from rabbitry.cli._exit import ExitCode

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def proxied_url(url: str) -> Iterator[str]:
    """The shared broker behind a proxy: the same node on an AMQP port other than 5672."""
    params = rabbitry.parse_url(url)
    with TcpProxy(params.host, params.port) as proxy:
        yield proxy.url()


def _cluster_name(url: str) -> str:
    with rabbitry.Connection(url) as conn:
        name = conn.server_properties["cluster_name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _diff(url: str, doc: Path) -> Result:
    return CliRunner().invoke(cli, ["--url", url, "--timeout", "10", "topology", "diff", str(doc)])


def _doc(tmp_path: Path) -> tuple[Path, dict[str, list[dict[str, object]]]]:
    queue = f"mgmt-url-{uuid.uuid4().hex[:8]}"
    doc = tmp_path / "topology.yaml"
    doc.write_text(f"queues:\n  - name: {queue}\n")
    definitions: dict[str, list[dict[str, object]]] = {
        "exchanges": [],
        "queues": [
            {"name": queue, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
        ],
        "bindings": [],
    }
    return doc, definitions


def test_diff_reads_the_api_that_reports_the_brokers_cluster(
    proxied_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, definitions = _doc(tmp_path)
    with (
        FakeManagementApi("rabbit@another-broker", {"queues": []}) as other,
        FakeManagementApi(_cluster_name(proxied_url), definitions) as own,
    ):
        monkeypatch.setattr(rabbitry.cli._mgmt, "CANDIDATE_PORTS", (str(other.port), str(own.port)))
        result = _diff(proxied_url, doc)
        assert result.exit_code == ExitCode.OK, result.output
        assert "matches the broker" in result.stdout
        assert other.paths == ["/api/overview"]
        assert own.paths[0] == "/api/overview"
        assert own.paths[1].startswith("/api/definitions/")


def test_diff_refuses_the_api_of_another_broker_and_asks_for_the_option(
    proxied_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc, _ = _doc(tmp_path)
    with FakeManagementApi("rabbit@another-broker", {"queues": []}) as other:
        monkeypatch.setattr(rabbitry.cli._mgmt, "CANDIDATE_PORTS", (str(other.port),))
        result = _diff(proxied_url, doc)
        assert result.exit_code == ExitCode.USAGE, result.output
        assert "--management-url" in result.stderr
        assert "'rabbit@another-broker'" in result.stderr
        assert other.paths == ["/api/overview"]


def test_an_explicit_management_url_is_used_without_a_check(
    proxied_url: str, tmp_path: Path
) -> None:
    doc, definitions = _doc(tmp_path)
    with FakeManagementApi("whatever", definitions) as api:
        result = CliRunner().invoke(
            cli,
            ["--url", proxied_url, "topology", "diff", str(doc), "--management-url", api.url],
        )
        assert result.exit_code == ExitCode.OK, result.output
        assert [p for p in api.paths if p == "/api/overview"] == []
