"""rabbitry, thread-safe sync API (Connection / Channel), idiomatic use.

One IO thread per connection runs the asyncio engine; basic_publish encodes in
the calling thread and hands the frames over without waiting. In confirm mode it
returns a concurrent.futures.Future. Consumer callbacks run on the connection's
dispatcher thread; the main thread waits on a threading.Event. S5 uses the
``channel.consume()`` iterator. CPU is getrusage of the whole process, so the IO
and dispatcher threads are included.
"""
from __future__ import annotations

import threading
import time
from collections import deque

import rabbitry

from common import POLL_SLEEP, URL, Ctx


def _connect(ctx: Ctx, confirms: bool):
    conn = rabbitry.Connection(URL)
    conn.connect()
    ch = conn.channel()
    if confirms:
        ch.confirm_select()
    ch.queue_declare(ctx.queue, durable=ctx.durable)
    return conn, ch


def _finish(ctx: Ctx, conn, ch) -> None:
    ch.queue_delete(ctx.queue)
    conn.close()


def s1(ctx: Ctx) -> None:
    conn, ch = _connect(ctx, confirms=False)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    ctx.start()
    for _ in range(ctx.n):
        publish("", q, body)
    while ch.queue_declare(q, durable=ctx.durable, passive=True).message_count < ctx.n:
        time.sleep(POLL_SLEEP)
    ctx.stop()
    _finish(ctx, conn, ch)


def s2a(ctx: Ctx) -> None:
    conn, ch = _connect(ctx, confirms=True)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    ctx.start()
    for _ in range(ctx.n):
        publish("", q, body).result()  # raises Nacked on nack
    ctx.stop()
    _finish(ctx, conn, ch)


def _pipelined(ctx: Ctx) -> None:
    """Sliding window of confirm futures: at most ctx.window outstanding; when
    full, wait for the oldest, then drop every already-settled one at the front."""
    conn, ch = _connect(ctx, confirms=True)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    props = rabbitry.Properties(delivery_mode=2) if ctx.persistent else None
    window = ctx.window
    pending: deque = deque()
    popleft, append = pending.popleft, pending.append
    nacks = 0
    ctx.note(f"confirm futures in a FIFO, window {window}, wait for the oldest when full")
    ctx.start()
    for _ in range(ctx.n):
        if len(pending) >= window:
            if popleft().exception() is not None:  # blocks until settled
                nacks += 1
            while pending and pending[0].done():
                if popleft().exception() is not None:
                    nacks += 1
        append(publish("", q, body, properties=props))
    while pending:
        if popleft().exception() is not None:
            nacks += 1
    ctx.stop()
    if nacks:
        ctx.note(f"{nacks} nacks")
    _finish(ctx, conn, ch)


s2b = _pipelined
s3 = _pipelined


def _consume(ctx: Ctx, multi: bool) -> None:
    conn, ch = _connect(ctx, confirms=False)
    ch.basic_qos(ctx.prefetch)
    n, every = ctx.n, ctx.multi_every
    done = threading.Event()
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
        if c == n:
            done.set()

    ctx.note("basic_consume callback on the dispatcher thread, threading.Event for the last")
    ctx.start()
    tag = ch.basic_consume(ctx.queue, on_message)
    done.wait()
    ch.basic_cancel(tag)
    ch.queue_declare(ctx.queue, durable=ctx.durable, passive=True)  # barrier
    ctx.stop()
    _finish(ctx, conn, ch)


def s4(ctx: Ctx) -> None:
    _consume(ctx, multi=False)


def s4m(ctx: Ctx) -> None:
    _consume(ctx, multi=True)


def s5(ctx: Ctx) -> None:
    conn, ch = _connect(ctx, confirms=False)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    it = ch.consume(q, no_ack=True)
    # the iterator starts its consumer on the first next(): do one untimed round
    # trip so the consumer is registered before timing (as the other clients do)
    publish("", q, body)
    next(it)
    ctx.note("channel.consume() iterator; one untimed warm-up round trip starts the consumer")
    lat, clock = ctx.lat_ns, time.perf_counter_ns
    ctx.start()
    for _ in range(ctx.n):
        t0 = clock()
        publish("", q, body)
        next(it)
        lat.append(clock() - t0)
    ctx.stop()
    it.close()  # cancels the consumer
    _finish(ctx, conn, ch)


def s6(ctx: Ctx) -> None:
    """Batches of ctx.window with the channel API: publish them, then wait for all."""
    import concurrent.futures

    conn, ch = _connect(ctx, confirms=True)
    q, body, publish = ctx.queue, ctx.body, ch.basic_publish
    failed = 0
    ctx.note(f"batches of {ctx.window}: basic_publish futures, then futures.wait")
    ctx.start()
    left = ctx.n
    while left:
        k = min(ctx.window, left)
        futures = [publish("", q, body) for _ in range(k)]
        concurrent.futures.wait(futures)
        failed += sum(1 for f in futures if f.exception() is not None)
        left -= k
    ctx.stop()
    if failed:
        ctx.note(f"{failed} nacks")
    _finish(ctx, conn, ch)
