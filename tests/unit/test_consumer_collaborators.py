"""The consumer's collaborators on their own: Settler, FailurePath, Flow and TaskRunner,
Handling."""

from __future__ import annotations

import asyncio
from typing import Any

from rabbitry._consumer.batches import Handling
from rabbitry._consumer.flow import INBOX_BYTES, Flow, TaskRunner
from rabbitry._consumer.settle import UNKNOWN, FailurePath, Settler
from rabbitry._consumer.stores import ConsumerStats, MemoryDedupStore
from rabbitry.exceptions import Requeue
from rabbitry.protocol.message import Message, Properties


class FakeChannel:
    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch
        self.is_closed = False
        self.sent: list[tuple[Any, ...]] = []

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.sent.append(("ack", delivery_tag, multiple))

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self.sent.append(("nack", delivery_tag, requeue))

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self.sent.append(("reject", delivery_tag, requeue))


class Owner:
    queue = "q"
    retry = None
    dedup: MemoryDedupStore | None = None
    concurrency = 1

    def __init__(self) -> None:
        self.stats = ConsumerStats()


class ReadFlow:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


class Connection:
    def __init__(self) -> None:
        self.read_flow = ReadFlow()


def delivery(
    tag: int, channel: FakeChannel, *, body: bytes = b"x", message_id: str | None = None
) -> Message:
    message = Message(body, Properties(message_id=message_id), delivery_tag=tag)
    message.settle_through(channel)
    return message


def settler(owner: Owner, *, manual: bool = True) -> Settler:
    return Settler(owner, manual=manual, stats=owner.stats)


def test_settler_acks_once_and_counts() -> None:
    owner, channel = Owner(), FakeChannel()
    s = settler(owner)
    message = delivery(1, channel)
    s.ack(message)
    s.ack(message)
    assert channel.sent == [("ack", 1, False)]
    assert owner.stats.acked == 1


def test_settler_drops_a_settlement_from_before_a_recovery() -> None:
    owner, channel = Owner(), FakeChannel(epoch=2)
    message = delivery(1, channel)  # epoch 0: an older connection's delivery
    assert not settler(owner).settle(message, "nack", requeue=True)
    assert channel.sent == [] and message.settled


def test_settler_leaves_a_message_of_a_closed_channel_to_the_broker() -> None:
    owner, channel = Owner(), FakeChannel()
    channel.is_closed = True
    message = delivery(1, channel)
    assert not settler(owner).settle(message, "ack")
    assert channel.sent == [] and not message.settled


def test_settler_with_auto_acks_sends_nothing() -> None:
    owner, channel = Owner(), FakeChannel()
    settler(owner, manual=False).ack(delivery(1, channel))
    assert channel.sent == [] and owner.stats.acked == 0


async def test_failure_path_requeues_on_requeue() -> None:
    owner, channel = Owner(), FakeChannel()
    s = FailurePath(owner, settler(owner))
    await s.fail(delivery(3, channel), Requeue("later"))
    assert channel.sent == [("nack", 3, True)]
    assert owner.stats.requeued == 1 and owner.stats.failed == 1
    s.failures.flush()


async def test_failure_path_without_a_policy_rejects_into_the_dead_letter_path() -> None:
    owner, channel = Owner(), FakeChannel()
    s = FailurePath(owner, settler(owner))
    assert s.dead_letter is UNKNOWN
    s.dead_letter = None  # the queue has no dead-letter exchange
    await s.fail(delivery(4, channel), ValueError("boom"))
    assert channel.sent == [("nack", 4, False)]
    assert owner.stats.dropped == 1 and owner.stats.dropped_records == 1
    s.failures.flush()


def test_flow_pauses_reads_past_its_bound_and_resumes_at_half() -> None:
    connection = Connection()
    flow = Flow(connection, Owner(), bounded=True, prefetch=4)  # type: ignore[arg-type]
    channel = FakeChannel()
    messages = [delivery(tag, channel) for tag in range(1, 5)]
    for message in messages:  # what ConsumerCore._on_delivery counts
        flow.waiting += 1
        flow.waiting_bytes += len(message.body)
    flow.reads_paused = True
    flow.handed_out(messages[0])
    assert connection.read_flow.calls == []  # 3 wait: above half of 4
    flow.handed_out(messages[1])
    assert connection.read_flow.calls == ["resume"] and not flow.reads_paused
    flow.forget_waiting()
    assert flow.waiting == 0 and flow.waiting_bytes == 0
    assert connection.read_flow.calls == ["resume"]  # it did not pause again
    assert flow.limit == 4 and INBOX_BYTES > 0


async def test_task_runner_handles_the_inbox_in_order_and_acks() -> None:
    owner, channel = Owner(), FakeChannel()
    owner.dedup = MemoryDedupStore()
    seen: list[int] = []

    async def handler(message: Message) -> None:
        seen.append(message.delivery_tag)

    s = settler(owner)
    handling = Handling(owner, handler, s, FailurePath(owner, s), release_on_cancel=True)
    flow = Flow(Connection(), owner, bounded=False, prefetch=10)  # type: ignore[arg-type]
    flow.runner = runner = TaskRunner(owner, flow, handling)
    flow.idle = asyncio.Event()
    flow.inbox.extend(
        [
            delivery(1, channel, message_id="a"),
            delivery(2, channel, message_id="a"),  # a duplicate: acked unseen
            delivery(3, channel),
        ]
    )
    runner.pump()
    assert flow.running == 1  # concurrency 1: one task drains the inbox
    await asyncio.wait_for(flow.idle.wait(), 1.0)
    assert seen == [1, 3]
    assert [sent[1] for sent in channel.sent] == [1, 2, 3]
    assert owner.stats.acked == 3 and owner.stats.deduplicated == 1
