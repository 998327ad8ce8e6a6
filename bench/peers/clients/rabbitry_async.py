"""rabbitry, asyncio API (AsyncConnection / AsyncChannel), idiomatic use.

basic_publish is a coroutine; in confirm mode it returns an asyncio future settled
by the broker's ack (Nacked on nack). Pipelined confirms keep up to ctx.window
futures in a FIFO and await the oldest when the window is full. Consumers are
plain (non-async) callbacks running on the event loop.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

import rabbitry

from common import POLL_SLEEP, URL, Ctx


async def _connect(ctx: Ctx, confirms: bool):
    conn = rabbitry.AsyncConnection(URL)
    await conn.connect()
    ch = await conn.channel()
    if confirms:
        await ch.confirm_select()
    await ch.queue_declare(ctx.queue, durable=ctx.durable)
    return conn, ch


async def _finish(ctx: Ctx, conn, ch) -> None:
    await ch.queue_delete(ctx.queue)
    await conn.close()


async def _s1(ctx: Ctx) -> None:
    conn, ch = await _connect(ctx, confirms=False)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    ctx.start()
    for _ in range(ctx.n):
        await publish("", q, body)
    while (await ch.queue_declare(q, durable=ctx.durable, passive=True)).message_count < ctx.n:
        await asyncio.sleep(POLL_SLEEP)
    ctx.stop()
    await _finish(ctx, conn, ch)


async def _s2a(ctx: Ctx) -> None:
    conn, ch = await _connect(ctx, confirms=True)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    ctx.start()
    for _ in range(ctx.n):
        await (await publish("", q, body))  # raises Nacked on nack
    ctx.stop()
    await _finish(ctx, conn, ch)


async def _pipelined(ctx: Ctx) -> None:
    """Sliding window of confirm futures: at most ctx.window outstanding; when
    full, await the oldest, then drop every already-settled one at the front."""
    conn, ch = await _connect(ctx, confirms=True)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    props = rabbitry.Properties(delivery_mode=2) if ctx.persistent else None
    window = ctx.window
    pending: deque = deque()
    popleft, append = pending.popleft, pending.append
    nacks = 0
    ctx.note(f"confirm futures in a FIFO, window {window}, await the oldest when full")
    ctx.start()
    for _ in range(ctx.n):
        if len(pending) >= window:
            try:
                await popleft()
            except rabbitry.Nacked:
                nacks += 1
            while pending and pending[0].done():
                if popleft().exception() is not None:
                    nacks += 1
        append(await publish("", q, body, properties=props))
    while pending:
        try:
            await popleft()
        except rabbitry.Nacked:
            nacks += 1
    ctx.stop()
    if nacks:
        ctx.note(f"{nacks} nacks")
    await _finish(ctx, conn, ch)


async def _consume(ctx: Ctx, multi: bool) -> None:
    conn, ch = await _connect(ctx, confirms=False)
    await ch.basic_qos(ctx.prefetch)
    n, every = ctx.n, ctx.multi_every
    done = asyncio.get_running_loop().create_future()
    count = 0
    ack = ch.basic_ack

    def on_message(message: rabbitry.Message) -> None:
        nonlocal count
        count += 1
        c = count
        if multi:
            if c % every == 0 or c == n:
                ack(message.delivery_tag, multiple=True)
        else:
            message.ack()
        if c == n and not done.done():
            done.set_result(None)

    ctx.note("plain (non-async) consumer callback")
    ctx.start()
    tag = await ch.basic_consume(ctx.queue, on_message)
    await done
    await ch.basic_cancel(tag)
    await ch.queue_declare(ctx.queue, durable=ctx.durable, passive=True)  # barrier
    ctx.stop()
    await _finish(ctx, conn, ch)


async def _s5(ctx: Ctx) -> None:
    conn, ch = await _connect(ctx, confirms=False)
    loop = asyncio.get_running_loop()
    fut = None

    def on_message(message: rabbitry.Message) -> None:
        fut.set_result(None)

    tag = await ch.basic_consume(ctx.queue, on_message, no_ack=True)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    lat, clock = ctx.lat_ns, time.perf_counter_ns
    ctx.start()
    for _ in range(ctx.n):
        t0 = clock()
        fut = loop.create_future()
        await publish("", q, body)
        await fut
        lat.append(clock() - t0)
    ctx.stop()
    await ch.basic_cancel(tag)
    await _finish(ctx, conn, ch)


def s1(ctx): asyncio.run(_s1(ctx))
def s2a(ctx): asyncio.run(_s2a(ctx))
def s2b(ctx): asyncio.run(_pipelined(ctx))
def s3(ctx): asyncio.run(_pipelined(ctx))
def s4(ctx): asyncio.run(_consume(ctx, False))
def s4m(ctx): asyncio.run(_consume(ctx, True))
def s5(ctx): asyncio.run(_s5(ctx))


async def _batches(ctx: Ctx) -> None:
    """Batches of ctx.window with the channel API: publish them, then wait for all."""
    conn, ch = await _connect(ctx, confirms=True)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    failed = 0
    ctx.note(f"batches of {ctx.window}: basic_publish futures, then asyncio.wait")
    ctx.start()
    left = ctx.n
    while left:
        k = min(ctx.window, left)
        futures = [await publish("", q, body) for _ in range(k)]
        await asyncio.wait(futures)
        failed += sum(1 for f in futures if f.exception() is not None)
        left -= k
    ctx.stop()
    if failed:
        ctx.note(f"{failed} nacks")
    await _finish(ctx, conn, ch)


def s6(ctx): asyncio.run(_batches(ctx))
