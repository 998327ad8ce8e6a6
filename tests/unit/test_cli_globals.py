"""Global options after the subcommand, and one meaning per option name."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from rabbitry.cli._app import cli
from rabbitry.cli._globals import FLAGS, VALUED, hoist

DEAD_URL = "amqp://guest:guest@127.0.0.1:1/"  # nothing listens on port 1


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["publish", "-k", "q", "x", "--json"], ["--json", "publish", "-k", "q", "x"]),
        (["consume", "q", "--timeout", "5", "-q"], ["--timeout", "5", "-q", "consume", "q"]),
        (["--debug", "list", "queues", "--url=u"], ["--debug", "--url=u", "list", "queues"]),
        (["--url", "amqp://h", "consume", "q"], ["--url", "amqp://h", "consume", "q"]),
        (["publish", "-k", "q", "--", "--json"], ["publish", "-k", "q", "--", "--json"]),
        (["--json"], ["--json"]),
    ],
)  # fmt: skip
def test_hoist_moves_global_options_before_the_subcommand(
    args: list[str], expected: list[str]
) -> None:
    assert hoist(args) == expected


def _commands(group: click.Group, path: str = "rabbitry") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in group.commands.items():
        found.append((f"{path} {name}", command))
        if isinstance(command, click.Group):
            found += _commands(command, f"{path} {name}")
    return found


def test_no_subcommand_reuses_a_global_option_name() -> None:
    clashes = [
        f"{path}: {opt}"
        for path, command in _commands(cli)
        for param in command.params
        for opt in (*param.opts, *param.secondary_opts)
        if opt in FLAGS | VALUED
    ]
    assert clashes == []


def test_json_after_the_subcommand_gives_json_errors_and_exit_codes() -> None:
    result = CliRunner().invoke(
        cli, ["publish", "-k", "q", "x", "--url", DEAD_URL, "--timeout", "5"]
    )
    assert result.exit_code == 3, result.output


def test_consume_has_idle_not_timeout() -> None:
    consume = cli.commands["consume"]
    names = {opt for p in consume.params for opt in p.opts}
    assert "--idle" in names and "--timeout" not in names


def test_list_refuses_vhost_with_all_vhosts() -> None:
    result = CliRunner().invoke(cli, ["list", "queues", "--vhost", "v", "--all-vhosts"])
    assert result.exit_code == 2
    assert "not both" in result.output


# Option names that two commands use for parameters named differently, with the one
# meaning they share.
SHARED_MEANING = {
    "--to": "where the messages go (dlq replay: an exchange; shovel: a URL and exchange)",
    "-n": "how many messages (to publish, consume, move, replay or show)",
}


def test_each_option_name_has_one_meaning_across_commands() -> None:
    meanings: dict[str, set[str]] = {}
    for _, command in _commands(cli):
        for param in command.params:
            if isinstance(param, click.Option):
                for opt in (*param.opts, *param.secondary_opts):
                    meanings.setdefault(opt, set()).add(str(param.name))
    clashes = {
        opt: sorted(names)
        for opt, names in meanings.items()
        if len(names) > 1 and opt not in SHARED_MEANING
    }
    assert clashes == {}
