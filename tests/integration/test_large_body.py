"""A large message is framed and written without extra copies of its body.

Each case runs in a fresh interpreter so that its peak resident set (``ru_maxrss``) is
its own: the body is allocated first, the peak is read, the message is published with
confirms and the peak read again. The growth must stay within twice the body (the
transport's buffer holds one copy of what the socket has not taken yet; framing adds
none). The body is 100 MB: RabbitMQ 3.10 refuses messages above 128 MiB by default.
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
                await (await publisher.publish(body, routing_key=queue))
                after = peak()
                await channel.queue_delete(queue)
                return before, after

        before, after = asyncio.run(main())
    print(after - before)
    """
)


@pytest.mark.parametrize("api", ["sync", "async"])
def test_publishing_a_100_mb_body_grows_rss_by_at_most_twice_the_body(url: str, api: str) -> None:
    queue = f"rabbitry-large-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, queue, api, str(BODY)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    growth = int(done.stdout.strip().splitlines()[-1])
    assert growth <= 2 * BODY, f"peak RSS grew by {growth / BODY:.2f} x the body"
