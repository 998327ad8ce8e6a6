"""Publisher: the thread-safe twin of :class:`rabbitry.AsyncPublisher`.

Same methods and parameters as the async twin (a test checks it). Publishing does not
wait for the IO thread: the message is encoded (and validated) in the calling thread by
the async publisher's encoder and handed over with ``portal.submit``, so a burst of
publishes from a thread costs one wake-up of the IO thread, not one round trip each.
The window is a counting semaphore (``sync._window.Window``) of ``max_in_flight``
slots taken here and given back on the IO thread when a confirm settles the message;
the broker's connection.blocked state is mirrored in a :class:`threading.Event`.

Threads: any thread may publish. Futures are ``concurrent.futures.Future`` objects,
settled on the IO thread; callbacks added with ``add_done_callback`` run on the
connection's callback thread, in order, never on the IO thread.

A future that fails and that nobody looks at (``result()``, ``exception()`` or a
done-callback) is reported when the publisher ends: ``close()`` and the ``with`` exit
raise :class:`UnobservedPublishFailures` (see :mod:`rabbitry.publishing.unobserved`).
"""

from __future__ import annotations

import concurrent.futures
import copy
import threading
import time
from typing import TYPE_CHECKING, Any

from ..exceptions import AMQPError, InvalidStateError, PublishTimeout
from ..observability import _state as _obs
from ..protocol.spec import BasicProperties
from ..publisher import as_properties, port_of
from ..publishing.records import Batch
from ._connection import portal_of
from ._portal import ConfirmFuture
from ._window import Releaser, Window
from .channel import caller_timeout

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from datetime import timedelta

    from ..protocol import spec
    from ..publisher import AsyncPublisher, Body, OutgoingMessage, UnconfirmedMessage
    from ..publishing.unobserved import UnobservedLedger
    from ._connection import Connection

__all__ = ["Publisher"]


