"""rabbitry's thread-safe handler-based consumer (Consumer) on the consume scenarios.

The synchronous twin of ``rabbitry_consumer``: ``conn.consumer(queue, handler,
prefetch=ctx.prefetch)`` on a ``rabbitry.Connection``, with a plain (non-async) handler
that only counts and returns. The consumer runs it on its handler thread (``concurrency``
1) and acks the message on the IO thread once it has returned. Only S4 and S4m; the
publish scenarios and S5 are left to ``rabbitry_sync`` (the worker reports them as not
implemented).

* S4: one handler call and one ``basic.ack`` per message.
* S4m: ``batch_size=ctx.multi_every`` (100): the handler gets lists of up to 100
  messages and the consumer settles each batch with one ``multiple=True`` ack.
  ``batch_timeout`` is 0.05 s so that a last partial batch (counts not divisible by 100
  under ``--scale``) does not add the default 1 s wait.

Timing follows the harness (``common.py``): the queue is pre-filled and declared
untimed. ``ctx.start()`` comes before ``consumer.start()`` (channel open, basic.qos,
basic.consume). The handler of the last message sets a ``threading.Event`` the main
thread waits on; the end barrier is ``consumer.stop()``: it waits for the running
handler and its ack (``drain``), cancels the subscription and closes the consumer's
channel, a synchronous RPC the broker answers only after every ack before it on that
channel. So the timed section has two round trips more than ``rabbitry_consumer``'s
(whose barrier is one passive ``queue.declare`` and whose stop is untimed) and one
more than ``rabbitry_sync``'s (cancel + ``queue.declare``). CPU is ``getrusage`` of the
whole process: the IO thread and the handler thread are included.
"""

from __future__ import annotations

import threading

from common import URL, Ctx

import rabbitry


def _consume(ctx: Ctx, batch: bool) -> None:
    conn = rabbitry.Connection(URL)
    conn.connect()
    ch = conn.channel()
    ch.queue_declare(ctx.queue, durable=ctx.durable)
    n = ctx.n
    done = threading.Event()
    count = 0

    if batch:

        def handler(messages: list[rabbitry.Message]) -> None:
            nonlocal count
            count += len(messages)
            if count >= n:
                done.set()

        consumer = conn.consumer(
            ctx.queue,
            handler,
            prefetch=ctx.prefetch,
            batch_size=ctx.multi_every,
            batch_timeout=0.05,
        )
        ctx.note(
            f"Consumer, batch_size={ctx.multi_every}: one multiple ack per batch after the "
            "handler returns on its thread"
        )
    else:

        def handler(message: rabbitry.Message) -> None:
            nonlocal count
            count += 1
            if count >= n:
                done.set()

        consumer = conn.consumer(ctx.queue, handler, prefetch=ctx.prefetch)
        ctx.note(
            "Consumer: plain handler on a pool thread, the consumer acks each message after it"
        )

    ctx.start()
    consumer.start()
    done.wait()
    consumer.stop()  # barrier: drains the last ack, then cancel and channel.close
    ctx.stop()
    stats = consumer.stats
    if stats.acked != n:
        ctx.note(f"acked {stats.acked} of {n}")
    ctx.extra["consumer_stats"] = stats.as_dict()
    ch.queue_delete(ctx.queue)
    conn.close()


def s4(ctx: Ctx) -> None:
    _consume(ctx, False)


def s4m(ctx: Ctx) -> None:
    _consume(ctx, True)
