"""The port of a publisher: what the library's own collaborators of it drive.

Its users are the thread-safe twin (:class:`rabbitry.sync.publisher.Publisher`), the
durable outbox (:class:`rabbitry.outbox_publisher.AsyncOutboxPublisher`) and the
batching publisher, which encode and send through the publisher and share its window,
and the OpenTelemetry hooks (``rabbitry.observability._otel``); applications use the
publisher's own methods. Get it with :func:`rabbitry.publisher.port_of`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from ..publishing.encoding import MessageEncoder
    from .core import PublisherCore

__all__ = ["PublisherPort"]


class PublisherPort:
    """The encoder's and the send machinery's public methods, gathered for the twins.

    Its members are plain attributes (public methods of the publisher's
    :class:`~rabbitry.publishing.encoding.MessageEncoder` and
    :class:`~rabbitry._publisher.core.PublisherCore`, and a flag), so using one costs
    the same calls as calling the collaborator would. ``closing`` is set together with
    the publisher's own flag: the publisher is closing or closed, and nothing may be
    handed over any more.
    """

    __slots__ = (
        "acquire",
        "add_block_hook",
        "add_close_hook",
        "closed_state",
        "closing",
        "connection",
        "encode",
        "encode_batch",
        "frames",
        "kick",
        "ledger",
        "loop",
        "new_message_id",
        "release_slot",
        "reserve_more",
        "reserve_now",
        "send",
        "send_batch",
        "send_reserved",
        "shutdown",
    )

    def __init__(
        self,
        core: PublisherCore,
        encoder: MessageEncoder,
        shutdown: Callable[[float | None], Coroutine[Any, Any, None]],
    ) -> None:
        #: ``encode(body, exchange, routing_key, properties, mandatory, persistent,
        #: expiration)``: the frames and message_id of one message; any thread.
        self.encode = encoder.encode
        #: ``encode_batch(messages, exchange, routing_key, properties, mandatory,
        #: persistent, expiration)``: a list of (frames, message_id, mandatory).
        self.encode_batch = encoder.encode_batch
        #: ``new_message_id()``: a message_id as the publisher generates them.
        self.new_message_id = encoder.new_message_id
        #: ``frames(exchange, routing_key, mandatory, properties, body)``: the frames
        #: of one message with encoded properties, for the current channel.
        self.frames = encoder.frames
        #: ``await shutdown(timeout)``: close the publisher without the report of the
        #: failures nobody looked at (the caller reports them itself); on the loop.
        self.shutdown = shutdown
        #: The publisher's connection, and the event loop the publisher runs on.
        self.connection = core.connection
        self.loop = core.loop
        self.send = core.send
        self.send_batch = core.send_batch
        self.send_reserved = core.send_reserved
        self.acquire = core.acquire
        self.reserve_now = core.reserve_now
        self.reserve_more = core.slots.reserve_more
        self.release_slot = core.slots.release
        self.closed_state = core.closed_state
        #: ``kick()``: write what ``send_reserved`` queued (the connection's write path).
        self.kick = core.writes.kick
        self.add_block_hook = core.add_block_hook
        self.add_close_hook = core.add_close_hook
        #: The failed futures nobody looked at (reported when the publisher ends).
        self.ledger = core.ledger
        self.closing = core.closing
