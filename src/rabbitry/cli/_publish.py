"""``rabbitry publish``: its options, the reading of the bodies, and the two ways to send
them (AMQP with publisher confirms, or the management API)."""

from __future__ import annotations

import concurrent.futures
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..exceptions import Nacked, Unroutable
from ..protocol.spec import BasicProperties
from ._common import State, fail, get_state, handle_errors, is_stdin_tty, progress
from ._mgmt import management_client, management_url_option

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["parse_header", "publish"]


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


@click.command()
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
