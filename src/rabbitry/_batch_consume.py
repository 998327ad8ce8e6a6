"""How :class:`rabbitry.consumer.AsyncConsumer` handles a batch envelope.

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
from typing import TYPE_CHECKING, Any, Protocol

from .batching import is_envelope, settler_of, unpack
from .exceptions import BatchFormatError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .protocol.message import Message

__all__ = ["EnvelopeHandling"]


class _Dedup(Protocol):
    def seen(self, key: str) -> bool: ...

    def add(self, key: str) -> None: ...


class _Stats(Protocol):
    deduplicated: int
    released: int


class _Consumer(Protocol):
    """What :class:`EnvelopeHandling` uses of the consumer it is a base of."""

    @property
    def dedup(self) -> _Dedup | None: ...

    @property
    def stats(self) -> _Stats: ...

    @property
    def _handler(self) -> Callable[[Any], object]: ...

    @property
    def _release_on_cancel(self) -> bool: ...

    def _ack(self, message: Message) -> None: ...

    def _settle(self, message: Message, how: str, **options: Any) -> bool: ...

    async def _fail(
        self, message: Message, exc: BaseException, records: tuple[int, int] | None = None
    ) -> None: ...

    def _failed_items(
        self, batch: list[Message], result: object
    ) -> list[tuple[Message, BaseException]]: ...


class EnvelopeHandling:
    """Handling batch envelopes: a base of :class:`~rabbitry._consumer_core._ConsumerCore`,
    its methods typed against the members of the consumer they use (``_Consumer``)."""

    async def _handle_envelope(self: _Consumer, envelope: Message) -> None:
        """Hand the records of ``envelope`` to the handler; settle the envelope."""
        dedup = self.dedup
        message_id = envelope.properties.message_id
        if dedup is not None and message_id and dedup.seen(message_id):
            self.stats.deduplicated += 1
            self._ack(envelope)
            return

        def settle(how: str, *, multiple: bool = False, requeue: bool = True) -> None:
            if how == "ack":
                self._ack(envelope)
            else:
                self._settle(envelope, how, requeue=requeue)

        try:
            records = unpack(envelope, settle)
        except BatchFormatError as exc:
            await self._fail(envelope, exc)
            return
        handler = self._handler
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
                if self._release_on_cancel and not (settler is not None and settler.done):
                    self._settle(envelope, "nack", requeue=True)
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
            await self._fail(envelope, failures[0], records=(len(failures), len(records)))
            return
        if dedup is not None and message_id and envelope.settled:
            dedup.add(message_id)

    async def _handle_batch_with_envelopes(self: _Consumer, batch: list[Message]) -> None:
        """A list handler's batch that holds envelopes: records in their place (see above)."""

        def settle_for(envelope: Message) -> Any:
            def settle(how: str, *, multiple: bool = False, requeue: bool = True) -> None:
                if how == "ack":
                    self._ack(envelope)
                else:
                    self._settle(envelope, how, requeue=requeue)

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
                await self._fail(message, exc)
                continue
            envelopes.append(message)
            for record in records:
                owner[id(record)] = message
            items.extend(records)
        failed: list[tuple[Message, BaseException]] = []
        if items:
            try:
                result: Any = self._handler(items)
                if inspect.isawaitable(result):
                    result = await result
                if result is not None:
                    failed = self._failed_items(items, result)
            except asyncio.CancelledError:
                if self._release_on_cancel:
                    for message in (*envelopes, *(m for m in items if id(m) not in owner)):
                        self._settle(message, "nack", requeue=True)
                raise
            except Exception as exc:
                failed = [(message, exc) for message in items]
        failed_envelopes: dict[int, tuple[Message, BaseException]] = {}
        failed_plain: set[int] = set()
        for message, error in failed:
            envelope = owner.get(id(message))
            if envelope is None:
                failed_plain.add(id(message))
                await self._fail(message, error)
            else:
                failed_envelopes.setdefault(id(envelope), (envelope, error))
        for envelope, error in failed_envelopes.values():
            if not envelope.settled:
                await self._fail(envelope, error)
        handled = [m for m in items if id(m) not in owner and id(m) not in failed_plain]
        for message in handled:
            self._ack(message)  # no-op when the handler settled it
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
        if self.dedup is not None:
            for message in handled:
                if message.properties.message_id:
                    self.dedup.add(message.properties.message_id)
