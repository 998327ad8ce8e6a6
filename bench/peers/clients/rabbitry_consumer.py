"""rabbitry's handler-based consumer (AsyncConsumer) on the consume scenarios.

Only S4 and S4m: the consumer is a consuming API, so the publish scenarios and S5 are
left to ``rabbitry_async`` (the worker reports them as not implemented).

* S4: ``conn.consumer(queue, handler, prefetch=ctx.prefetch)`` with an ``async def``
  handler that only counts; the consumer acks each message after its handler returns
  (manual ack, the default), one ``basic.ack`` per message.
* S4m: the same with ``batch_size=ctx.multi_every`` (100): the handler gets lists of up
  to 100 messages and the consumer settles each batch with one ``multiple=True`` ack.
  ``batch_timeout`` is 0.05 s so a last partial batch (counts not divisible by 100 under
  ``--scale``) does not add the default 1 s wait.

Timing follows the harness (``common.py``): the queue is pre-filled and declared
untimed; ``ctx.start()`` comes before ``consumer.start()`` (channel open, basic.qos,
basic.consume: one channel open and one qos more than ``rabbitry_async``, which sets
qos before timing); the end barrier is a passive ``queue.declare`` on the consumer's
own channel after the last ack was queued, so it is answered only after the broker has
processed every ack. ``consumer.stop()``, the queue delete and the close are untimed.
"""

from __future__ import annotations

import asyncio

from common import URL, Ctx

import rabbitry


async def _consume(ctx: Ctx, batch: bool) -> None:
    conn = rabbitry.AsyncConnection(URL)
    await conn.connect()
    ch = await conn.channel()
    await ch.queue_declare(ctx.queue, durable=ctx.durable)
    n = ctx.n
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    count = 0

    if batch:

        async def handler(messages: list[rabbitry.Message]) -> None:
            nonlocal count
            count += len(messages)
            if count >= n and not done.done():
                done.set_result(None)

        consumer = conn.consumer(
            ctx.queue,
            handler,
            prefetch=ctx.prefetch,
            batch_size=ctx.multi_every,
            batch_timeout=0.05,
        )
        ctx.note(
            f"AsyncConsumer, batch_size={ctx.multi_every}: one multiple ack per batch "
            "after the async handler returns"
        )
    else:

        async def handler(message: rabbitry.Message) -> None:
            nonlocal count
            count += 1
            if count >= n and not done.done():
                done.set_result(None)

        consumer = conn.consumer(ctx.queue, handler, prefetch=ctx.prefetch)
        ctx.note("AsyncConsumer: async handler, the consumer acks each message after it")

    ctx.start()
    await consumer.start()
    # The handler sets `done` and returns; the consumer's ack follows in the same task
    # step, so by the time this line resumes the last ack is queued on the channel.
    await done
    await asyncio.sleep(0)
    channel = consumer.channel
    assert channel is not None
    await channel.queue_declare(ctx.queue, durable=ctx.durable, passive=True)  # barrier
    ctx.stop()
    if consumer.stats.acked != n:
        ctx.note(f"acked {consumer.stats.acked} of {n}")
    ctx.extra["consumer_stats"] = consumer.stats.as_dict()
    await consumer.stop()
    await ch.queue_delete(ctx.queue)
    await conn.close()


def s4(ctx):
    asyncio.run(_consume(ctx, False))


def s4m(ctx):
    asyncio.run(_consume(ctx, True))
