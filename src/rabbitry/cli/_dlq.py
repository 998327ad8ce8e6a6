"""``rabbitry dlq inspect|replay|purge``: parked (dead-lettered) messages.

``QUEUE`` is the work queue, whose parking lot ``<QUEUE>.parking-lot`` is meant, or a
name ending in ``.parking-lot``; ``--exact`` takes any queue as given (e.g. a plain
dead-letter queue filled by the broker's ``x-death`` path).

Safety: ``inspect`` never removes a message (it takes them without acknowledging and
closes its channel, which gives them all back in their order). ``replay`` acknowledges
a parked message only after the broker confirmed its copy at the target: interrupted
between the two, the message is at both places (a duplicate), never at neither.

Quorum queues count every message given back (``inspect``'s, and ``replay``'s skipped
ones) as a return toward the queue's delivery limit, and dead-letter or drop a message
past it (RabbitMQ 4.x: 20 by default). AMQP 0-9-1 has no way to look without counting,
so: parking lots made by ``Topology.with_retry`` have a limit that is never reached, and
both commands say how many returns the messages they saw already carry
(``x-delivery-count``), so a count approaching another queue's limit does not go unseen.
A message parked by the broker for its delivery limit shows the reason
``delivery_limit (broker)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from ..exceptions import PublishError, Timeout
from ..protocol.spec import BasicProperties
from ..topology import (
    ATTEMPTS_HEADER,
    EXCEPTION_MESSAGE_HEADER,
    EXCEPTION_TYPE_HEADER,
    FIRST_FAILURE_HEADER,
    LAST_FAILURE_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    PARKED_REASON_HEADER,
    parking_lot_name,
)
from ._common import (
    State,
    body_view,
    fail,
    get_state,
    handle_errors,
    is_stdin_tty,
    progress,
    to_jsonable,
)
from ._exit import ExitCode

__all__ = ["Filter", "dlq", "parse_filter", "replay_target", "resolve_queue"]

_PARKING_SUFFIX = ".parking-lot"
_ALIASES = {
    "exception": EXCEPTION_TYPE_HEADER,
    "reason": PARKED_REASON_HEADER,
    "attempts": ATTEMPTS_HEADER,
    "original-exchange": ORIGINAL_EXCHANGE_HEADER,
    "original-routing-key": ORIGINAL_ROUTING_KEY_HEADER,
}
# Dropped from replayed copies unless --keep-headers: the failure history, so that the
# work queue's retry policy starts again from the first attempt.
_DEATH_HEADERS = ("x-death", "x-first-death-exchange", "x-first-death-queue",
                  "x-first-death-reason", "x-last-death-exchange", "x-last-death-queue",
                  "x-last-death-reason")  # fmt: skip


def resolve_queue(name: str, exact: bool) -> str:
    """The queue a ``dlq`` command works on (see the module docstring)."""
    if exact or name.endswith(_PARKING_SUFFIX):
        return name
    return parking_lot_name(name)


@dataclass(frozen=True)
class Filter:
    """``KEY=VALUE`` on a header; ``exception=Name`` also matches the unqualified name."""

    header: str
    value: str

    def matches(self, headers: Mapping[str, Any]) -> bool:
        """Whether the message with these headers passes."""
        if self.header not in headers:
            return False
        actual = to_jsonable(headers[self.header])
        text = actual if isinstance(actual, str) else str(actual)
        if text == self.value:
            return True
        if self.header == EXCEPTION_TYPE_HEADER:
            return text.rsplit(".", 1)[-1] == self.value
        return False


def parse_filter(text: str) -> Filter:
    """``KEY=VALUE``: KEY is a header name or one of exception, reason, attempts,
    original-exchange, original-routing-key."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise click.BadParameter(
            f"{text!r}: expected KEY=VALUE (KEY: a header name or one of "
            f"{', '.join(sorted(_ALIASES))})"
        )
    return Filter(_ALIASES.get(key, key), value)


