"""Micro-batching: several records in one AMQP message, in Spring AMQP's batch format.

A *batch envelope* is one AMQP message that carries several records. rabbitry speaks
the format of Spring AMQP's ``SimpleBatchingStrategy`` (``BatchingRabbitTemplate``), so
batches interoperate with Spring listeners in both directions:

* the header ``springBatchFormat`` is ``lengthHeader4`` (:data:`BATCH_FORMAT_HEADER`,
  :data:`LENGTH_HEADER4`);
* the body is every record's bytes, each preceded by its length as a 4-byte big-endian
  unsigned integer, back to back, nothing before the first nor after the last;
* the header ``amqp_batchSize`` (:data:`BATCH_SIZE_HEADER`) holds the record count
  (Spring writes it; a reader does not need it, and rabbitry checks it when present);
* every other property (content type, delivery mode, headers...) is the records'
  own: all records of one envelope share them. A batch of one record is sent as a
  plain message, without the header, as Spring does.

Reading: a message without the ``springBatchFormat`` header is a plain message and
passes through unchanged. One with the header is split by :func:`unpack` into
:class:`BatchRecord` messages, one per record, with the envelope's properties minus the
two batch headers. A ``springBatchFormat`` other than ``lengthHeader4``, a truncated
body or a count that does not match raises :class:`~rabbitry.exceptions.BatchFormatError`:
a consumer never hands out bytes it could not frame.

Settling: a record's ``ack()`` counts; the envelope is acked once every record was
acked. In a ``consume()`` iteration a record's ``ack(multiple=True)`` or
``nack(multiple=True)`` means what it means for a message: every record handed out up
to it is settled so, those of earlier envelopes included (:class:`RecordLedger`). A
record's ``nack()`` or ``reject()`` with ``requeue=True`` returns the whole envelope at
once: its records not yet handed out are skipped and come again with it. Without
requeue only that record counts as rejected: the records after it are still handed
out, and the envelope is rejected (dead-lettered or dropped, the records handled with
it too) once every record was settled, so no record goes that was never handed out.
A record's tag is its envelope's, so a record settled after its connection recovered
is dropped as stale like any message (the broker redelivers the envelope). See
``docs/publishing.md`` ("Micro-batching").
"""

from .protocol.batching import (
    BATCH_FORMAT_HEADER,
    BATCH_SIZE_HEADER,
    LENGTH_HEADER4,
    MAX_RECORD_BYTES,
    BatchRecord,
    RecordLedger,
    decode_records,
    encode_records,
    envelope_headers,
    is_envelope,
    iter_delivery,
    unpack,
)
from .protocol.batching import settler_of as settler_of

__all__ = [
    "BATCH_FORMAT_HEADER",
    "BATCH_SIZE_HEADER",
    "LENGTH_HEADER4",
    "MAX_RECORD_BYTES",
    "BatchRecord",
    "RecordLedger",
    "decode_records",
    "encode_records",
    "envelope_headers",
    "is_envelope",
    "iter_delivery",
    "unpack",
]
