"""How a consumer hands its deliveries to its handler, and settles them.

:class:`Handling` does it for :class:`rabbitry.consumer.AsyncConsumer`: a message is
acked when the handler returns, and goes down the failure path when it raises. A list
handler's batch (``batch_size``) is acked with one multiple-ack when the handler
returns (with ``concurrency=1``), and its duplicates (``dedup``) are acked unseen; the
messages the handler returns as failed go down the failure path one by one.

A batch envelope's records:

Each record goes to the handler as a :class:`~rabbitry.batching.BatchRecord`, in order,
one at a time (the envelope holds one handler slot). The envelope is acked once every
record was handled. A record whose handler raises does not stop the others: every
record is handed to the handler, then the *whole envelope* goes down the consumer's
failure path once (its retry policy, dead-lettering, or a drop that is counted in
records and logged with the record count), so no record goes that the handler never
saw. A retry hands every record out again, the ones that had succeeded included
(at-least-once, per record). A record the handler rejects without requeue waits for
the others in the same way (see :mod:`rabbitry.batching`). An envelope that cannot be
split (:class:`~rabbitry.exceptions.BatchFormatError`, a
:class:`~rabbitry.exceptions.Reject`) is parked or dead-lettered without retrying.

A consumer with ``batch_size`` (a list handler) gets the records of the envelopes of
its batch in the list, in place of the envelopes, between the plain messages; an
envelope is acked when none of its records failed (rejected when the handler rejected
one without requeue), and goes down the failure path (once) when any failed. Its plain
messages are acked one by one in such a batch.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from ..batching import BATCH_FORMAT_HEADER, is_envelope, settler_of, unpack
from ..exceptions import BatchFormatError, InvalidStateError, Retry
from ..protocol.message import Message

if TYPE_CHECKING:
    from collections.abc import Callable

    from .settle import FailurePath, Settler
    from .stores import DedupStore

__all__ = ["Handling", "failed_items"]

logger = logging.getLogger("rabbitry.consumer")


class _Owner(Protocol):
    """What :class:`Handling` reads of its consumer (it also names it in its logs)."""

    @property
    def dedup(self) -> DedupStore | None: ...

    @property
    def concurrency(self) -> int: ...


class Handling:
    """Hands deliveries to the handler (single messages, batches and batch envelopes,
    skipping duplicates) and settles them (see above).

    Args:
        owner: the consumer (its ``dedup`` store and ``concurrency``).
        handler: the consumer's handler.
        settler: settles the consumer's deliveries.
        failure: where the messages the handler failed on go.
        release_on_cancel: requeue what a cancelled handling held (``False`` when the
            handler runs on a thread that a cancel does not stop).
    """

    __slots__ = ("failure", "handler", "owner", "release_on_cancel", "settler", "stats")

    def __init__(
        self,
        owner: _Owner,
        handler: Callable[[Any], object],
        settler: Settler,
        failure: FailurePath,
        *,
        release_on_cancel: bool,
    ) -> None:
        self.owner = owner
        self.handler = handler
        self.settler = settler
        self.failure = failure
        self.stats = settler.stats
        self.release_on_cancel = release_on_cancel

    async def handle(self, message: Message) -> None:
        """Hand ``message`` to the handler (an envelope's records one by one); settle it.

        Args:
            message: a delivery.
        """
        headers = message.properties.headers
        if headers and BATCH_FORMAT_HEADER in headers:  # a batch envelope: its records
            await self.handle_envelope(message)
            return
        message_id = message.properties.message_id
        dedup = self.owner.dedup
        if dedup is not None and message_id and dedup.seen(message_id):
            # Already processed: ack it without calling the handler.
            self.stats.deduplicated += 1
            self.settler.ack(message)
            return
        try:
            result = self.handler(message)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            # stop(drain=False) or a timed-out drain: hand the message back, unless a
            # thread still runs the handler on it (sync facade): then it stays unacked
            # and the broker requeues it when stop() closes the channel.
            if self.release_on_cancel:
                self.settler.settle(message, "nack", requeue=True)
                self.stats.released += 1
            raise
        except Exception as exc:
            await self.failure.fail(message, exc)
            return
        self.settler.ack(message)
        dedup = self.owner.dedup
        if dedup is not None and message_id:
            dedup.add(message_id)

    async def handle_batch(self, batch: list[Message]) -> None:
        """Hand a list handler its batch; settle the batch.

        Args:
            batch: the messages, in delivery order.
        """
        dedup = self.owner.dedup
        if dedup is not None:
            batch = self._drop_duplicates(dedup, batch)  # an envelope by its own message_id
            if not batch:
                return
        if any(m.properties.headers and BATCH_FORMAT_HEADER in m.properties.headers for m in batch):
            await self._handle_batch_with_envelopes(batch)  # records in the envelopes' place
            return
        failed: list[tuple[Message, BaseException]] = []
        try:
            result = self.handler(batch)
            if inspect.isawaitable(result):
                result = await result
            if result is not None:
                failed = failed_items(batch, result)
        except asyncio.CancelledError:
            if self.release_on_cancel:
                for message in batch:
                    self.settler.settle(message, "nack", requeue=True)
            raise
        except Exception as exc:
            if isinstance(exc, InvalidStateError):
                logger.error("consumer %s: %s; treating the whole batch as failed", self.owner, exc)
            failed = [(message, exc) for message in batch]
        failed_ids = {id(message) for message, _ in failed}
        for message, error in failed:
            await self.failure.fail(message, error)
        remaining = [m for m in batch if id(m) not in failed_ids and not m.settled]
        if dedup is not None:
            for message in remaining:
                if message.properties.message_id:
                    dedup.add(message.properties.message_id)
        if not remaining or not self.settler.manual:
            return
        if self.owner.concurrency == 1 and all(m.settled for m, _ in failed):
            # One multiple-ack settles the rest of the batch: every earlier unsettled
            # delivery on this channel is in it (one batch at a time, failed ones already
            # moved), so it acks nothing else. A failed move stays unacked: no multiple.
            last = max(remaining, key=lambda m: m.delivery_tag)
            if self.settler.settle(last, "ack", multiple=True):
                for message in remaining:
                    message.settled = True
                self.stats.acked += len(remaining)
            return
        for message in remaining:
            self.settler.ack(message)

    def _drop_duplicates(self, dedup: DedupStore, batch: list[Message]) -> list[Message]:
        """Ack the messages the dedup store has seen; return the others."""
        fresh = []
        in_batch: set[str] = set()  # a second copy in the same batch is a duplicate too
        for message in batch:
            message_id = message.properties.message_id
            if message_id and (message_id in in_batch or dedup.seen(message_id)):
                self.stats.deduplicated += 1
                self.settler.ack(message)
            else:
                if message_id:
                    in_batch.add(message_id)
                fresh.append(message)
        return fresh

    async def handle_envelope(self, envelope: Message) -> None:
        """Hand the records of ``envelope`` to the handler; settle the envelope.

        Args:
            envelope: a delivery with the batch format header.
        """
        dedup = self.owner.dedup
        message_id = envelope.properties.message_id
        if dedup is not None and message_id and dedup.seen(message_id):
            self.stats.deduplicated += 1
            self.settler.ack(envelope)
            return

        def settle(how: str, *, multiple: bool = False, requeue: bool = True) -> None:
            if how == "ack":
                self.settler.ack(envelope)
            else:
                self.settler.settle(envelope, how, requeue=requeue)

        try:
            records = unpack(envelope, settle)
        except BatchFormatError as exc:
            await self.failure.fail(envelope, exc)
            return
        handler = self.handler
        settler = settler_of(records[0]) if records else None
        failures: list[BaseException] = []
        for record in records:
            if settler is not None and settler.done:
                return  # the handler nacked or rejected a record: the envelope went with it
            try:
                result: Any = handler(record)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                if self.release_on_cancel and not (settler is not None and settler.done):
                    self.settler.settle(envelope, "nack", requeue=True)
                    self.stats.released += 1
                raise
            except Exception as exc:
                # The records after it still go to the handler: the envelope's outcome
                # (retry, park, dead-letter, drop) is decided once every record was seen,
                # so no record is dropped without the handler ever seeing it.
                failures.append(exc)
                continue
            if not record.settled and settler is not None and not settler.done:
                record.ack()
        if failures:
            if settler is not None:
                if settler.done:
                    return
                settler.done = True  # the failure path settles the envelope itself
            await self.failure.fail(envelope, failures[0], records=(len(failures), len(records)))
            return
        if dedup is not None and message_id and envelope.settled:
            dedup.add(message_id)

    async def _handle_batch_with_envelopes(self, batch: list[Message]) -> None:
        """A list handler's batch that holds envelopes: records in their place (see above)."""

        def settle_for(envelope: Message) -> Any:
            def settle(how: str, *, multiple: bool = False, requeue: bool = True) -> None:
                if how == "ack":
                    self.settler.ack(envelope)
                else:
                    self.settler.settle(envelope, how, requeue=requeue)

            return settle

        items: list[Message] = []
        owner: dict[int, Message] = {}
        envelopes: list[Message] = []
        for message in batch:
            if not is_envelope(message):
                items.append(message)
                continue
            try:
                records = unpack(message, settle_for(message))
            except BatchFormatError as exc:
                await self.failure.fail(message, exc)
                continue
            envelopes.append(message)
            for record in records:
                owner[id(record)] = message
            items.extend(records)
        failed: list[tuple[Message, BaseException]] = []
        if items:
            try:
                result: Any = self.handler(items)
                if inspect.isawaitable(result):
                    result = await result
                if result is not None:
                    failed = failed_items(items, result)
            except asyncio.CancelledError:
                if self.release_on_cancel:
                    for message in (*envelopes, *(m for m in items if id(m) not in owner)):
                        self.settler.settle(message, "nack", requeue=True)
                raise
            except Exception as exc:
                failed = [(message, exc) for message in items]
        failed_envelopes: dict[int, tuple[Message, BaseException]] = {}
        failed_plain: set[int] = set()
        for message, error in failed:
            envelope = owner.get(id(message))
            if envelope is None:
                failed_plain.add(id(message))
                await self.failure.fail(message, error)
            else:
                failed_envelopes.setdefault(id(envelope), (envelope, error))
        for envelope, error in failed_envelopes.values():
            if not envelope.settled:
                await self.failure.fail(envelope, error)
        handled = [m for m in items if id(m) not in owner and id(m) not in failed_plain]
        for message in handled:
            self.settler.ack(message)  # no-op when the handler settled it
        settled = [e for e in envelopes if id(e) not in failed_envelopes]
        for message in items:
            # Each record the handler left open is acked through its envelope, which
            # goes once all its records did: acked, or rejected when the handler
            # rejected one of them without requeue.
            if id(message) in owner and id(owner[id(message)]) not in failed_envelopes:
                settler = settler_of(message)
                if not message.settled and settler is not None and not settler.done:
                    message.ack()
        handled += settled
        dedup = self.owner.dedup
        if dedup is not None:
            for message in handled:
                if message.properties.message_id:
                    dedup.add(message.properties.message_id)


def failed_items(batch: list[Message], result: object) -> list[tuple[Message, BaseException]]:
    """Validate what a batch handler returned; each failed message once, in order.

    Args:
        batch: the batch the handler got.
        result: what it returned (not ``None``).

    Returns:
        ``(message, exception)`` per failed message; :class:`Retry` when it gave none.

    Raises:
        InvalidStateError: ``result`` is not a collection of messages of ``batch``.
    """
    if not isinstance(result, Iterable) or isinstance(result, (str, bytes)):
        raise InvalidStateError(
            "a batch handler must return None or a collection of the messages that "
            f"failed, got {type(result).__name__}"
        )
    members = {id(m) for m in batch}
    failed: dict[int, tuple[Message, BaseException]] = {}
    for item in result:
        exc: BaseException | None = None
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], BaseException | None):
                raise InvalidStateError(
                    "a batch handler returned a malformed item: expected a message or "
                    "(message, exception)"
                )
            message, exc = item
        else:
            message = item
        if not isinstance(message, Message) or id(message) not in members:
            raise InvalidStateError("a batch handler returned a message not in its batch")
        failed.setdefault(id(message), (message, exc or Retry("failed in a batch")))
    return list(failed.values())
