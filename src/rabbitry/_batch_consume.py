"""How :class:`rabbitry.consumer.AsyncConsumer` handles a batch envelope.

Each record goes to the handler as a :class:`~rabbitry.batching.BatchRecord`, in order,
one at a time (the envelope holds one handler slot). The envelope is acked once every
record was handled; the first record whose handler raises sends the *whole envelope*
down the consumer's failure path (its retry policy, or dead-lettering), the records
after it are not handed out, and a retry hands every record out again, the ones that
had succeeded included (at-least-once, per record). An envelope that cannot be split
(:class:`~rabbitry.exceptions.BatchFormatError`, a :class:`~rabbitry.exceptions.Reject`)
is parked or dead-lettered without retrying.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any

from .batching import settler_of, unpack
from .exceptions import BatchFormatError

if TYPE_CHECKING:
    from .consumer import AsyncConsumer
    from .protocol.message import Message

__all__ = ["handle_envelope"]


async def handle_envelope(consumer: AsyncConsumer, envelope: Message) -> None:
    """Hand the records of ``envelope`` to ``consumer``'s handler; settle the envelope."""
    dedup = consumer.dedup
    message_id = envelope.properties.message_id
    if dedup is not None and message_id and dedup.seen(message_id):
        consumer.stats.deduplicated += 1
        consumer._ack(envelope)
        return

    def settle(how: str, *, multiple: bool = False, requeue: bool = True) -> None:
        if how == "ack":
            consumer._ack(envelope)
        else:
            consumer._settle(envelope, how, requeue=requeue)

    try:
        records = unpack(envelope, settle)
    except BatchFormatError as exc:
        await consumer._fail(envelope, exc)
        return
    handler = consumer._handler
    for record in records:
        settler = settler_of(record)
        if settler is not None and settler.done:
            return  # the handler nacked or rejected a record: the envelope went with it
        try:
            result: Any = handler(record)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            if consumer._release_on_cancel and not (settler is not None and settler.done):
                consumer._settle(envelope, "nack", requeue=True)
                consumer.stats.released += 1
            raise
        except Exception as exc:
            if settler is None or not settler.done:
                await consumer._fail(envelope, exc)
            return
        if not record.settled and settler is not None and not settler.done:
            record.ack()
    if dedup is not None and message_id and envelope.settled:
        dedup.add(message_id)
