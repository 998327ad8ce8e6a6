"""``rabbitry shovel --from URL/QUEUE --to URL/EXCHANGE[/ROUTING_KEY]``.

A thin shell over :class:`rabbitry.shovel.Shovel`, which holds the safety argument:
each source message is acknowledged only after the destination confirmed its copy, so
an interruption anywhere leaves every message in the source, at the destination, or
both (a duplicate, counted), never nowhere.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from ..config import parse_url
from ._common import fail, get_state, handle_errors, progress, to_jsonable
from ._exit import ExitCode

if TYPE_CHECKING:
    from ..protocol.message import Message
    from ..shovel import ShovelStats

__all__ = ["MessageFilter", "parse_message_filter", "shovel"]

# KEY of --filter that reads a delivery field or a basic property instead of a header.
_FIELDS = {
    "routing-key": lambda m: m.routing_key,
    "exchange": lambda m: m.exchange,
    "message-id": lambda m: m.properties.message_id,
    "correlation-id": lambda m: m.properties.correlation_id,
    "type": lambda m: m.properties.type,
    "app-id": lambda m: m.properties.app_id,
    "user-id": lambda m: m.properties.user_id,
    "content-type": lambda m: m.properties.content_type,
    "content-encoding": lambda m: m.properties.content_encoding,
    "reply-to": lambda m: m.properties.reply_to,
    "priority": lambda m: m.properties.priority,
}


@dataclass(frozen=True)
class MessageFilter:
    """``KEY=GLOB``: KEY is a field (routing-key, exchange, message-id, type, app-id,
    content-type...) or else a header name; GLOB is a shell pattern (``order.*``)."""

    key: str
    pattern: str

    def __call__(self, message: Message) -> bool:
        getter = _FIELDS.get(self.key)
        if getter is not None:
            value = getter(message)
        else:
            headers = message.headers
            if self.key not in headers:
                return False
            value = headers[self.key]
        if value is None:
            return False
        shown = to_jsonable(value)
        text = shown if isinstance(shown, str) else str(shown)
        return fnmatch.fnmatchcase(text, self.pattern)


def parse_message_filter(text: str) -> MessageFilter:
    """Parse ``KEY=GLOB`` (see :class:`MessageFilter`)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise click.BadParameter(
            f"{text!r}: expected KEY=GLOB (KEY: a header name or one of "
            f"{', '.join(sorted(_FIELDS))})"
        )
    return MessageFilter(key, value)


def _filters(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Any]:
    return [parse_message_filter(v) for v in values]


def _shown(url: str) -> str:
    return parse_url(url).display_url()


@click.command()
@click.option(
    "--from", "source", required=True, metavar="URL/QUEUE",
    help="Source: amqp://HOST/[VHOST/]QUEUE (vhost '/' is %2F), or QUEUE on --url.",
)  # fmt: skip
@click.option(
    "--to", "destination", required=True, metavar="URL/EXCHANGE[/ROUTING_KEY]",
    help="Destination: amqp://HOST/[VHOST/]EXCHANGE[/ROUTING_KEY] (vhost '/' is %2F; "
    "default exchange: amqp://HOST/%2F//QUEUE), or EXCHANGE[/ROUTING_KEY] on --url. "
    "Without ROUTING_KEY each message keeps its own.",
)  # fmt: skip
@click.option(
    "-n", "--count", type=click.IntRange(min=1),
    help="Move at most this many (default: the messages in the queue at the start).",
)  # fmt: skip
@click.option(
    "--filter", "filters", multiple=True, callback=_filters, metavar="KEY=GLOB",
    help="Move only messages whose KEY matches GLOB (KEY: routing-key, exchange, "
    "message-id, type, app-id, content-type, ... or a header name). Repeat: all must "
    "match. Others stay in the source queue (fetched one by one: slower).",
)  # fmt: skip
@click.option(
    "--window", type=click.IntRange(min=1), default=500, show_default=True,
    help="Unconfirmed copies at most (and the consumer prefetch).",
)  # fmt: skip
@click.option(
    "--idle-timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
    help="Stop after this many seconds without a message.",
)  # fmt: skip
@click.option(
    "--name", "connection_name", default="rabbitry-shovel", show_default=True,
    help="Connection name prefix (-source / -destination) shown by the broker.",
)  # fmt: skip
@handle_errors
def shovel(
    source: str,
    destination: str,
    count: int | None,
    filters: list[MessageFilter],
    window: int,
    idle_timeout: float,
    connection_name: str,
) -> None:
    """Move messages from a queue to an exchange, on this broker or another.

    Each source message is acknowledged only after the destination confirmed its
    copy (publisher confirms, mandatory): interrupted at any point, no message is
    lost; some may be at both places (duplicates, reported). Connection losses are
    recovered from automatically. Exits 1 if the destination refuses or cannot route
    a copy (that message stays in the source) or if fewer than --count were moved.
    """
    from ..shovel import Shovel, parse_destination, parse_source

    state = get_state()
    default = state.raw_urls()[0]
    src = parse_source(source, default)
    dst = parse_destination(destination, default)
    match = None
    if filters:

        def match(message: Message) -> bool:
            return all(f(message) for f in filters)

    with progress(state, count, f"shovel {src.name}") as advance:
        done = 0

        def on_progress(stats: ShovelStats) -> None:
            nonlocal done
            now = stats.moved + stats.skipped
            if now > done:
                advance(now - done)
                done = now

        runner = Shovel(
            src.url,
            src.name,
            dst.url,
            dst.name,
            dst.routing_key,
            count=count,
            filter=match,
            window=window,
            idle_timeout=idle_timeout,
            timeout=state.timeout,
            on_progress=on_progress,
            connection_name=connection_name,
        )
        try:
            stats = runner.run()
        except KeyboardInterrupt:
            state.warn(f"rabbitry: shovel interrupted: {_summary(runner.stats)}")
            raise
        except Exception:
            state.warn(f"rabbitry: shovel stopped: {_summary(runner.stats)}")
            raise
    result = {
        "from": _shown(src.url),
        "queue": src.name,
        "to": _shown(dst.url),
        "exchange": dst.name,
        "routing_key": dst.routing_key,
        **stats.as_dict(),
    }
    if state.json:
        state.emit_json(result)
    else:
        state.info(f"moved {src.name} -> {dst.name or '(default)'}: {_summary(stats)}")
    if count is not None and stats.moved < count:
        fail(f"moved {stats.moved} of --count {count} (the queue ran dry)", ExitCode.FAILED)


def _summary(stats: ShovelStats) -> str:
    return (
        f"{stats.moved} moved, {stats.skipped} skipped by filter, "
        f"{stats.possible_duplicates} possible duplicates, {stats.deduplicated} "
        f"deduplicated, {stats.in_flight} in flight"
    )
