"""A large message is framed and written without extra copies of its body.

Each case runs in a fresh interpreter so that its peak resident set (``ru_maxrss``) is
its own: the body is allocated first, the peak is read, the message is published with
confirms and the peak read again. The growth must stay within twice the body (the
transport's buffer holds one copy of what the socket has not taken yet; framing adds
none). The body is 100 MB, or just under the broker's limit where that is lower
(RabbitMQ 3.x refuses messages above 128 MiB by default, 4.x above 16 MiB).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest

pytestmark = pytest.mark.timeout(300)

BODY = 100 * 1000 * 1000

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, resource, sys
    import rabbitry

    url, queue, api, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    with rabbitry.Connection(url) as probe:
        limit = probe.max_message_size
    if limit:
        size = min(size, limit - 64 * 1024)
    body = os.urandom(size)
    if api == "sync":
        with rabbitry.Connection(url) as conn:
            conn.channel().queue_declare(queue)
            publisher = conn.publisher()
            before = peak()
            publisher.publish(body, routing_key=queue).result(120)
            after = peak()
            conn.channel().queue_delete(queue)
    else:
        async def main():
            async with rabbitry.AsyncConnection(url) as conn:
                channel = await conn.channel()
                await channel.queue_declare(queue)
                publisher = await conn.publisher()
                before = peak()
                await (await publisher.send(body, routing_key=queue))
                after = peak()
                await channel.queue_delete(queue)
                return before, after

        before, after = asyncio.run(main())
    print(after - before, size)
    """
)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_publishing_a_large_body_grows_rss_by_at_most_twice_the_body(url: str, api: str) -> None:
    queue = f"rabbitry-large-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, queue, api, str(BODY)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    growth, size = (int(part) for part in done.stdout.strip().splitlines()[-1].split())
    assert growth <= 2 * size, f"peak RSS grew by {growth / size:.2f} x the {size}-byte body"
