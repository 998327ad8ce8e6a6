"""rabbitry, asyncio high-level API (AsyncPublisher), idiomatic use.

``await conn.publisher(...)`` gives a publisher on its own channel. ``await
publisher.send(...)`` waits only while ``max_in_flight`` messages are unconfirmed
(the window is the publisher's, not the benchmark's) and returns a future per message;
the script keeps the futures and checks the settled ones in bulk, so nacks are counted
without awaiting each one. Every message gets a generated ``message_id`` (the publisher
always sets one), which the channel-level clients do not send. S2a uses ``await
publisher.publish(...)``, which returns once the message is confirmed. S1 uses
``confirm=False`` (fire-and-forget); S6 sends batches of ``ctx.window`` messages with
``publish_batch`` (one write per batch) and waits for each batch's outcomes.
"""
from __future__ import annotations

import asyncio
from collections import deque

import rabbitry

from common import POLL_SLEEP, URL, Ctx


async def _connect(ctx: Ctx, confirm: bool):
    conn = rabbitry.AsyncConnection(URL)
    await conn.connect()
    ch = await conn.channel()
    await ch.queue_declare(ctx.queue, durable=ctx.durable)
    publisher = await conn.publisher(confirm=confirm, max_in_flight=ctx.window)
    return conn, ch, publisher


async def _finish(ctx: Ctx, conn, ch, publisher) -> None:
    await publisher.close()
    await ch.queue_delete(ctx.queue)
    await conn.close()


def _count_failures(pending: deque, keep: int) -> int:
    """Drop settled futures from the front (beyond ``keep``); count the failed ones."""
    failed = 0
    while len(pending) > keep and pending[0].done():
        if pending.popleft().exception() is not None:
            failed += 1
    return failed


async def _s1(ctx: Ctx) -> None:
    conn, ch, publisher = await _connect(ctx, confirm=False)
    q, body, publish = ctx.queue, ctx.body, publisher.send
    ctx.note("AsyncPublisher(confirm=False): fire-and-forget")
    ctx.start()
    for _ in range(ctx.n):
        await publish(body, routing_key=q)
    while (await ch.queue_declare(q, durable=ctx.durable, passive=True)).message_count < ctx.n:
        await asyncio.sleep(POLL_SLEEP)
    ctx.stop()
    await _finish(ctx, conn, ch, publisher)


async def _s2a(ctx: Ctx) -> None:
    conn, ch, publisher = await _connect(ctx, confirm=True)
    q, body, publish = ctx.queue, ctx.body, publisher.publish
    ctx.start()
    for _ in range(ctx.n):
        await publish(body, routing_key=q)  # returns once confirmed; raises Nacked on nack
    ctx.stop()
    await _finish(ctx, conn, ch, publisher)


async def _pipelined(ctx: Ctx) -> None:
    conn, ch, publisher = await _connect(ctx, confirm=True)
    q, body, publish = ctx.queue, ctx.body, publisher.send
    persistent = True if ctx.persistent else None
    window = ctx.window
    pending: deque = deque()
    append = pending.append
    failed = 0
    ctx.note(f"AsyncPublisher max_in_flight={window}; futures checked in bulk")
    ctx.start()
    for i in range(ctx.n):
        append(await publish(body, routing_key=q, persistent=persistent))
        if i % window == 0:
            failed += _count_failures(pending, 0)
    await publisher.wait_for_confirms()
    failed += _count_failures(pending, 0)
    ctx.stop()
    if failed or pending:
        ctx.note(f"{failed} failed, {len(pending)} unsettled")
    await _finish(ctx, conn, ch, publisher)


async def _s6(ctx: Ctx) -> None:
    conn, ch, publisher = await _connect(ctx, confirm=True)
    q, body, batch = ctx.queue, ctx.body, ctx.window
    failed = 0
    ctx.note(f"publish_batch of {batch}, outcomes awaited per batch")
    ctx.start()
    left = ctx.n
    while left:
        k = min(batch, left)
        outcomes = await publisher.publish_batch([body] * k, routing_key=q)
        failed += sum(1 for o in outcomes if o is not None)
        left -= k
    ctx.stop()
    if failed:
        ctx.note(f"{failed} failed")
    await _finish(ctx, conn, ch, publisher)


def s1(ctx): asyncio.run(_s1(ctx))
def s2a(ctx): asyncio.run(_s2a(ctx))
def s2b(ctx): asyncio.run(_pipelined(ctx))
def s3(ctx): asyncio.run(_pipelined(ctx))
def s6(ctx): asyncio.run(_s6(ctx))
