"""The ``rabbitry`` command line without a broker: parsing, validation, exit codes, secrets."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import rabbitry.cli
from rabbitry.cli import ExitCode, main
from rabbitry.cli._app import cli, parse_header, run
from rabbitry.cli._bench import percentile
from rabbitry.cli._common import State, dumps, scrub
from rabbitry.cli._dlq import Filter, parse_filter, replay_target, resolve_queue
from rabbitry.topology import (
    EXCEPTION_TYPE_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
)

SECRET = "hunter2-Pa55"
# Nothing listens on port 1: connecting fails at once with "connection refused".
DEAD_URL = f"amqp://app:{SECRET}@127.0.0.1:1/"


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env=env)


# --------------------------------------------------------------------------- shape


def test_exit_codes_are_defined_once() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 130]
    assert rabbitry.cli.ExitCode is ExitCode


def test_help_lists_every_command() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("publish", "consume", "topology", "dlq", "bench"):
        assert command in result.stdout
    groups = {"topology": ("apply", "verify", "diff"), "dlq": ("inspect", "replay", "purge")}
    for group, subs in groups.items():
        result = invoke(group, "--help")
        assert result.exit_code == 0
        for sub in subs:
            assert sub in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["nope"],
        ["consume"],
        ["consume", "q", "--count", "0"],
        ["publish", "--priority", "300", "x"],
        ["publish", "-H", "no-equals-sign", "x"],
        ["publish", "-H", "k:=not json", "x"],
        ["publish", "-H", "=v", "x"],
        ["dlq", "replay", "q", "--filter", "novalue"],
        ["bench", "--count", "0"],
        ["--timeout", "0", "consume", "q"],
        ["topology", "apply", "/no/such/file.yaml"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = invoke("--url", DEAD_URL, *args)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert SECRET not in result.output


def test_publish_without_input_is_a_usage_error() -> None:
    result = invoke("--url", DEAD_URL, "publish", "-k", "q", input="")
    assert result.exit_code == ExitCode.USAGE
    assert "nothing to publish" in result.output


def test_publish_bodies_and_file_together_is_a_usage_error() -> None:
    result = invoke("--url", DEAD_URL, "publish", "--file", "-", "body")
    assert result.exit_code == ExitCode.USAGE


def test_purge_without_yes_refuses_when_stdin_is_not_a_terminal() -> None:
    result = invoke("--url", DEAD_URL, "dlq", "purge", "jobs")
    assert result.exit_code == ExitCode.USAGE
    assert "--yes" in result.stderr
    assert "jobs.parking-lot" in result.stderr


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert rabbitry.__version__ in result.stdout


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "args",
    [
        ["publish", "-k", "q", "hello"],
        ["consume", "q", "--count", "1"],
        ["dlq", "inspect", "q"],
        ["dlq", "replay", "q"],
        ["dlq", "purge", "q", "--yes"],
        ["bench", "-n", "1"],
    ],
)
def test_connection_refused_is_exit_3_and_never_shows_the_password(args: list[str]) -> None:
    result = invoke("--url", DEAD_URL, "--timeout", "5", *args)
    assert result.exit_code == ExitCode.CONNECTION, result.output
    assert SECRET not in result.output
    assert result.stderr.startswith("rabbitry: error: ")
    assert "app:***@127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.output


def test_url_from_environment_and_comma_separated_urls() -> None:
    other = f"amqp://x:{SECRET}@127.0.0.1:2/"
    result = invoke("publish", "-k", "q", "x", env={"RABBITMQ_URL": f"{DEAD_URL},{other}"})
    assert result.exit_code == ExitCode.CONNECTION
    assert SECRET not in result.output
    assert "127.0.0.1:1" in result.stderr and "127.0.0.1:2" in result.stderr
    state = State(urls=[f"{DEAD_URL}, {other}", "amqp://h3/"])
    assert [p.port for p in state.params()] == [1, 2, 5672]


def test_invalid_url_is_a_usage_error_without_the_password() -> None:
    result = invoke("--url", f"amqp://app:{SECRET}@host:99999/", "publish", "-k", "q", "x")
    assert result.exit_code == ExitCode.USAGE
    assert SECRET not in result.output
    result = invoke("--url", f"amqp://app:{SECRET}@host/?hearbeat=5", "consume", "q")
    assert result.exit_code == ExitCode.USAGE
    assert SECRET not in result.output


def test_debug_shows_the_traceback_but_not_the_password() -> None:
    result = invoke("--debug", "--url", DEAD_URL, "--timeout", "5", "publish", "-k", "q", "x")
    assert result.exit_code == ExitCode.CONNECTION
    assert "Traceback" in result.stderr
    assert SECRET not in result.output


def test_interrupt_is_exit_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(self: State) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(State, "connect", interrupted)
    result = invoke("consume", "q")
    assert result.exit_code == ExitCode.INTERRUPTED
    assert "interrupted" in result.stderr


def test_run_returns_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--help"]) == ExitCode.OK
    assert run(["no-such-command"]) == ExitCode.USAGE
    assert main(["--url", DEAD_URL, "--timeout", "5", "publish", "-k", "q", "x"]) == 3
    assert SECRET not in capsys.readouterr().err


def test_main_explains_the_missing_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    assert main(["--help"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "pip install 'rabbitry[cli]'" in err
    assert "rich" in err


def test_core_import_does_not_need_click_or_rich() -> None:
    code = (
        "import sys; sys.modules['click'] = None; sys.modules['rich'] = None\n"
        "import rabbitry, rabbitry.topology, rabbitry.cli\n"
        "assert rabbitry.cli.main(['--help']) == 2\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "rabbitry[cli]" in done.stderr


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("k=v", ("k", "v")),
        ("k=a=b", ("k", "a=b")),
        ("k=", ("k", "")),
        ("n:=7", ("n", 7)),
        ("flag:=true", ("flag", True)),
        ('list:=[1, "a"]', ("list", [1, "a"])),
        ("url=a:=b", ("url", "a:=b")),
    ],
)
def test_parse_header(text: str, expected: tuple[str, Any]) -> None:
    assert parse_header(text) == expected


def test_parse_header_errors() -> None:
    for bad in ("novalue", "=v", "k:=nope"):
        with pytest.raises(click.BadParameter):
            parse_header(bad)


def test_scrub_masks_passwords_in_urls() -> None:
    text = f"failed: amqp://app:{SECRET}@h:5672/v and amqps://u:p%40ss@[::1]/ ok"
    cleaned = scrub(text)
    assert SECRET not in cleaned and "p%40ss" not in cleaned
    assert "amqp://app:***@h:5672/v" in cleaned and "amqps://u:***@[::1]/" in cleaned
    assert scrub("amqp://host/ no user") == "amqp://host/ no user"


def test_resolve_queue() -> None:
    assert resolve_queue("jobs", exact=False) == "jobs.parking-lot"
    assert resolve_queue("jobs.parking-lot", exact=False) == "jobs.parking-lot"
    assert resolve_queue("my-dlq", exact=True) == "my-dlq"


def test_filters() -> None:
    assert parse_filter("exception=ValueError") == Filter(EXCEPTION_TYPE_HEADER, "ValueError")
    assert parse_filter("tenant=acme") == Filter("tenant", "acme")
    exc = parse_filter("exception=BadInput")
    assert exc.matches({EXCEPTION_TYPE_HEADER: "app.errors.BadInput"})
    assert exc.matches({EXCEPTION_TYPE_HEADER: "BadInput"})
    assert not exc.matches({EXCEPTION_TYPE_HEADER: "app.errors.NotBadInput"})
    assert not exc.matches({})
    assert parse_filter("attempts=4").matches({"x-rabbitry-attempts": 4})
    assert parse_filter("k=v").matches({"k": b"v"})
    assert not parse_filter("k=v").matches({"k": "w"})


def test_replay_target() -> None:
    assert replay_target({ORIGINAL_EXCHANGE_HEADER: "", ORIGINAL_ROUTING_KEY_HEADER: "q"}) == (
        "",
        "q",
    )
    death = {"x-death": [{"exchange": "orders", "routing-keys": ["order.new"], "queue": "q"}]}
    assert replay_target(death) == ("orders", "order.new")
    assert replay_target({"x-death": [{"reason": "expired"}]}) is None
    assert replay_target({}) is None


def test_percentile() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 50) == 0.0
    assert percentile([3.0], 95) == 3.0


def test_json_of_field_values() -> None:
    import datetime as dt
    import decimal

    value = {
        "b": b"text",
        "raw": b"\xff\x00",
        "when": dt.datetime(2026, 1, 2, 3, 4, 5),
        "d": decimal.Decimal("1.50"),
        "l": [1, (2, 3)],
    }
    assert json.loads(dumps(value)) == {
        "b": "text",
        "raw": {"base64": "/wA="},
        "when": "2026-01-02T03:04:05+00:00",
        "d": "1.50",
        "l": [1, [2, 3]],
    }
