"""rabbitry AsyncPublisher with confirms, every message's confirm future awaited.

``await conn.publisher()`` with its defaults: confirms on, ``max_in_flight=1000`` (the
harness's ``ctx.window``). ``await publisher.send(...)`` returns one confirm future per
message, and this script awaits every one of them, the way an application that wants
each message's outcome would: it publishes ``ctx.window`` messages, then
``asyncio.gather``s their futures (``return_exceptions=True``: a nack is counted, not
raised), then publishes the next chunk. The last chunk may be shorter. ``rabbitry_publisher``
instead keeps the futures, looks only at the settled ones in bulk and ends with one
``wait_for_confirms()``; here each future gets a waiter, and the pipeline empties at the
end of every chunk (as in S6, but with one ``publish`` call per message).

Only S2b and S3 (S3 with ``persistent=True`` to a durable queue): S1 has no confirms
(``rabbitry_publisher`` runs it with ``confirm=False``), S2a already awaits each future
before the next publish in ``rabbitry_publisher``, and S6 is ``publish_batch``. The
worker reports the others as not implemented. Timing ends at the last confirm; the
number of acked futures is reported as ``confirmed``.
"""

from __future__ import annotations

import asyncio

from common import URL, Ctx

import rabbitry


async def _pipelined(ctx: Ctx) -> None:
    conn = rabbitry.AsyncConnection(URL)
    await conn.connect()
    ch = await conn.channel()
    await ch.queue_declare(ctx.queue, durable=ctx.durable)
    publisher = await conn.publisher()
    q, body, publish = ctx.queue, ctx.body, publisher.send
    persistent = True if ctx.persistent else None
    chunk = ctx.window
    confirmed = failed = 0
    ctx.note(f"AsyncPublisher with confirms: every future awaited, gathered per chunk of {chunk}")
    ctx.start()
    left = ctx.n
    while left:
        k = min(chunk, left)
        futures = [await publish(body, routing_key=q, persistent=persistent) for _ in range(k)]
        for outcome in await asyncio.gather(*futures, return_exceptions=True):
            if outcome is None:
                confirmed += 1
            else:
                failed += 1
        left -= k
    ctx.stop()
    ctx.extra["confirmed"] = confirmed
    if failed:
        ctx.note(f"{failed} failed")
    await publisher.close()
    await ch.queue_delete(ctx.queue)
    await conn.close()


def s2b(ctx: Ctx) -> None:
    asyncio.run(_pipelined(ctx))


def s3(ctx: Ctx) -> None:
    asyncio.run(_pipelined(ctx))
