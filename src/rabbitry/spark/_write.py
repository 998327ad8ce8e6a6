"""The write side of the data source, without pyspark: one task's rows → confirmed messages.

Memory is bounded by the confirm window (``maxInFlight``), not by the partition: each
publish's outcome is tallied when it settles and nothing per row is kept afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import AMQPError, NotFound, Unroutable
from ._core import PublishFailed
from ._rows import row_to_message

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Iterable, Mapping

    from ._options import WriteOptions

__all__ = ["PublishResult", "UnroutableRows", "publish_rows"]

logger = logging.getLogger("rabbitry.spark")

# Distinct (exchange, routing key) pairs named in an UnroutableRows message.
_MAX_NAMED_ROUTES = 5


class UnroutableRows(PublishFailed):
    """Rows were returned by the broker as unroutable (``mandatory=true``, the default).

    Attributes:
        returned: how many rows were returned.
        routes: returned rows per ``(exchange, routing_key)`` (the first few pairs).
    """

    def __init__(self, message: str, returned: int, routes: dict[tuple[str, str], int]) -> None:
        super().__init__(message)
        self.returned = returned
        self.routes = routes


@dataclasses.dataclass
class PublishResult:
    """What one write task published (all confirmed)."""

    partition_id: int
    attempt: int
    published: int
    confirmed: int
    first_message_id: str | None
    last_message_id: str | None


class _Tally:
    """Outcomes of the task's publishes, counted as they settle (IO thread)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.sent = 0
        self.settled = 0
        self.failed = 0
        self.returned = 0
        self.routes: dict[tuple[str, str], int] = {}
        self.first_error: BaseException | None = None

    def track(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self.sent += 1
        future.add_done_callback(self._settle)

    def _settle(self, future: concurrent.futures.Future[None]) -> None:
        error = future.exception()
        with self._lock:
            self.settled += 1
            if error is not None:
                self.failed += 1
                if isinstance(error, Unroutable):
                    self.returned += 1
                    route = (error.message.exchange, error.message.routing_key)
                    if route in self.routes or len(self.routes) < _MAX_NAMED_ROUTES:
                        self.routes[route] = self.routes.get(route, 0) + 1
                if self.first_error is None:
                    self.first_error = error
            if self.settled == self.sent:
                self._lock.notify_all()

    def wait(self, deadline: float) -> bool:
        """Until every publish settled or ``deadline``; whether all settled."""
        with self._lock:
            while self.settled < self.sent:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True


def _failure(tally: _Tally, partition_id: int, exchange: str) -> PublishFailed:
    if tally.returned:
        routes = ", ".join(
            f"exchange {ex!r} routing key {key!r}: {count}"
            for (ex, key), count in tally.routes.items()
        )
        message = (
            f"rabbitmq write (partition {partition_id}): {tally.returned} row(s) were "
            f"unroutable (returned by the broker: no queue is bound for them) — {routes}. "
            "Bind a queue, fix the routing key, or set mandatory=false to let the broker "
            "drop unroutable rows"
        )
        logger.error("%s", message)
        return UnroutableRows(message, tally.returned, dict(tally.routes))
    error = tally.first_error
    message = (
        f"rabbitmq write (partition {partition_id}, exchange {exchange!r}): "
        f"{tally.failed} of {tally.sent} message(s) not confirmed: "
        f"{type(error).__name__}: {error}"
    )
    logger.error("%s", message)
    return PublishFailed(message)


def publish_rows(
    options: WriteOptions,
    rows: Iterable[Mapping[str, Any]],
    id_prefix: str,
    partition_id: int,
    attempt: int,
) -> PublishResult:
    """Publish every row with pipelined confirms; raise :class:`PublishFailed` otherwise.

    ``message_id`` defaults to ``f"{id_prefix}:{index}"`` (deterministic per task, so a
    retried task publishes the same ids). Publishing stops at the first failed publish
    seen (returned, nacked, timed out), waits for the rest, and raises.

    Raises:
        UnroutableRows: rows were returned (``mandatory``).
        PublishFailed: anything else that kept a row from being confirmed.
    """
    conn = options.connect.connect(f" [spark writer p{partition_id}]")
    tally = _Tally()
    first_id: str | None = None
    last_id: str | None = None
    exchange = options.exchange
    try:
        if options.check_exchange and exchange:
            probe = conn.channel()
            try:
                probe.exchange_declare(exchange, passive=True)
            except NotFound:
                raise PublishFailed(
                    f"option exchange: exchange {exchange!r} does not exist"
                ) from None
            probe.close()
        publisher = conn.publisher(
            confirm=True,
            max_in_flight=options.max_in_flight,
            mandatory=options.mandatory,
            timeout=options.confirm_timeout,
        )
        routing_key = options.routing_key or ""
        mode = 2 if options.persistent else 1
        publish = publisher.publish
        track = tally.track
        try:
            for index, row in enumerate(rows):
                if tally.failed:
                    break
                body, to_exchange, key, props = row_to_message(
                    row, routing_key, exchange, f"{id_prefix}:{index}", mode
                )
                if first_id is None:
                    first_id = props.message_id
                last_id = props.message_id
                track(publish(body, exchange=to_exchange, routing_key=key, properties=props))
        except AMQPError as exc:
            raise PublishFailed(
                f"rabbitmq write (partition {partition_id}): publishing failed after "
                f"{tally.sent} message(s): {exc}"
            ) from exc
        if not tally.wait(time.monotonic() + options.confirm_timeout):
            raise PublishFailed(
                f"rabbitmq write (partition {partition_id}, exchange {exchange!r}): "
                f"{tally.sent - tally.settled} of {tally.sent} message(s) not confirmed "
                f"within {options.confirm_timeout:.0f} s (option confirmTimeoutMs)"
            )
        if tally.failed:
            raise _failure(tally, partition_id, exchange) from tally.first_error
        return PublishResult(partition_id, attempt, tally.sent, tally.sent, first_id, last_id)
    finally:
        with contextlib.suppress(Exception):
            conn.close(timeout=5)