class Publisher:
    """Publishes with confirms from any thread. Get one with ``connection.publisher()``.

    Usable as ``with`` (closes on exit after waiting for outstanding confirms). See
    :class:`rabbitry.AsyncPublisher` for the options and the guarantees.
    """

    def __init__(self, connection: Connection, publisher: AsyncPublisher) -> None:
        self._connection = connection
        self._async = publisher
        self._port = port = port_of(publisher)
        # Fixed for the publisher's life: read once here, not on every publish.
        self._mandatory = publisher.mandatory
        self._timeout = publisher.timeout
        self._confirm = publisher.confirm
        self._portal = portal_of(connection)
        port.ledger.what = "Publisher"
        self._slots = Window(publisher.max_in_flight)
        self._release = Releaser(self._portal.loop, self._slots)
        self._unblocked = threading.Event()
        if not publisher.is_blocked:
            self._unblocked.set()
        self._portal.submit(port.add_block_hook, self._on_block_change)
        self._portal.submit(port.add_close_hook, self._on_closed)

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncPublisher", "Publisher", 1)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        self._shutdown(None)
        # A block that raised keeps its exception; the failures are logged then.
        self._port.ledger.report(raise_error=exc_type is None)

    # ------------------------------------------------------------------ state

    @property
    def confirm(self) -> bool:
        """Publisher confirms are on."""
        return self._async.confirm

    @property
    def max_in_flight(self) -> int:
        """The window: unconfirmed messages allowed before ``publish`` blocks."""
        return self._async.max_in_flight

    @property
    def mandatory(self) -> bool:
        """The default of ``publish(mandatory=...)``."""
        return self._async.mandatory

    @property
    def timeout(self) -> float | None:
        """The default per-publish deadline in seconds."""
        return self._async.timeout

    @property
    def republish_unconfirmed(self) -> bool:
        """Recovery re-sends unconfirmed messages."""
        return self._async.republish_unconfirmed

    @property
    def nack_resends(self) -> int:
        """How many nacked messages were sent again (``nack_retry``)."""
        return self._async.nack_resends

    @property
    def in_flight(self) -> int:
        """Messages handed to the IO thread and not settled yet (a snapshot)."""
        return self._async.in_flight

    @property
    def is_blocked(self) -> bool:
        """The broker blocked the connection (resource alarm); publishes block."""
        return not self._unblocked.is_set()

    @property
    def blocked_reason(self) -> str | None:
        """The broker's reason for the current block, or ``None``."""
        return self._async.blocked_reason

    @property
    def is_closed(self) -> bool:
        """``close()`` was called."""
        return self._async.is_closed

    @property
    def channel_id(self) -> int | None:
        """The number of the channel in use (it changes when a channel is replaced)."""
        return self._async.channel_id

    # ------------------------------------------------------------------ publishing

    def send(
        self,
        body: Body,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[None]:
        """Publish one message; returns its future: the same as :meth:`publish`.

        The name the asyncio twin gives to the pipelined publish
        (:meth:`AsyncPublisher.send`), so that code reads the same in both APIs.

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties, or a mapping of their fields.
            mandatory: ask the broker to return the message when no queue gets it
                (``None``: the publisher's default).
            persistent: ``True`` sets delivery mode 2 (persistent), ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.
            timeout: the deadline in seconds (``None``: the publisher's default).

        Returns:
            The future, as :meth:`publish` returns it.

        Raises:
            LocalProtocolError: an invalid argument; nothing was sent.
            PublishTimeout: the deadline passed before the message could be sent.
            InvalidStateError: the publisher is closed.
        """
        return self.publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            mandatory=mandatory,
            persistent=persistent,
            expiration=expiration,
            timeout=timeout,
        )

    def publish(
        self,
        body: Body,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> concurrent.futures.Future[None]:
        """Publish one message from any thread; returns a future for its outcome.

        Blocks (before sending) while the connection is blocked by the broker and while
        ``max_in_flight`` messages are unconfirmed, up to the deadline. Arguments,
        outcomes and the deadline are those of :meth:`AsyncPublisher.publish`.

        Args:
            body: the payload; ``str`` is sent as UTF-8.
            exchange: the exchange ("" is the default exchange).
            routing_key: the routing key (the queue name on the default exchange).
            properties: the basic properties, or a mapping of their fields
                (``message_id`` is generated when absent).
            mandatory: ask the broker to return the message when no queue gets it
                (``None``: the publisher's default).
            persistent: ``True`` sets delivery mode 2 (persistent), ``False`` mode 1.
            expiration: per-message TTL, int milliseconds or a ``timedelta``.
            timeout: the deadline in seconds (``None``: the publisher's default) for
                waiting while blocked, for room in the window and for the confirm.

        Returns:
            A ``concurrent.futures.Future``: ``None`` on ack; fails with
            :class:`Nacked`, :class:`Unroutable`, :class:`PublishTimeout`,
            :class:`PublishRefused` or :class:`PublishOutcomeUnknown`. Call its
            ``result()`` to wait for this message's outcome; a failure nobody looked
            at makes ``close()`` (and the ``with`` exit) raise
            :class:`UnobservedPublishFailures`. With ``confirm=False`` the future is
            already done when returned: fire-and-forget reports nothing.

        Raises:
            LocalProtocolError: an invalid argument; nothing was sent.
            PublishTimeout: the deadline passed before the message could be sent.
            InvalidStateError: the publisher is closed.
        """
        engine = self._port
        if mandatory is None:
            mandatory = self._mandatory
        if properties is not None and type(properties) is not BasicProperties:
            properties = as_properties(properties)
        traced = _obs.active
        finish = None
        if traced is not None:  # rabbitry.observability: a span, its context in headers
            properties, finish = traced.publish(self._async, exchange, routing_key, properties)
        frames, message_id = engine.encode(
            body, exchange, routing_key, properties, mandatory, persistent, expiration
        )
        if engine.closing:
            raise engine.closed_state()
        if timeout is None:
            timeout = self._timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._unblocked.is_set():
            self._wait_unblocked(deadline, timeout)
        if not self._confirm:
            # Fire-and-forget: there is no outcome to wait for, so no future to settle
            # on the IO thread; the caller gets one that is already done.
            self._portal.submit(
                engine.send,
                frames,
                None,
                message_id,
                False,
                None,
                None,
                size=sum(map(len, frames)),
            )
            if finish is not None:
                finish(_SENT)
            return _SENT
        if not self._slots.acquire(True, _remaining(deadline)):
            if engine.closing:  # closed while this thread waited for room
                raise engine.closed_state()
            window = self.max_in_flight
            raise PublishTimeout(
                f"could not publish within {timeout} s: no room in the window of {window}"
            )
        if engine.closing:  # closed while this thread waited for room
            self._slots.release()
            raise engine.closed_state()
        future: concurrent.futures.Future[None] = ConfirmFuture()
        try:
            self._portal.submit(
                engine.send,
                frames,
                future,
                message_id,
                mandatory,
                deadline,
                self._release,
                size=sum(map(len, frames)),
            )
        except BaseException:
            self._slots.release()  # not handed over: give the slot back from here
            raise
        if finish is not None:
            finish(future)
        return future

    def publish_batch(
        self,
        messages: Iterable[OutgoingMessage | Body],
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        mandatory: bool | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        timeout: float | None = None,
    ) -> list[BaseException | None]:
        """Publish many messages in one write burst; block until all are settled.

        As :meth:`AsyncPublisher.publish_batch`.

        Args:
            messages: :class:`OutgoingMessage` objects, or bodies that use the arguments
                below; ``None`` fields of an ``OutgoingMessage`` use them too.
            exchange: as for :meth:`publish`, for the messages that do not set their own.
            routing_key: likewise.
            properties: likewise.
            mandatory: likewise (``None``: the publisher's default).
            persistent: likewise.
            expiration: likewise.
            timeout: one deadline for the whole batch, as for :meth:`publish`.

        Returns:
            One outcome per message, in order: ``None`` when acked (or sent, without
            confirms), else the exception its future would have failed with; the
            messages that could not be sent before the deadline get
            :class:`PublishTimeout`.

        Raises:
            LocalProtocolError: a message is invalid; nothing was sent.
            InvalidStateError: the publisher is closed.
            PublishTimeout: the outcomes were not all known a second after the deadline.
        """
        engine = self._port
        if properties is not None and type(properties) is not BasicProperties:
            properties = as_properties(properties)
        traced = _obs.active
        finish = None
        if traced is not None:  # rabbitry.observability: a span per message
            messages, finish = traced.publish_batch(
                self._async, messages, exchange, routing_key, properties
            )
        encoded = engine.encode_batch(
            messages, exchange, routing_key, properties, mandatory, persistent, expiration
        )
        if engine.closing:
            raise engine.closed_state()
        total = len(encoded)
        if not total:
            return []
        if timeout is None:
            timeout = self._timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        done: concurrent.futures.Future[list[BaseException | None]] = concurrent.futures.Future()
        batch = Batch(total, done)
        confirm = self._confirm
        release = self._release if confirm else None
        acquire, take = self._slots.acquire, self._slots.take
        start = 0
        while start < total:
            # Block only while holding no unsent slot: two batches each waiting with
            # half the window reserved would wait for each other forever.
            try:
                if not self._unblocked.is_set():
                    self._wait_unblocked(deadline, timeout)
                if confirm and not acquire(True, _remaining(deadline)):
                    if engine.closing:
                        raise engine.closed_state()
                    raise PublishTimeout(
                        f"could not publish within {timeout} s: no room in the window"
                    )
            except AMQPError as exc:
                if not start and not isinstance(exc, PublishTimeout):
                    raise  # nothing was sent: report it as the call's error
                self._portal.submit(_settle_rest, batch, start, total, exc)
                break
            count = total - start
            if confirm:
                count = 1 + take(count - 1)  # whatever else is free, in one lock round
            chunk = encoded[start : start + count]
            self._portal.submit(
                engine.send_batch,
                chunk,
                batch,
                start,
                deadline,
                release,
                size=sum(sum(map(len, frames)) for frames, _id, _mandatory in chunk),
            )
            start += count
        if finish is not None:
            finish(done)
        wait = None if deadline is None else max(0.0, deadline - time.monotonic()) + 1.0
        try:
            return done.result(wait)
        except concurrent.futures.TimeoutError:
            raise PublishTimeout(f"batch not settled within {timeout} s") from None

    def wait_for_confirms(self, *, timeout: float | None = None) -> None:
        """Block until nothing this publisher sent is unsettled (see the async twin).

        The done-callbacks of the settled futures have run by then too (they run on
        the connection's callback thread), unless this is called from one of them.

        Args:
            timeout: seconds to wait (``None``: no limit).

        Raises:
            PublishTimeout: messages were still unconfirmed after ``timeout`` seconds.
        """
        self._portal.call(
            self._async.wait_for_confirms, timeout=timeout, wait=caller_timeout(timeout)
        )
        self._callbacks_done(timeout)

    def unconfirmed(self) -> list[UnconfirmedMessage]:
        """The outbox: messages sent and not settled, oldest first (see the async twin)."""
        if self._portal.in_io_thread():
            raise InvalidStateError("unconfirmed() called from the IO thread; it would deadlock")
        result: concurrent.futures.Future[list[UnconfirmedMessage]] = concurrent.futures.Future()

        def snapshot() -> None:
            result.set_result(self._async.unconfirmed())

        self._portal.submit(snapshot)
        return result.result()

    def close(self, *, timeout: float | None = None) -> None:
        """Wait for outstanding confirms (up to ``timeout``), then close the channel.

        Idempotent. Threads blocked in ``publish`` get :class:`InvalidStateError`.

        Args:
            timeout: seconds to wait for the confirms, and then for the channel's
                close-ok (``None``: no limit).

        Raises:
            InvalidStateError: called from the connection's IO thread (a callback run
                there), where it would deadlock.
            Timeout: the confirms and the close-ok together took more than ``timeout``
                seconds and a second of grace; the close was cut short there (the
                publisher is closed all the same).
            UnobservedPublishFailures: futures returned by :meth:`publish` failed and
                nobody looked at them (they are logged at ERROR too); raised once.
        """
        self._shutdown(timeout)
        self._port.ledger.report()

    def _shutdown(self, timeout: float | None) -> None:
        """:meth:`close` without the report of the failures nobody looked at."""
        if self._async.is_closed or not self._connection.is_open:
            self._unblocked.set()
        else:
            try:
                self._portal.call(self._port.shutdown, timeout, wait=caller_timeout(timeout))
            finally:
                self._unblocked.set()  # threads waiting for an unblock see the close
        self._callbacks_done(timeout)

    def _callbacks_done(self, timeout: float | None) -> None:
        """Wait until the done-callbacks of the futures settled so far have run.

        They run on the callback thread, after the settle: a batching publisher's
        records are failed there, and must be in the report of the failures.
        """
        portal = self._portal
        dispatcher = portal.dispatcher
        if (
            dispatcher is None
            or dispatcher.stopping
            or portal.stopped
            or portal.in_io_thread()
            or threading.current_thread() is dispatcher.thread
        ):
            return
        passed = threading.Event()
        try:
            portal.submit(portal.post_callback, passed.set)
        except AMQPError:
            return
        passed.wait(timeout)

    # ------------------------------------------------------------------ internals

    def _on_closed(self) -> None:
        """IO thread: the publisher closed (or its connection ended): wake every thread
        waiting for window room or for an unblock; they find it closed and raise."""
        self._slots.close()
        self._unblocked.set()

    def _on_block_change(self, reason: str | None) -> None:
        """IO thread: mirror connection.blocked / unblocked."""
        if reason is None:
            self._unblocked.set()
        else:
            self._unblocked.clear()

    def _wait_unblocked(self, deadline: float | None, timeout: float | None) -> None:
        if not self._unblocked.wait(_remaining(deadline)):
            raise PublishTimeout(
                f"could not publish within {timeout} s: connection blocked by the broker: "
                f"{self._async.blocked_reason}"
            )
        if self._async.is_closed:
            raise self._port.closed_state()


def ledger_of(publisher: Publisher) -> UnobservedLedger:
    """The ledger of ``publisher``'s failed futures nobody looked at (for the library's
    objects that send through it: a batching publisher hands its ledger over to it)."""
    return publisher._port.ledger


def closed_state_of(publisher: Publisher) -> Callable[[], InvalidStateError]:
    """What makes the error a call on the closed ``publisher`` raises, chained to the
    connection's end when that closed it (for the library's objects that send through
    it: a batching publisher raises the same)."""
    return publisher._port.closed_state


#: What ``publish`` returns without confirms: a future that is already done.
_SENT: concurrent.futures.Future[None] = concurrent.futures.Future()
_SENT.set_result(None)


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _settle_rest(batch: Batch, start: int, total: int, exc: AMQPError) -> None:
    """IO thread: the rest of a batch could not be sent (deadline, or closed)."""
    for index in range(start, total):
        batch.settle(index, copy.copy(exc))
