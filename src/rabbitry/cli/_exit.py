"""The exit codes of the ``rabbitry`` command, in one place (documented in docs/cli.md)."""

from __future__ import annotations

import enum

__all__ = ["ExitCode"]


class ExitCode(enum.IntEnum):
    """What the ``rabbitry`` process exit status means."""

    OK = 0
    """Everything asked for was done."""
    FAILED = 1
    """The operation failed: a nack, an unroutable message, a topology conflict or
    difference, a missing entity, fewer messages than ``--count`` before ``--timeout``."""
    USAGE = 2
    """Bad arguments or options, an invalid URL or file, or the ``cli`` extra missing."""
    CONNECTION = 3
    """No broker could be reached, authentication failed, or the connection was lost."""
    INTERRUPTED = 130
    """Stopped with Ctrl-C (SIGINT), as shells report it (128 + 2)."""
