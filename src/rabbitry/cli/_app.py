"""The ``rabbitry`` command group, ``publish``, ``consume`` and ``topology``.

``dlq`` is in :mod:`._dlq` and ``bench`` in :mod:`._bench`; shared helpers (global
options, connection, output, error mapping) in :mod:`._common`.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .._version import __version__
from ..exceptions import Nacked, Unroutable
from ..protocol.spec import BasicProperties
from . import _globals
from ._common import (
    CliError,
    State,
    body_view,
    fail,
    get_state,
    handle_errors,
    is_stdin_tty,
    progress,
)
from ._exit import ExitCode
from ._metrics import CommandMetrics, metrics_option, print_metrics
from ._mgmt import (
    MANAGEMENT_URL,
    basic_auth,
    management_client,
    management_for,
    management_url,
    management_url_option,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["cli", "run"]

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


# --------------------------------------------------------------------------- options


def parse_header(text: str) -> tuple[str, Any]:
    """``key=value`` (a string) or ``key:=json`` (any JSON value) as ``(key, value)``."""
    if ":=" in text and text.index(":=") + 1 == text.index("="):
        key, raw = text.split(":=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(
                f"{text!r}: the value after ':=' must be JSON ({exc})"
            ) from None
    elif "=" in text:
        key, value = text.split("=", 1)
    else:
        raise click.BadParameter(f"{text!r}: expected KEY=VALUE or KEY:=JSON")
    if not key:
        raise click.BadParameter(f"{text!r}: the header name is empty")
    return key, value


def _headers_callback(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any]:
    return dict(parse_header(v) for v in values)


def _read_bodies(bodies: tuple[str, ...], file: str | None, whole: bool) -> list[bytes]:
    if bodies and file is not None:
        raise click.UsageError("give message bodies as arguments or --file, not both")
    if bodies:
        return [b.encode("utf-8") for b in bodies]
    if file is None:
        if is_stdin_tty():
            raise click.UsageError(
                "nothing to publish: give bodies as arguments, --file PATH, or pipe lines on stdin"
            )
        file = "-"
    if file == "-":
        data = sys.stdin.buffer.read()
    else:
        data = Path(file).read_bytes()
    if whole:
        return [data]
    return data.splitlines()


# --------------------------------------------------------------------------- publish


@cli.command()
@click.argument("bodies", nargs=-1)
@click.option("-e", "--exchange", default="", help="Exchange ('' is the default exchange).")
@click.option("-k", "--routing-key", default="", help="Routing key (a queue name for '').")
@click.option(
    "-f",
    "--file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Read bodies from this file, one per line ('-' for stdin).",
)
@click.option("--whole", is_flag=True, help="With --file or stdin: the whole input is one body.")
@click.option(
    "-n",
    "--count",
    type=click.IntRange(min=1),
    help="Publish this many messages, cycling through the bodies (default: one each).",
)
@click.option("--rate", type=click.FloatRange(min=0.001), help="At most this many messages/s.")
@click.option(
    "-H", "--header", "headers", multiple=True, callback=_headers_callback,
    metavar="KEY=VALUE", help="A header (string value); KEY:=JSON for a typed value. Repeatable.",
)  # fmt: skip
@click.option("--content-type", help="content_type property.")
@click.option("--content-encoding", help="content_encoding property.")
@click.option("--correlation-id", help="correlation_id property.")
@click.option("--reply-to", help="reply_to property.")
@click.option("--message-id", help="message_id property.")
@click.option("--type", "type_", help="type property.")
@click.option("--app-id", help="app_id property.")
@click.option("--priority", type=click.IntRange(0, 255), help="priority property.")
@click.option("--expiration", type=click.IntRange(min=0), help="Per-message TTL in ms.")
@click.option(
    "--persistent/--transient", default=True, show_default=True, help="delivery_mode 2 or 1."
)
@click.option(
    "--mandatory/--no-mandatory",
    default=True,
    show_default=True,
    help="Report messages no queue received as failures (exit 1).",
)
@click.option(
    "--via",
    type=click.Choice(["amqp", "http"]),
    default="amqp",
    show_default=True,
    help="http: through the management API (one request per message, no confirm; "
    "for operations and tests, not throughput).",
)
@management_url_option("for --via http")
@handle_errors
def publish(
    bodies: tuple[str, ...],
    exchange: str,
    routing_key: str,
    file: str | None,
    whole: bool,
    count: int | None,
    rate: float | None,
    headers: dict[str, Any],
    content_type: str | None,
    content_encoding: str | None,
    correlation_id: str | None,
    reply_to: str | None,
    message_id: str | None,
    type_: str | None,
    app_id: str | None,
    priority: int | None,
    expiration: int | None,
    persistent: bool,
    mandatory: bool,
    via: str,
    management_url: str | None,
) -> None:
    """Publish messages with publisher confirms.

    Bodies come from the arguments, from --file (one per line) or from stdin lines.
    Exits 1 if any message was nacked or (with --mandatory) unroutable. With --via http
    the management API publishes them: "confirmed" then means the API accepted the
    message, and a message no queue received counts as unroutable.
    """
    state = get_state()
    payloads = _read_bodies(bodies, file, whole)
    if not payloads:
        raise click.UsageError("nothing to publish: the input is empty")
    total = count if count is not None else len(payloads)
    properties = BasicProperties(
        headers=headers or None,
        content_type=content_type,
        content_encoding=content_encoding,
        correlation_id=correlation_id,
        reply_to=reply_to,
        message_id=message_id,
        type=type_,
        app_id=app_id,
        priority=priority,
    )
    started = time.monotonic()
    send = _publish_http if via == "http" else _publish_amqp
    futures = send(
        state, management_url, payloads, total, rate, exchange, routing_key,
        properties, persistent, expiration, mandatory,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    counts = {"acked": 0, "nacked": 0, "unroutable": 0, "failed": 0}
    first_error: BaseException | None = None
    for future in futures:
        if not future.done():
            counts["failed"] += 1
            continue
        exc = future.exception()
        if exc is None:
            counts["acked"] += 1
            continue
        first_error = first_error or exc
        if isinstance(exc, Unroutable | _NotRouted):
            counts["unroutable"] += 1
        elif isinstance(exc, Nacked):
            counts["nacked"] += 1
        else:
            counts["failed"] += 1
    result = {
        "published": len(futures),
        **counts,
        "exchange": exchange,
        "routing_key": routing_key,
        "seconds": round(elapsed, 3),
    }
    if state.json:
        state.emit_json(result)
    else:
        where = f"exchange {exchange!r} routing key {routing_key!r}"
        state.info(
            f"published {len(futures)} to {where}: {counts['acked']} confirmed, "
            f"{counts['nacked']} nacked, {counts['unroutable']} unroutable, "
            f"{counts['failed']} failed ({elapsed:.2f} s)"
        )
    if counts["acked"] != len(futures):
        reason = ""
        if first_error is not None:
            reason = f": first error: {type(first_error).__name__}: {first_error}"
            if first_error.__cause__ is not None:
                reason += f" ({first_error.__cause__})"
        fail(f"{len(futures) - counts['acked']} of {len(futures)} not confirmed{reason}")


class _NotRouted(Exception):
    """--via http: the API answered ``routed: false``."""


def _publish_amqp(
    state: State,
    management_url: str | None,
    payloads: Sequence[bytes],
    total: int,
    rate: float | None,
    exchange: str,
    routing_key: str,
    properties: BasicProperties,
    persistent: bool,
    expiration: int | None,
    mandatory: bool,
) -> list[concurrent.futures.Future[None]]:
    futures: list[concurrent.futures.Future[None]] = []
    conn = state.connect()
    started = time.monotonic()
    try:
        with conn.publisher(confirm=True, mandatory=mandatory, timeout=state.timeout) as pub:
            with progress(state, total, "publishing") as advance:
                for index in range(total):
                    if rate is not None:
                        delay = started + index / rate - time.monotonic()
                        if delay > 0:
                            time.sleep(delay)
                    future = pub.publish(
                        payloads[index % len(payloads)],
                        exchange=exchange,
                        routing_key=routing_key,
                        properties=properties,
                        persistent=persistent,
                        expiration=expiration,
                    )
                    future.add_done_callback(lambda f: advance(1))
                    futures.append(future)
                concurrent.futures.wait(futures, timeout=state.timeout + 5)
    finally:
        conn.close()
    return futures


def _publish_http(
    state: State,
    management_url: str | None,
    payloads: Sequence[bytes],
    total: int,
    rate: float | None,
    exchange: str,
    routing_key: str,
    properties: BasicProperties,
    persistent: bool,
    expiration: int | None,
    mandatory: bool,
) -> list[concurrent.futures.Future[None]]:
    """Each message through the management API; a future per message, settled at once."""
    vhost = state.params()[0].virtual_host
    futures: list[concurrent.futures.Future[None]] = []
    started = time.monotonic()
    with management_client(management_url, "--via http needs the management API client") as api:
        with progress(state, total, "publishing") as advance:
            for index in range(total):
                if rate is not None:
                    delay = started + index / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                future: concurrent.futures.Future[None] = concurrent.futures.Future()
                routed = api.publish(
                    exchange,
                    routing_key,
                    payloads[index % len(payloads)],
                    properties=properties,
                    persistent=persistent,
                    expiration=expiration,
                    vhost=vhost,
                )
                if routed or not mandatory:
                    future.set_result(None)
                else:
                    future.set_exception(
                        _NotRouted("the management API routed the message to no queue")
                    )
                advance(1)
                futures.append(future)
    return futures


# --------------------------------------------------------------------------- consume


def message_record(message: Any, index: int) -> dict[str, Any]:
    """A delivered message as a JSON-ready dict."""
    props = message.properties
    text, encoding = body_view(bytes(message.body))
    properties = {
        name: getattr(props, name)
        for name in (
            "content_type",
            "content_encoding",
            "delivery_mode",
            "priority",
            "correlation_id",
            "reply_to",
            "expiration",
            "message_id",
            "timestamp",
            "type",
            "user_id",
            "app_id",
            "cluster_id",
        )
        if getattr(props, name) is not None
    }
    return {
        "index": index,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "redelivered": message.redelivered,
        "properties": properties,
        "headers": dict(props.headers or {}),
        "body": text,
        "body_encoding": encoding,
    }


@cli.command()
@click.argument("queue")
@click.option("-n", "--count", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option(
    "--idle",
    type=click.FloatRange(min=0.0),
    help="Stop when no message arrives for this many seconds (default: wait; Ctrl-C stops).",
)
@click.option(
    "--ack/--no-ack",
    default=True,
    show_default=True,
    help="--ack removes each printed message from the queue; --no-ack leaves them all "
    "there (they are requeued when the command ends): a non-destructive peek.",
)
@click.option("--prefetch", type=click.IntRange(min=1), help="basic.qos prefetch count.")
@metrics_option
@handle_errors
def consume(
    queue: str,
    count: int | None,
    idle: float | None,
    ack: bool,
    prefetch: int | None,
    metrics: bool,
) -> None:
    """Print messages from QUEUE (one JSON object per line with --json)."""
    state = get_state()
    if prefetch is None and ack:
        prefetch = min(count or 100, 1000)
    recorder = CommandMetrics() if metrics else None
    try:
        _consume(state, queue, count, idle, ack, prefetch)
    finally:
        if recorder is not None:
            points = recorder.collect()
            recorder.close()
            if state.json:
                state.emit_json({"metrics": points})
            print_metrics(state, points)


def _consume(
    state: State,
    queue: str,
    count: int | None,
    idle: float | None,
    ack: bool,
    prefetch: int | None,
) -> None:
    received = 0
    conn = state.connect()
    try:
        channel = conn.channel(timeout=state.timeout)
        channel.queue_declare(queue, passive=True, timeout=state.timeout)
        for message in channel.consume(queue, prefetch=prefetch, timeout=idle):
            received += 1
            record = message_record(message, received)
            if state.json:
                state.emit_json(record)
            elif not state.quiet:
                _print_message(state, record)
            if ack:
                message.ack()
            if count is not None and received >= count:
                break
        channel.close()
    finally:
        conn.close()
    if count is not None and received < count:
        fail(f"got {received} of {count} messages before {idle or 0:g} s without one")


def _print_message(state: State, record: dict[str, Any]) -> None:
    from rich.text import Text

    head = (
        f"#{record['index']} exchange={record['exchange']!r} "
        f"routing_key={record['routing_key']!r}" + (" redelivered" if record["redelivered"] else "")
    )
    state.out.print(Text(head, style="bold"))
    if record["properties"]:
        state.out.print(Text("  properties: " + _inline(record["properties"])))
    if record["headers"]:
        state.out.print(Text("  headers: " + _inline(record["headers"])))
    suffix = " (base64)" if record["body_encoding"] == "base64" else ""
    state.out.print(Text(f"  body{suffix}: {record['body']}"))


def _inline(value: dict[str, Any]) -> str:
    from ._common import dumps

    return dumps(value)


# --------------------------------------------------------------------------- topology


@cli.group()
def topology() -> None:
    """Apply, verify or diff a topology file (our YAML/JSON form or a definitions export)."""


_FILE = click.argument("file", type=click.Path(exists=True, dir_okay=False))
_VHOST = click.option(
    "--vhost", default=None, help="vhost to read from a definitions export (default: the URL's)."
)


def _load(file: str, vhost: str | None) -> Any:
    from ..topology import Topology

    state = get_state()
    if vhost is None:
        vhost = state.params()[0].virtual_host
    try:
        return Topology.load(file, vhost)
    except ImportError as exc:
        raise CliError(
            f"{file}: reading it needs {exc.name or 'an extra module'}: "
            "pip install 'rabbitry[yaml]'",
            ExitCode.USAGE,
        ) from exc


@topology.command("apply")
@_FILE
@_VHOST
@MANAGEMENT_URL
@handle_errors
def topology_apply(file: str, vhost: str | None, management_url: str | None) -> None:
    """Declare every exchange, queue and binding of FILE, and set its policies through
    the management API (idempotent; exit 1 on conflict)."""
    state = get_state()
    topo = _load(file, vhost)
    api = management_for(topo, management_url)
    conn = state.connect()
    try:
        result = topo.apply(conn, timeout=state.timeout, management=api)
    finally:
        conn.close()
        if api is not None:
            api.close()
    summary = {
        "exchanges": len(result.topology.exchanges),
        "queues": list(result.queue_names),
        "bindings": len(result.topology.bindings),
        "message_counts": dict(result.message_counts),
    }
    if state.json:
        state.emit_json({"applied": True, **summary})
    else:
        state.info(
            f"applied {file}: {summary['exchanges']} exchanges, {len(result.queue_names)} "
            f"queues, {summary['bindings']} bindings"
        )


@topology.command("verify")
@_FILE
@_VHOST
@MANAGEMENT_URL
@handle_errors
def topology_verify(file: str, vhost: str | None, management_url: str | None) -> None:
    """Check that every exchange, queue and policy of FILE exists (exit 1 if not)."""
    state = get_state()
    topo = _load(file, vhost)
    api = management_for(topo, management_url)
    conn = state.connect()
    try:
        report = topo.verify(conn, timeout=state.timeout, management=api)
    finally:
        conn.close()
        if api is not None:
            api.close()
    if state.json:
        state.emit_json(
            {
                "ok": report.ok,
                "missing": [item.label for item in report.missing],
                "present": [item.label for item in report.present],
                "unchecked": [item.label for item in report.unchecked],
                "message_counts": dict(report.message_counts),
                "policy_differences": list(report.policy_differences),
            }
        )
    else:
        state.info(str(report))
        if report.unchecked:
            state.info(f"not checkable over AMQP: {len(report.unchecked)} (bindings etc.)")
    if not report.ok:
        missing = f"{len(report.missing)} missing: {', '.join(i.label for i in report.missing)}"
        if report.policy_differences:
            missing += f"; policies differ: {'; '.join(report.policy_differences)}"
        fail(missing)


@topology.command("diff")
@_FILE
@_VHOST
@click.option(
    "--against",
    type=click.Path(exists=True, dir_okay=False),
    help="Compare with this file (a definitions export or another topology) instead of the broker.",
)
@management_url_option("to read the broker's definitions from (without --against)")
@click.option(
    "--extra/--no-extra",
    default=None,
    help="Also list what only the other side has (default: only with --against).",
)
@handle_errors
def topology_diff(
    file: str,
    vhost: str | None,
    against: str | None,
    management_url: str | None,
    extra: bool | None,
) -> None:
    """Show how FILE differs from the broker (or --against a file); exit 1 if it does."""
    state = get_state()
    topo = _load(file, vhost)
    if against is not None:
        other = _load(against, vhost)
        lines = topo.diff(other, extra=True if extra is None else extra)
        overlaps = topo.policy_overlaps(other)
        source = against
    else:
        params = state.params()[0]
        definitions = _fetch_definitions(management_url, params)
        lines = topo.diff(definitions, vhost=vhost or params.virtual_host, extra=bool(extra))
        overlaps = topo.policy_overlaps(definitions, vhost=vhost or params.virtual_host)
        source = "the broker"
    # A policy and a queue argument setting a key to the same value is no difference,
    # but worth knowing (changing the policy alone will not change that queue).
    notes = [f"note: {o.line()}" for o in overlaps if o.line() not in lines]
    if state.json:
        state.emit_json(
            {
                "same": not lines,
                "differences": lines,
                "policy_overlaps": [o.line() for o in overlaps],
            }
        )
    elif lines:
        for line in lines + notes:
            state.info(line)
    else:
        for line in notes:
            state.info(line)
        state.info(f"{file} matches {source}")
    if lines:
        fail(f"{len(lines)} difference(s) between {file} and {source}")


def _fetch_definitions(base: str | None, params: Any) -> Any:
    clean, user, password = basic_auth(management_url(base), params)
    vhost = urllib.parse.quote(params.virtual_host, safe="")
    request = urllib.request.Request(f"{clean}/api/definitions/{vhost}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=get_state().timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        code = ExitCode.CONNECTION if exc.code in (401, 403) else ExitCode.FAILED
        raise CliError(f"management API {clean}: HTTP {exc.code} {exc.reason}", code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(
            f"management API {clean} did not answer ({reason}); enable the management "
            "plugin, pass --management-url, or compare with --against FILE",
            ExitCode.CONNECTION,
        ) from None


def _register() -> None:
    from . import _bench, _dlq, _list, _outbox, _shovel

    cli.add_command(_list.list_group)
    cli.add_command(_dlq.dlq)
    cli.add_command(_bench.bench)
    cli.add_command(_outbox.outbox)
    cli.add_command(_shovel.shovel)


_register()
