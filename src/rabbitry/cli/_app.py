"""The ``rabbitry`` command group: its global options, :func:`run`, and the commands.

Each command (group) lives in a module of its own: ``publish`` in :mod:`._publish`,
``consume`` in :mod:`._consume`, ``topology`` in :mod:`._topology`, ``list`` in
:mod:`._list`, ``dlq`` in :mod:`._dlq`, ``bench`` in :mod:`._bench`, ``outbox`` in
:mod:`._outbox` and ``shovel`` in :mod:`._shovel`; shared helpers (global options,
connection, output, error mapping) in :mod:`._common`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .._version import __version__
from . import _globals
from ._common import State
from ._exit import ExitCode
from ._publish import parse_header

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["cli", "parse_header", "run"]

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(cls=_globals.GlobalOptionsGroup, context_settings=_CONTEXT)
@click.option(
    "--url",
    "urls",
    multiple=True,
    metavar="URL",
    help="Broker URL; repeat it or separate with commas for several brokers (tried in "
    "order). Default: $RABBITMQ_URL, else amqp://guest:guest@127.0.0.1:5672/.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors (and --json output).")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds allowed to connect and for each broker operation.",
)
@click.version_option(__version__, prog_name="rabbitry")
@click.pass_context
def cli(
    ctx: click.Context,
    urls: tuple[str, ...],
    as_json: bool,
    quiet: bool,
    debug: bool,
    timeout: float,
) -> None:
    """A RabbitMQ command line: publish, consume, list, apply topology, handle dead
    letters, benchmark. Global options may come before or after the command. Exit
    codes: 0 ok, 1 operation failed, 2 usage error, 3 connection or authentication
    error, 130 interrupted."""
    ctx.obj = State(urls=list(urls), json=as_json, quiet=quiet, debug=debug, timeout=timeout)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command group; return the exit code instead of raising SystemExit."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="rabbitry")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return int(ExitCode.OK)
        return code if isinstance(code, int) else int(ExitCode.FAILED)
    return int(ExitCode.OK)


def _register() -> None:
    from . import _bench, _consume, _dlq, _list, _outbox, _publish, _shovel, _topology

    cli.add_command(_publish.publish)
    cli.add_command(_consume.consume)
    cli.add_command(_topology.topology)
    cli.add_command(_list.list_group)
    cli.add_command(_dlq.dlq)
    cli.add_command(_bench.bench)
    cli.add_command(_outbox.outbox)
    cli.add_command(_shovel.shovel)


_register()
