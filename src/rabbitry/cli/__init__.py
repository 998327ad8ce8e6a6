"""The ``rabbitry`` command line: publish, consume, topology, dead letters, benchmarks.

The commands live in :mod:`rabbitry.cli._app` and need the ``cli`` extra (click and
rich): ``pip install 'rabbitry[cli]'``. Importing this package does not import them, so
the core library stays usable without the extra; :func:`main` says what to install when
they are missing. Exit codes are in :mod:`rabbitry.cli._exit` (see ``docs/cli.md``).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from ._exit import ExitCode

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["ExitCode", "main"]

_MISSING = (
    "rabbitry: the command line needs the 'cli' extra ({name} is not installed); "
    "install it with: pip install 'rabbitry[cli]'"
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``rabbitry`` command; returns (and, from the console script, exits with)
    one of :class:`ExitCode`."""
    try:
        import click  # noqa: F401
        import rich  # noqa: F401
    except ImportError as exc:
        print(_MISSING.format(name=exc.name or "a dependency"), file=sys.stderr)
        return int(ExitCode.USAGE)
    from ._app import run

    # The command is an application: the library's WARNING and ERROR lines go to stderr,
    # as they did before the package logger had its NullHandler.
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(message)s", level=logging.WARNING)
    return run(argv)
