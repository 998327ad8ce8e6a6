"""rabbitry, thread-safe high-level API (Publisher), idiomatic use.

``conn.publisher(...)`` gives a publisher on its own channel. ``publisher.publish(...)``
encodes in the calling thread, hands the frames to the IO thread without waiting, and
blocks only while ``max_in_flight`` messages are unconfirmed (a semaphore released on
the IO thread). It returns a ``concurrent.futures.Future`` per message; the script
checks the settled ones in bulk. S1 uses ``confirm=False``; S6 sends batches of
``ctx.window`` with ``publish_batch``. CPU is getrusage of the whole process (IO thread
included).
"""
from __future__ import annotations

import time
from collections import deque

import rabbitry

from common import POLL_SLEEP, URL, Ctx


def _connect(ctx: Ctx, confirm: bool):
    conn = rabbitry.Connection(URL)
    conn.connect()
    ch = conn.channel()
    ch.queue_declare(ctx.queue, durable=ctx.durable)
    publisher = conn.publisher(confirm=confirm, max_in_flight=ctx.window)
    return conn, ch, publisher


def _finish(ctx: Ctx, conn, ch, publisher) -> None:
    publisher.close()
    ch.queue_delete(ctx.queue)
    conn.close()


def _count_failures(pending: deque) -> int:
    failed = 0
    while pending and pending[0].done():
        if pending.popleft().exception() is not None:
            failed += 1
    return failed


def s1(ctx: Ctx) -> None:
    conn, ch, publisher = _connect(ctx, confirm=False)
    q, body, publish = ctx.queue, ctx.body, publisher.publish
    ctx.note("Publisher(confirm=False): fire-and-forget")
    ctx.start()
    for _ in range(ctx.n):
        publish(body, routing_key=q)
    while ch.queue_declare(q, durable=ctx.durable, passive=True).message_count < ctx.n:
        time.sleep(POLL_SLEEP)
    ctx.stop()
    _finish(ctx, conn, ch, publisher)


def s2a(ctx: Ctx) -> None:
    conn, ch, publisher = _connect(ctx, confirm=True)
    q, body, publish = ctx.queue, ctx.body, publisher.publish
    ctx.start()
    for _ in range(ctx.n):
        publish(body, routing_key=q).result()  # raises Nacked on nack
    ctx.stop()
    _finish(ctx, conn, ch, publisher)


def _pipelined(ctx: Ctx) -> None:
    conn, ch, publisher = _connect(ctx, confirm=True)
    q, body, publish = ctx.queue, ctx.body, publisher.publish
    persistent = True if ctx.persistent else None
    window = ctx.window
    pending: deque = deque()
    append = pending.append
    failed = 0
    ctx.note(f"Publisher max_in_flight={window}; futures checked in bulk")
    ctx.start()
    for i in range(ctx.n):
        append(publish(body, routing_key=q, persistent=persistent))
        if i % window == 0:
            failed += _count_failures(pending)
    publisher.wait_for_confirms()
    failed += _count_failures(pending)
    ctx.stop()
    if failed or pending:
        ctx.note(f"{failed} failed, {len(pending)} unsettled")
    _finish(ctx, conn, ch, publisher)


s2b = _pipelined
s3 = _pipelined


def s6(ctx: Ctx) -> None:
    conn, ch, publisher = _connect(ctx, confirm=True)
    q, body, batch = ctx.queue, ctx.body, ctx.window
    failed = 0
    ctx.note(f"publish_batch of {batch}, outcomes per batch")
    ctx.start()
    left = ctx.n
    while left:
        k = min(batch, left)
        outcomes = publisher.publish_batch([body] * k, routing_key=q)
        failed += sum(1 for o in outcomes if o is not None)
        left -= k
    ctx.stop()
    if failed:
        ctx.note(f"{failed} failed")
    _finish(ctx, conn, ch, publisher)
