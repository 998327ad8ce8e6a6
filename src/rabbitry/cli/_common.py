"""What every command shares: global options, the connection, output, error mapping."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import functools
import json
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..config import default_url, parse_urls
from ..exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConfigurationError,
    Timeout,
    TopologyValidationError,
)
from ._exit import ExitCode

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..config import ConnectionParameters
    from ..sync.connection import Connection

P = ParamSpec("P")
R = TypeVar("R")

# user:password@ inside any URL-looking text: the password is replaced with ***.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]*@")


def scrub(text: str) -> str:
    """``text`` with the password of every URL in it masked (``amqp://u:***@h``)."""
    return _URL_PASSWORD.sub(r"\g<head>***@", text)


class CliError(Exception):
    """A failure the CLI reports as one line and an exit code."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.code = code


def _console(*, stderr: bool) -> Console:
    console = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        # Piped or captured: no terminal width to respect; wide tables stay greppable.
        console = Console(stderr=stderr, highlight=False, soft_wrap=True, width=240)
    return console


@dataclass
class State:
    """The global options, shared by every command through the click context."""

    urls: list[str] = field(default_factory=list)
    json: bool = False
    quiet: bool = False
    debug: bool = False
    timeout: float = 30.0
    out: Console = field(default_factory=lambda: _console(stderr=False))
    err: Console = field(default_factory=lambda: _console(stderr=True))

    def raw_urls(self) -> list[str]:
        """The broker URLs (``--url`` values or ``$RABBITMQ_URL``), split on commas."""
        raw = self.urls or [default_url()]
        urls = [part.strip() for value in raw for part in value.split(",") if part.strip()]
        if not urls:
            raise CliError("no broker URL given", ExitCode.USAGE)
        return urls

    def params(self) -> list[ConnectionParameters]:
        """The brokers to try, in order; validated."""
        return parse_urls(self.raw_urls())

    def broker(self) -> str:
        """The brokers as shown to people: passwords masked."""
        return ", ".join(p.display_url() for p in self.params())

    def connect(self) -> Connection:
        """An open connection to the first broker that answers."""
        from ..sync.connection import Connection

        conn = Connection(
            self.raw_urls(),
            connection_timeout=min(self.timeout, 60.0),
            connection_name="rabbitry-cli",
        )
        try:
            conn.connect(timeout=self.timeout)
        except Timeout as exc:
            raise CliError(
                f"could not connect within {self.timeout:g} s (broker: {self.broker()})",
                ExitCode.CONNECTION,
            ) from exc
        return conn

    @property
    def interactive(self) -> bool:
        """Progress bars and colours: stdout is a terminal and no --json/--quiet."""
        return self.out.is_terminal and not self.json and not self.quiet

    def info(self, text: str) -> None:
        """A human-readable line on stdout (not with --json or --quiet)."""
        if not self.json and not self.quiet:
            self.out.print(scrub(text), markup=False)

    def emit_json(self, value: Any) -> None:
        """One JSON document on one line of stdout."""
        click.echo(dumps(value))

    def warn(self, text: str) -> None:
        """A line on stderr (also with --quiet)."""
        self.err.print(scrub(text), markup=False)


def get_state() -> State:
    """The :class:`State` of the running command."""
    ctx = click.get_current_context()
    state = ctx.find_object(State)
    if state is None:  # a command invoked without the group (tests)
        state = ctx.ensure_object(State)
    return state


def fail(message: str, code: ExitCode = ExitCode.FAILED) -> NoReturn:
    """Stop the command with a one-line message and ``code``."""
    raise CliError(message, code)


def _code_for(exc: BaseException) -> ExitCode:
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, ConfigurationError | TopologyValidationError):
        return ExitCode.USAGE
    if isinstance(exc, AMQPConnectionError):
        return ExitCode.CONNECTION
    if isinstance(exc, FileNotFoundError | IsADirectoryError | UnicodeDecodeError):
        return ExitCode.USAGE
    return ExitCode.FAILED


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CliError):
        return str(exc)
    text = str(exc) or type(exc).__name__
    kind = type(exc).__name__
    return f"{kind}: {text}"


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn exceptions into one-line messages on stderr and meaningful exit codes."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        state = get_state()
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            state.warn("rabbitry: interrupted")
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None
        except (AMQPError, CliError, OSError, ValueError) as exc:
            code = _code_for(exc)
            if state.debug:
                state.warn("".join(traceback.format_exception(exc)))
            message = _describe(exc)
            if code == ExitCode.CONNECTION and not isinstance(exc, CliError):
                try:
                    message += f" (broker: {state.broker()})"
                except (AMQPError, CliError):
                    pass
            state.warn(f"rabbitry: error: {message}")
            raise click.exceptions.Exit(code) from None

    return wrapper


# --------------------------------------------------------------------------- JSON


def to_jsonable(value: Any) -> Any:
    """AMQP field values as JSON values: bytes as text (or base64), datetimes ISO 8601."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return str(value)


def dumps(value: Any) -> str:
    """Compact JSON of :func:`to_jsonable` ``value``."""
    return json.dumps(to_jsonable(value), ensure_ascii=False, sort_keys=False)


def body_view(body: bytes) -> tuple[str, str]:
    """``(text, encoding)``: UTF-8 text when the body is UTF-8, else base64."""
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(body).decode("ascii"), "base64"


# --------------------------------------------------------------------------- progress


@contextlib.contextmanager
def progress(state: State, total: int | None, description: str) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``: a rich progress bar on a terminal, nothing otherwise."""
    if not state.interactive:
        yield lambda n: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=state.out, transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)

        yield advance


def is_stdin_tty() -> bool:
    """Whether stdin is an interactive terminal."""
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False
