"""rabbitry on uvloop's event loop (the optional ``uvloop`` extra): uvloop's transports
do not derive from asyncio's classes, which the engine must not rely on."""

from __future__ import annotations

import asyncio
import uuid

import uvloop

import rabbitry


def test_publish_confirm_consume_and_ack_on_uvloop(url: str) -> None:
    queue = f"rabbitry-test-uvloop-{uuid.uuid4().hex[:8]}"

    async def main() -> list[bytes]:
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        async with rabbitry.AsyncConnection(url, connection_timeout=5) as conn:
            ch = await conn.channel()
            await ch.confirm_select()
            await ch.queue_declare(queue)
            try:
                futures = [await ch.basic_publish("", queue, b"m%d" % i) for i in range(100)]
                await asyncio.gather(*[f for f in futures if f is not None])
                got: list[bytes] = []
                done = asyncio.get_running_loop().create_future()

                def on_message(message: rabbitry.Message) -> None:
                    got.append(message.body)
                    message.ack()
                    if len(got) == 100:
                        done.set_result(None)

                await ch.basic_consume(queue, on_message)
                await asyncio.wait_for(done, 10)
                await ch.queue_declare(queue, passive=True)
                return got
            finally:
                await ch.queue_delete(queue)

    assert uvloop.run(main()) == [b"m%d" % i for i in range(100)]
