"""Global options anywhere on the command line: ``rabbitry publish --json -k q x``.

Click only reads a group's options before the subcommand. :class:`GlobalOptionsGroup`
moves the global options it finds after the subcommand in front of it, so both
``rabbitry --json publish ...`` and ``rabbitry publish ... --json`` work. No subcommand
defines an option of the same name (a test checks it), so nothing else is moved; a
``--`` ends the options and everything after it stays where it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["FLAGS", "VALUED", "GlobalOptionsGroup", "hoist"]

#: Global options without a value, and those taking one.
FLAGS = frozenset({"--json", "-q", "--quiet", "--debug"})
VALUED = frozenset({"--url", "--timeout"})


def hoist(args: Iterable[str]) -> list[str]:
    """``args`` with the global options that follow the subcommand moved before it."""
    args = list(args)
    index = 0
    while index < len(args):  # the first word that is neither an option nor its value
        token = args[index]
        if token == "--" or not token.startswith("-"):
            break
        index += 2 if token in VALUED else 1
    if index >= len(args) or args[index] == "--":
        return args
    moved: list[str] = []
    kept: list[str] = []
    rest = args[index:]
    position = 0
    while position < len(rest):
        token = rest[position]
        if token == "--":
            kept.extend(rest[position:])
            break
        if token in FLAGS or (token.split("=", 1)[0] in VALUED and "=" in token):
            moved.append(token)
        elif token in VALUED and position + 1 < len(rest):
            moved += [token, rest[position + 1]]
            position += 1
        else:
            kept.append(token)
        position += 1
    return args[:index] + moved + kept


class GlobalOptionsGroup(click.Group):
    """A click group whose own options may also follow its subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, hoist(args))

    def format_usage(self, ctx: click.Context, formatter: Any) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] COMMAND [ARGS]... [OPTIONS]")
