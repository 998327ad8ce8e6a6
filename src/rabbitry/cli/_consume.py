"""``rabbitry consume``: print (and by default ack) the messages of a queue."""

from __future__ import annotations

from typing import Any

import click

from ._common import State, body_view, fail, get_state, handle_errors
from ._metrics import CommandMetrics, metrics_option, print_metrics

__all__ = ["consume", "message_record"]


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


@click.command()
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
