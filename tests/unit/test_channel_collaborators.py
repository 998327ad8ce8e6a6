"""AsyncChannel's collaborators on their own: the requests and the confirm book.

No connection and no broker: each collaborator gets stand-ins for what it is given.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rabbitry.aio._confirm_book import ConfirmBook
from rabbitry.aio._link import ChannelLink
from rabbitry.aio._requests import Requests
from rabbitry.exceptions import ConnectionLost, Nacked, PublishOutcomeUnknown, Timeout
from rabbitry.protocol import spec
from rabbitry.protocol.channel import ChannelState
from rabbitry.protocol.message import Message

pytestmark = pytest.mark.timeout(10)


class _Protocol:
    """Records what is sent; open unless told otherwise."""

    channel_id = 3

    def __init__(self) -> None:
        self.state = ChannelState.OPEN
        self.methods: list[Any] = []
        self.publishes: list[tuple[list[bytes], object]] = []

    def send_method(self, method: Any) -> None:
        self.methods.append(method)

    def send_publish(self, frames: list[bytes], waiter: object) -> int:
        self.publishes.append((frames, waiter))
        return 100 + len(self.publishes)


class _ReadFlow:
    def __init__(self) -> None:
        self.rechecks = 0

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def recheck(self) -> None:
        self.rechecks += 1


class _Owner:
    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None: ...

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None: ...

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None: ...


async def _never(timeout: float | None, what: str) -> None:
    raise AssertionError(f"{what} waited for a recovery")


def _requests(protocol: _Protocol) -> tuple[Requests, ChannelLink, _ReadFlow, list[int]]:
    loop = asyncio.get_running_loop()
    link = ChannelLink(protocol, loop.create_future())  # type: ignore[arg-type]
    flow = _ReadFlow()
    kicks: list[int] = []
    requests = Requests(
        link,
        _Owner(),
        loop=loop,
        read_flow=flow,
        kick=lambda: kicks.append(1),
        await_recovery=_never,
    )
    return requests, link, flow, kicks


async def test_requests_are_answered_in_order_and_run_their_hooks() -> None:
    protocol = _Protocol()
    requests, _, flow, kicks = _requests(protocol)
    seen: list[Any] = []
    first = asyncio.ensure_future(requests.call(spec.QueuePurge(queue="a"), 1.0, seen.append))
    second = asyncio.ensure_future(requests.call(spec.QueuePurge(queue="b"), 1.0))
    await asyncio.sleep(0)
    assert [m.queue for m in protocol.methods] == ["a", "b"]
    assert flow.rechecks == 2 and kicks and requests
    requests.on_reply(spec.QueuePurgeOk(message_count=1), None)
    requests.on_reply(spec.QueuePurgeOk(message_count=2), None)
    assert (await first).message_count == 1
    assert (await second).message_count == 2
    assert seen == [spec.QueuePurgeOk(message_count=1)]
    assert not requests


async def test_a_fetched_message_is_stamped_with_the_link_s_tags() -> None:
    requests, link, _, _ = _requests(_Protocol())
    future = requests.register()
    message = Message(b"x", spec.BasicProperties(), delivery_tag=7)
    requests.on_reply(
        spec.BasicGetOk(delivery_tag=7, exchange="", routing_key="q", message_count=0), message
    )
    assert await future is message
    assert message.epoch == link.tags.epoch


async def test_requests_fail_together_each_with_its_own_exception() -> None:
    requests, _, _, _ = _requests(_Protocol())
    one, two = requests.register(), requests.register()
    requests.fail_all(ConnectionLost("gone"))
    errors = [f.exception() for f in (one, two)]
    assert all(isinstance(e, ConnectionLost) for e in errors)
    assert errors[0] is not errors[1]
    assert not requests


async def test_a_request_times_out_and_replay_refuses_a_closed_channel() -> None:
    protocol = _Protocol()
    requests, _, _, _ = _requests(protocol)
    with pytest.raises(Timeout, match=r"queue\.purge"):
        await requests.call(spec.QueuePurge(queue="a"), 0.01)
    protocol.state = ChannelState.CLOSED
    with pytest.raises(ConnectionLost):
        await requests.replay(spec.BasicCancel(consumer_tag="t"))


async def test_confirm_book_settles_acks_and_nacks_and_tells_when_empty() -> None:
    loop = asyncio.get_running_loop()
    book = ConfirmBook(3)
    acked: asyncio.Future[None] = loop.create_future()
    nacked: asyncio.Future[None] = loop.create_future()
    book.tracker.add(1, acked)
    book.tracker.add(2, nacked)
    book.keep_head(1, [b"m", b"h", b"b"])
    woken = asyncio.ensure_future(book.settled.wait())
    await asyncio.sleep(0)
    book.on_confirm(1, False, True)
    assert acked.done() and acked.result() is None and not woken.done()
    book.on_confirm(2, False, False)
    assert isinstance(nacked.exception(), Nacked)
    await asyncio.wait_for(woken, 1.0)


class _Record(asyncio.Future[None]):
    """A publish record that asks to be sent again after recovery."""

    resend_on_recovery = True
    frames = [b"method", b"header", b"body"]
    seq = 0


async def test_confirm_book_keeps_resendable_publishes_and_sends_them_again() -> None:
    loop = asyncio.get_running_loop()
    book = ConfirmBook(3)
    plain: asyncio.Future[None] = loop.create_future()
    kept = _Record(loop=loop)
    book.tracker.add(1, plain)
    book.tracker.add(2, kept)
    book.fail(ConnectionLost("dropped"), keep_resendable=True)
    assert isinstance(plain.exception(), PublishOutcomeUnknown)
    assert book.resend == [kept] and not kept.done() and not book.tracker
    protocol = _Protocol()
    assert book.republish(protocol) == 1  # type: ignore[arg-type]
    assert protocol.publishes == [(_Record.frames, kept)] and kept.seq == 101
    assert book.resend == []


async def test_confirm_book_fails_kept_publishes_when_the_channel_ends() -> None:
    loop = asyncio.get_running_loop()
    book = ConfirmBook(3)
    kept = _Record(loop=loop)
    book.resend.append(kept)
    book.fail(ConnectionLost("closed"))
    assert isinstance(kept.exception(), PublishOutcomeUnknown)
    assert book.resend == []