def _filters_callback(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[Filter]:
    return [parse_filter(v) for v in values]


def replay_target(headers: Mapping[str, Any]) -> tuple[str, str] | None:
    """Where a parked message came from: ``(exchange, routing_key)``, from rabbitry's
    failure headers, else from the broker's first ``x-death`` entry; ``None`` if unknown."""
    exchange = headers.get(ORIGINAL_EXCHANGE_HEADER)
    key = headers.get(ORIGINAL_ROUTING_KEY_HEADER)
    if exchange is not None and key is not None:
        return str(to_jsonable(exchange)), str(to_jsonable(key))
    deaths = headers.get("x-death")
    if isinstance(deaths, list):
        for entry in deaths:
            if not isinstance(entry, Mapping):
                continue
            keys = entry.get("routing-keys")
            if "exchange" in entry and isinstance(keys, list) and keys:
                return str(to_jsonable(entry["exchange"])), str(to_jsonable(keys[0]))
    return None


def _death_summary(headers: Mapping[str, Any]) -> str:
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return ""
    parts = []
    for entry in deaths:
        if isinstance(entry, Mapping):
            parts.append(
                f"{to_jsonable(entry.get('reason'))} from {to_jsonable(entry.get('queue'))}"
                f" x{to_jsonable(entry.get('count'))}"
            )
    return "; ".join(parts)


def _parked_reason(headers: Mapping[str, Any]) -> Any:
    """rabbitry's parked reason, else the broker's dead-letter reason (``delivery_limit``)."""
    ours = headers.get(PARKED_REASON_HEADER)
    if ours is not None:
        return ours
    broker = headers.get("x-first-death-reason")
    return None if broker is None else f"{to_jsonable(broker)} (broker)"


def _returns(headers: Mapping[str, Any]) -> int | None:
    """Returns a quorum queue counted for this message (``x-delivery-count``), if any."""
    count = headers.get("x-delivery-count")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _warn_returns(state: State, name: str, counts: list[int]) -> None:
    if counts:
        state.warn(
            f"{name} is a quorum queue: each message taken and given back counts as a "
            f"return toward its delivery limit (up to {max(counts) + 1} so far on the "
            "messages seen); a queue without a high or unlimited (-1) delivery-limit "
            "dead-letters or drops a message past it"
        )


def _parked_record(message: Any, index: int) -> dict[str, Any]:
    headers = dict(message.headers)
    text, encoding = body_view(bytes(message.body))
    return {
        "index": index,
        "message_id": message.properties.message_id,
        "exception_type": headers.get(EXCEPTION_TYPE_HEADER),
        "exception_message": headers.get(EXCEPTION_MESSAGE_HEADER),
        "attempts": headers.get(ATTEMPTS_HEADER),
        "parked_reason": _parked_reason(headers),
        "delivery_count": _returns(headers),
        "original_exchange": headers.get(ORIGINAL_EXCHANGE_HEADER),
        "original_routing_key": headers.get(ORIGINAL_ROUTING_KEY_HEADER),
        "first_failure": headers.get(FIRST_FAILURE_HEADER),
        "last_failure": headers.get(LAST_FAILURE_HEADER),
        "x_death": headers.get("x-death"),
        "headers": headers,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "body": text,
        "body_encoding": encoding,
    }


@click.group()
def dlq() -> None:
    """Inspect, replay or purge parked messages (QUEUE or QUEUE.parking-lot)."""


_QUEUE = click.argument("queue")
_EXACT = click.option("--exact", is_flag=True, help="Use QUEUE as given, not QUEUE.parking-lot.")


@dlq.command()
@_QUEUE
@_EXACT
@click.option(
    "-n", "--limit", type=click.IntRange(min=1), default=50, show_default=True,
    help="Show at most this many messages (from the head of the queue).",
)  # fmt: skip
@click.option("--body/--no-body", default=False, help="Show a body column.")
@handle_errors
def inspect(queue: str, exact: bool, limit: int, body: bool) -> None:
    """List parked messages with their failure headers; removes nothing."""
    state = get_state()
    name = resolve_queue(queue, exact)
    records: list[dict[str, Any]] = []
    conn = state.connect()
    try:
        channel = conn.channel(timeout=state.timeout)
        total = channel.queue_declare(name, passive=True, timeout=state.timeout).message_count
        # Taken without acknowledgement and held until the channel closes, which
        # returns every one of them to the queue, in its original position.
        for _ in range(min(total, limit)):
            message = channel.basic_get(name, no_ack=False, timeout=state.timeout)
            if message is None:
                break
            records.append(_parked_record(message, len(records) + 1))
        channel.close()
    finally:
        conn.close()
    _warn_returns(
        state, name, [r["delivery_count"] for r in records if r["delivery_count"] is not None]
    )
    if state.json:
        state.emit_json({"queue": name, "message_count": total, "messages": records})
        return
    if state.quiet:
        return
    _print_table(state, name, total, records, body)


def _print_table(
    state: State, name: str, total: int, records: list[dict[str, Any]], body: bool
) -> None:
    from rich.table import Table

    table = Table(title=f"{name}: {total} message(s), showing {len(records)}", expand=False)
    for column in ("#", "message id", "exception", "attempts", "reason", "original", "x-death",
                   "last failure"):  # fmt: skip
        table.add_column(column, overflow="fold")
    if body:
        table.add_column("body", overflow="fold")

    def show(value: Any) -> str:
        return "" if value is None else str(to_jsonable(value))

    for record in records:
        exception = show(record["exception_type"])
        if record["exception_message"]:
            exception += f": {show(record['exception_message'])}"
        original = ""
        if record["original_exchange"] is not None or record["original_routing_key"] is not None:
            original = (
                f"{show(record['original_exchange']) or '(default)'} / "
                f"{show(record['original_routing_key'])}"
            )
        row = [
            str(record["index"]),
            show(record["message_id"]),
            exception,
            show(record["attempts"]),
            show(record["parked_reason"]),
            original,
            _death_summary(record["headers"]),
            show(record["last_failure"]),
        ]
        if body:
            row.append(record["body"])
        table.add_row(*row)
    state.out.print(table)


def _replay_properties(properties: BasicProperties, keep_headers: bool) -> BasicProperties:
    values = {name: getattr(properties, name) for name in BasicProperties.FIELDS}
    headers = dict(values["headers"] or {})
    if not keep_headers:
        headers = {
            k: v for k, v in headers.items()
            if not k.startswith("x-rabbitry-") and k not in _DEATH_HEADERS
        }  # fmt: skip
    values["headers"] = headers or None
    return BasicProperties(**values)


@dlq.command()
@_QUEUE
@_EXACT
@click.option(
    "--to", "to_exchange", default=None, metavar="EXCHANGE",
    help="Publish to this exchange instead of each message's original one ('' = default).",
)  # fmt: skip
@click.option(
    "-k", "--routing-key", default=None,
    help="Routing key to use (default: each message's original routing key).",
)  # fmt: skip
@click.option(
    "--filter", "filters", multiple=True, callback=_filters_callback, metavar="KEY=VALUE",
    help="Replay only messages whose header KEY equals VALUE (KEY may be exception, "
    "reason, attempts, original-exchange, original-routing-key). Repeat: all must match.",
)  # fmt: skip
@click.option("-n", "--count", type=click.IntRange(min=1), help="Replay at most this many.")
@click.option(
    "--keep-headers", is_flag=True,
    help="Keep the x-rabbitry-* failure headers and x-death (default: drop them, so the "
    "retry policy starts from the first attempt).",
)  # fmt: skip
@handle_errors
def replay(
    queue: str,
    exact: bool,
    to_exchange: str | None,
    routing_key: str | None,
    filters: list[Filter],
    count: int | None,
    keep_headers: bool,
) -> None:
    """Move parked messages back (to their original exchange and routing key by default).

    Each copy is published mandatory with a publisher confirm, and the parked message
    is removed only after the confirm: Ctrl-C in between can duplicate one message,
    never lose it. Messages that do not match --filter, or whose copy is nacked or
    unroutable, stay in QUEUE. Exits 1 if any matching message could not be moved.
    """
    state = get_state()
    name = resolve_queue(queue, exact)
    moved = skipped = 0
    skipped_counts: list[int] = []
    failures: list[str] = []
    conn = state.connect()
    try:
        channel = conn.channel(timeout=state.timeout)
        total = channel.queue_declare(name, passive=True, timeout=state.timeout).message_count
        goal = total if count is None else min(count, total)
        with (
            conn.publisher(confirm=True, mandatory=True, timeout=state.timeout) as publisher,
            progress(state, goal, f"replaying {name}") as advance,
        ):
            fetched = 0
            # At most the messages present at the start: copies routed back into this
            # queue (or messages parked meanwhile) are not taken again in this run.
            while fetched < total and (count is None or moved < count):
                # Messages skipped or failed stay unacknowledged on this channel, so the
                # next basic.get returns the next message; closing the channel gives
                # them back.
                message = channel.basic_get(name, no_ack=False, timeout=state.timeout)
                if message is None:
                    break
                fetched += 1
                headers = message.headers
                if not all(f.matches(headers) for f in filters):
                    skipped += 1
                    returned = _returns(headers)
                    if returned is not None:
                        skipped_counts.append(returned)
                    continue
                original = replay_target(headers)
                if to_exchange is not None:
                    exchange = to_exchange
                    key = routing_key if routing_key is not None else (
                        original[1] if original else message.routing_key
                    )  # fmt: skip
                elif original is not None:
                    exchange = original[0]
                    key = routing_key if routing_key is not None else original[1]
                else:
                    failures.append(
                        f"message {message.properties.message_id or message.delivery_tag}: "
                        "no original exchange in its headers; use --to"
                    )
                    continue
                future = publisher.publish(
                    message.body,
                    exchange=exchange,
                    routing_key=key,
                    properties=_replay_properties(message.properties, keep_headers),
                )
                try:
                    future.result(timeout=state.timeout + 1)
                except (PublishError, Timeout, TimeoutError) as exc:
                    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
                    failures.append(f"{type(exc).__name__}: {exc}{cause}")
                    continue
                # Confirmed at the target: only now remove the parked original.
                channel.basic_ack(message.delivery_tag)
                moved += 1
                advance(1)
        channel.close()
        remaining = (
            conn.channel(timeout=state.timeout)
            .queue_declare(name, passive=True, timeout=state.timeout)
            .message_count
        )
    finally:
        conn.close()
    _warn_returns(state, name, skipped_counts)
    result = {
        "queue": name,
        "replayed": moved,
        "skipped": skipped,
        "failed": len(failures),
        "remaining": remaining,
        "errors": failures[:20],
    }
    if state.json:
        state.emit_json(result)
    else:
        state.info(
            f"replayed {moved} from {name} ({skipped} skipped by filter, {len(failures)} "
            f"failed, {remaining} left)"
        )
    if failures:
        fail(f"{len(failures)} message(s) not replayed; first: {failures[0]}")


@dlq.command()
@_QUEUE
@_EXACT
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@handle_errors
def purge(queue: str, exact: bool, yes: bool) -> None:
    """Delete every message in QUEUE's parking lot (asks first unless --yes)."""
    state = get_state()
    name = resolve_queue(queue, exact)
    if not yes and not is_stdin_tty():
        fail(
            f"refusing to purge {name} without --yes (stdin is not a terminal)",
            ExitCode.USAGE,
        )
    conn = state.connect()
    try:
        channel = conn.channel(timeout=state.timeout)
        total = channel.queue_declare(name, passive=True, timeout=state.timeout).message_count
        if not yes:
            click.confirm(f"Delete all {total} message(s) in {name}?", abort=True)
        purged = channel.queue_purge(name, timeout=state.timeout).message_count
        channel.close()
    finally:
        conn.close()
    if state.json:
        state.emit_json({"queue": name, "purged": purged})
    else:
        state.info(f"purged {purged} message(s) from {name}")
