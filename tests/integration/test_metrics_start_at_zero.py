"""A consumed queue's redelivery and handler-time series read 0 from the consumer's start
(Prometheus text output), so a dashboard's first redelivery is an increase of 1."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

import rabbitry
from rabbitry import observability
from rabbitry.topology import Queue, Topology

if TYPE_CHECKING:
    from tests.integration.conftest import Names

    from rabbitry.message import Message

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _value(text: str, sample_name: str, queue: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == sample_name
                and sample.labels.get("messaging_destination_name") == queue
            ):
                return sample.value
    return None


async def test_a_consumers_redeliveries_and_handler_time_start_at_zero(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await Topology(queues=[Queue(queue)]).aapply(conn)
    server = observability.serve_prometheus(port=0)
    loop = asyncio.get_running_loop()

    async def handler(message: Message) -> None:
        pass

    try:
        async with conn.consumer(queue, handler):
            text = await loop.run_in_executor(None, server.reader.render)
    finally:
        server.close()
        observability.uninstrument()
    assert _value(text, "rabbitry_consumer_redelivered_total", queue) == 0
    assert _value(text, "rabbitry_consumer_process_duration_seconds_count", queue) == 0
