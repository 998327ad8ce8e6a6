"""The CLI as a new user meets it: one install hint, help that fits the command, the
demo's clean-up line, and bench on a named or quorum queue."""

from __future__ import annotations

import json
import sys
import uuid
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result

import rabbitry
from rabbitry import demo
from rabbitry.cli._app import cli
from rabbitry.cli._exit import ExitCode

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--url", url, "--timeout", "10", *args])


def _queue_exists(url: str, name: str) -> bool:
    with rabbitry.Connection(url) as conn:
        try:
            conn.channel().queue_declare(name, passive=True)
        except rabbitry.NotFound:
            return False
        return True


@pytest.fixture
def queue_name(url: str) -> Iterator[str]:
    name = f"bench-named-{uuid.uuid4().hex[:8]}"
    yield name
    with rabbitry.Connection(url) as conn:
        conn.channel().queue_delete(name)


def test_list_without_the_management_extra_names_the_extra_once(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)  # what an install without it gives
    result = invoke(url, "list", "queues")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.count("pip install 'rabbitry[management]'") == 1, result.stderr


def test_publish_help_says_what_its_management_url_is_for() -> None:
    text = CliRunner().invoke(cli, ["publish", "--help"]).stdout
    option = " ".join(text[text.index("--management-url") :].split())
    assert "for --via http" in option
    assert "policies" not in option.split("--", 2)[1]


def test_the_demo_names_what_it_deleted(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "COUNT", 20)
    assert demo.main([url]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "deleted" in line)
    assert "deleted queue 'rabbitry.demo." in line and " and exchange 'rabbitry.demo." in line


def test_bench_on_a_named_queue_declares_it_and_deletes_it(url: str, queue_name: str) -> None:
    result = invoke(url, "--json", "bench", "-n", "50", "-s", "16", "-u", queue_name)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["queues"] == [queue_name]
    assert not _queue_exists(url, queue_name)


def test_bench_on_an_existing_named_queue_leaves_it(url: str, queue_name: str) -> None:
    with rabbitry.Connection(url) as conn:
        conn.channel().queue_declare(queue_name)
    result = invoke(url, "--json", "bench", "-n", "50", "-s", "16", "--queue", queue_name)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["queues"] == [queue_name] and report["count"] == 50
    assert _queue_exists(url, queue_name)


def test_bench_on_a_quorum_queue(url: str, queue_name: str) -> None:
    result = invoke(
        url, "--json", "bench", "-n", "50", "-s", "16", "-u", queue_name, "--quorum-queue"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["count"] == 50
    assert not _queue_exists(url, queue_name)


def test_bench_quorum_queues_without_a_name_are_deleted_at_the_end(url: str) -> None:
    result = invoke(url, "--json", "bench", "-n", "40", "--queues", "2", "--quorum-queue")
    assert result.exit_code == 0, result.output
    names = json.loads(result.stdout)["queues"]
    assert len(names) == 2 and all(n.startswith("rabbitry-bench-") for n in names)
    assert not any(_queue_exists(url, n) for n in names)


def test_bench_refuses_a_named_queue_with_several_queues(url: str) -> None:
    result = invoke(url, "bench", "-u", "q", "--queues", "2")
    assert result.exit_code == ExitCode.USAGE
    assert "--queue names one queue" in result.output
