"""The outbox publisher's check that a row's exchange exists, against the scripted
broker: a check that gets no answer is made again on a new side channel, and the row is
sent once the exchange is known to exist; the publishing channel is never put at risk."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry import SQLiteOutbox
from rabbitry.protocol import spec
from rabbitry.protocol.frames import Method, method_frame

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(60)


class SilentOnce(FakeBroker):
    """Leaves the first exchange.declare unanswered; answers the later ones at once."""

    def _method(self, conn: Any, channel: int, method: Method) -> None:
        super()._method(conn, channel, method)
        if isinstance(method, spec.ExchangeDeclare):
            if len(self.sent(spec.ExchangeDeclare)) > 1:
                conn.writer.write(method_frame(channel, spec.ExchangeDeclareOk()))


async def test_an_unanswered_check_is_made_again_on_a_new_channel_then_the_row_is_sent(
    tmp_path: Path,
) -> None:
    with SilentOnce(auto_ack=True) as broker:
        conn = rabbitry.AsyncConnection(broker.url, recovery=None)
        await conn.connect()
        try:
            outbox = SQLiteOutbox(
                str(tmp_path / "o.db"), confirm_timeout=0.3, retry_delay=0.05, max_retry_delay=0.1
            )
            async with await conn.publisher(outbox=outbox) as publisher:
                await publisher.publish(b"row", exchange="orders", routing_key="k")
                await publisher.flush(timeout=30)
                assert publisher.stats().dead == 0
        finally:
            await conn.close()
    (first, _), (second, method) = broker.sent(spec.ExchangeDeclare)
    assert first != second  # the unanswered channel was given up
    assert isinstance(method, spec.ExchangeDeclare) and method.passive
    assert method.exchange == "orders"
    (sent,) = broker.published
    assert (sent.exchange, sent.body) == ("orders", b"row")
    assert sent.channel not in (first, second)  # the publishing channel is another one
    # Sent only after the check that was answered.
    kinds = [type(m) for _, m in broker.methods]
    last_declare = len(kinds) - 1 - kinds[::-1].index(spec.ExchangeDeclare)
    assert kinds.index(spec.BasicPublish) > last_declare
