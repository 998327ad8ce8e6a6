"""A producer process for the SIGKILL test of the durable outbox (run as a script).

    python outbox_producer.py URL OUTBOX QUEUE TOTAL PROGRESS

Publishes messages ``m-0`` .. ``m-<TOTAL-1>`` (the ``message_id``) through
``conn.publisher(outbox=SQLiteOutbox(OUTBOX))``, in random batches (single ``publish``
calls and ``publish_many`` of up to 200). After each call returns, the number of messages
handed over so far is written to PROGRESS: that is the "upstream" forgetting them, so a
restarted producer continues from there and never publishes a handed-over message again.
A kill between the return and the write makes the next run publish a few again
(duplicates, which the test counts). Prints ``ready N`` once the publisher is open
(N: where it continues) and ``done`` after every message is confirmed.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

from rabbitry import AsyncConnection, OutgoingMessage, SQLiteOutbox
from rabbitry.protocol.spec import BasicProperties


def read_progress(path: str) -> int:
    try:
        with open(path, "rb") as file:
            text = file.read().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text else 0


async def main(url: str, outbox: str, queue: str, total: int, progress: str) -> None:
    conn = AsyncConnection(url, connection_name=f"outbox-producer-{os.getpid()}")
    await conn.connect(timeout=10)
    publisher = await conn.publisher(outbox=SQLiteOutbox(outbox), timeout=30)
    index = read_progress(progress)
    print(f"ready {index}", flush=True)
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT, 0o644)
    rng = random.Random()
    while index < total:
        count = min(rng.choice((1, 1, 3, 20, 50, 200)), total - index)
        if count == 1:
            await publisher.publish(
                b"single",
                routing_key=queue,
                properties=BasicProperties(message_id=f"m-{index}"),
            )
        else:
            await publisher.publish_many(
                [
                    OutgoingMessage(b"batch", properties=BasicProperties(message_id=f"m-{n}"))
                    for n in range(index, index + count)
                ],
                routing_key=queue,
            )
        index += count
        # Fixed width, one write: a kill never leaves half a number behind.
        os.pwrite(fd, f"{index:>12}".encode(), 0)
    await publisher.flush(timeout=60)
    print(f"done {publisher.stats()}", flush=True)
    await publisher.close()
    await conn.close()


if __name__ == "__main__":
    url, outbox, queue, total, progress = sys.argv[1:6]
    asyncio.run(main(url, outbox, queue, int(total), progress))
