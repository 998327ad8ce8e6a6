"""The retry rules: the entity names, the policy, and where a failed message goes.

A :class:`RetryPolicy` says how often and how late a failed message is retried;
:meth:`RetryPolicy.plan` decides, without I/O, where one failed delivery goes next
(:class:`RetryDecision`). The design is in :mod:`._retry`; the entities a policy adds
to a topology are built in :mod:`._retry_build`, and the move itself
(:func:`~rabbitry.topology.handle_failure`) is in :mod:`._retry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..exceptions import TopologyValidationError
from ._model import MAX_UINT32

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "ATTEMPTS_HEADER",
    "DELIVERY_LIMIT_REASON",
    "EXCEPTION_MESSAGE_HEADER",
    "EXCEPTION_TYPE_HEADER",
    "FIRST_FAILURE_HEADER",
    "HELPER_DELIVERY_LIMIT",
    "LAST_FAILURE_HEADER",
    "ORIGINAL_EXCHANGE_HEADER",
    "ORIGINAL_ROUTING_KEY_HEADER",
    "PARKED_REASON_HEADER",
    "WORK_QUEUE_DELIVERY_LIMIT",
    "RetryDecision",
    "RetryNames",
    "RetryPolicy",
    "delay_label",
    "dlx_name",
    "parking_lot_name",
    "retry_queue_name",
]

#: Handler invocations that failed so far (int), on republished messages.
ATTEMPTS_HEADER = "x-rabbitry-attempts"
#: The exchange and routing key the message was first published with.
ORIGINAL_EXCHANGE_HEADER = "x-rabbitry-original-exchange"
ORIGINAL_ROUTING_KEY_HEADER = "x-rabbitry-original-routing-key"
#: When the first and the latest failure happened (ISO 8601, UTC, milliseconds).
FIRST_FAILURE_HEADER = "x-rabbitry-first-failure"
LAST_FAILURE_HEADER = "x-rabbitry-last-failure"
#: The latest failure: the exception's type (``module.Qualname``) and its text.
EXCEPTION_TYPE_HEADER = "x-rabbitry-exception-type"
EXCEPTION_MESSAGE_HEADER = "x-rabbitry-exception-message"
#: Why a message is in the parking lot: ``max-attempts`` or ``not-retryable``.
PARKED_REASON_HEADER = "x-rabbitry-parked-reason"

#: The broker's dead-letter reason for a message returned more often than a quorum
#: queue's delivery limit allows (``x-first-death-reason``, ``x-death[].reason``).
DELIVERY_LIMIT_REASON = "delivery_limit"
#: The delivery limit ``with_retry`` gives a quorum work queue by default: RabbitMQ 4.0's
#: own default, made explicit so that a 3.x broker behaves the same.
WORK_QUEUE_DELIVERY_LIMIT = 20
#: The delivery limit of quorum retry queues and parking lots: never reached, and
#: accepted as a limit by RabbitMQ 3.x and 4.x alike.
HELPER_DELIVERY_LIMIT = 2**31 - 1

_MAX_EXCEPTION_TEXT = 1024


# --------------------------------------------------------------------------- names


def dlx_name(queue: str) -> str:
    """The retry hub exchange of ``queue``.

    Args:
        queue: the work queue.

    Returns:
        ``<queue>.dlx``.
    """
    return f"{queue}.dlx"


def parking_lot_name(queue: str) -> str:
    """The parking lot of ``queue``.

    Args:
        queue: the work queue.

    Returns:
        ``<queue>.parking-lot``.
    """
    return f"{queue}.parking-lot"


def delay_label(delay_ms: int) -> str:
    """``5s`` for whole seconds, else ``250ms``."""
    return f"{delay_ms // 1000}s" if delay_ms % 1000 == 0 and delay_ms else f"{delay_ms}ms"


def retry_queue_name(queue: str, delay_ms: int) -> str:
    """The retry queue of ``queue`` for one delay.

    Args:
        queue: the work queue.
        delay_ms: the delay in milliseconds.

    Returns:
        ``<queue>.retry.<delay>``, e.g. ``jobs.retry.5s``, ``jobs.retry.250ms``.
    """
    return f"{queue}.retry.{delay_label(delay_ms)}"


@dataclass(frozen=True)
class RetryNames:
    """The entity names the retry machinery of one work queue uses."""

    queue: str
    dlx: str
    retry_queues: tuple[str, ...]
    parking_lot: str | None


# --------------------------------------------------------------------------- policy


class _Delivered(Protocol):
    """What planning reads from a message (``rabbitry.Message`` has it)."""

    @property
    def headers(self) -> dict[str, Any]: ...

    exchange: str
    routing_key: str


@dataclass(frozen=True)
class RetryDecision:
    """What to do with a failed message.

    Attributes:
        kind: ``"retry"``, ``"park"`` (parking lot) or ``"drop"`` (no parking lot).
        via: ``"nack"`` (broker-driven: nack without requeue, the DLX does the rest),
            ``"publish"`` (republish with confirms to ``exchange``/``routing_key`` with
            ``headers``, then ack), or ``"ack"`` (just ack: dropped).
        exchange: where the message goes next.
        routing_key: with which routing key.
        headers: the headers of the republished message (``via == "publish"``).
        attempts: handler invocations so far, this failed one included.
        delay: seconds before the retry (``kind == "retry"``), else ``None``.
    """

    kind: Literal["retry", "park", "drop"]
    via: Literal["nack", "publish", "ack"]
    exchange: str
    routing_key: str
    headers: Mapping[str, Any]
    attempts: int
    delay: float | None = None


def _policy_error(field: str, rule: str) -> TopologyValidationError:
    return TopologyValidationError("retry policy", field, rule)


def _to_ms(value: object, index: int) -> int:
    name = f"delays[{index}]"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise _policy_error(name, f"must be seconds (a number) or a timedelta, got {value!r}")
    ms = round(seconds * 1000)
    if not 0 <= ms <= MAX_UINT32:
        raise _policy_error(
            name, f"must be 0..{MAX_UINT32 / 1000:.0f} seconds (x-message-ttl), got {seconds}"
        )
    return ms


@dataclass(frozen=True, init=False)
class RetryPolicy:
    """How often and how late a failed message is retried, and where it ends.

    Args:
        delays: seconds (or ``timedelta``) to wait before each retry; the last one
            repeats when ``max_attempts`` allows more retries than delays are given.
            One distinct delay: broker-driven retry; several: client republish (see
            :mod:`rabbitry.topology` and ``docs/topology.md``).
        max_attempts: handler invocations in total (3 = the first try and two retries,
            then the parking lot). Default: one more than the number of delays.
        parking_lot: after ``max_attempts`` move the message to ``<queue>.parking-lot``;
            ``False`` drops it (acked, with a warning in the log).
        fatal: exception types that skip the retries and go to the parking lot at once.
            An exception with ``retryable = False`` is treated the same.
        queue: the work queue, if the policy is used for one queue only; otherwise
            pass ``queue=`` to :meth:`plan` and :func:`handle_failure`.
        republish: take the client-republish path even with one delay. Quorum work
            queues need it (see "Quorum queues and their delivery limit" in
            :mod:`rabbitry.topology`): ``Topology.with_retry`` says so when it is missing.

    Raises:
        TopologyValidationError: a delay or the attempt count is out of range.
    """

    delays: tuple[float, ...]
    max_attempts: int
    parking_lot: bool
    fatal: tuple[type[BaseException], ...]
    queue: str | None
    republish: bool

    def __init__(
        self,
        delays: Sequence[float | timedelta] | float | timedelta = (),
        max_attempts: int | None = None,
        parking_lot: bool = True,
        *,
        fatal: Sequence[type[BaseException]] = (),
        queue: str | None = None,
        republish: bool = False,
    ) -> None:
        raw = [delays] if isinstance(delays, int | float | timedelta) else list(delays)
        ms = [_to_ms(value, i) for i, value in enumerate(raw)]
        if max_attempts is None:
            max_attempts = len(ms) + 1
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise _policy_error("max_attempts", f"must be an integer >= 1, got {max_attempts!r}")
        if max_attempts > 1 and not ms:
            raise _policy_error(
                "delays", f"max_attempts={max_attempts} allows retries, so give at least one delay"
            )
        if len(ms) > max_attempts - 1:
            raise _policy_error(
                "delays",
                f"{len(ms)} delays but max_attempts={max_attempts} allows only "
                f"{max_attempts - 1} retries; the extra delays would never be used",
            )
        if not isinstance(parking_lot, bool):
            raise _policy_error("parking_lot", f"must be True or False, got {parking_lot!r}")
        if not isinstance(republish, bool):
            raise _policy_error("republish", f"must be True or False, got {republish!r}")
        for kind in fatal:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise _policy_error("fatal", f"must be exception types, got {kind!r}")
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise _policy_error("queue", f"must be a non-empty queue name, got {queue!r}")
        object.__setattr__(self, "delays", tuple(m / 1000 for m in ms))
        object.__setattr__(self, "max_attempts", max_attempts)
        object.__setattr__(self, "parking_lot", parking_lot)
        object.__setattr__(self, "fatal", tuple(fatal))
        object.__setattr__(self, "queue", queue)
        object.__setattr__(self, "republish", republish)

    # -- derived facts

    @property
    def delays_ms(self) -> tuple[int, ...]:
        """The delays in milliseconds (what becomes x-message-ttl)."""
        return tuple(round(d * 1000) for d in self.delays)

    @property
    def tiers(self) -> tuple[int, ...]:
        """The distinct delays in milliseconds, in first-use order: one retry queue each."""
        return tuple(dict.fromkeys(self.delays_ms))

    @property
    def broker_driven(self) -> bool:
        """One distinct delay and no ``republish``: retries go through the broker's
        dead-lettering."""
        return len(self.tiers) == 1 and not self.republish

    def delay_ms_for(self, failures: int) -> int:
        """The delay before the retry that follows failure number ``failures``.

        Args:
            failures: how many times the handler failed (past the last tier, the last
                delay).

        Returns:
            The delay in milliseconds.

        Raises:
            ValueError: the policy has no retries.
        """
        if not self.delays:
            raise ValueError("this policy has no retries")
        delays = self.delays_ms
        return delays[min(max(failures, 1), len(delays)) - 1]

    def names(self, queue: str | None = None) -> RetryNames:
        """The entity names used for work queue ``queue``.

        Args:
            queue: the work queue (default: the policy's ``queue``).

        Returns:
            The exchange and queue names.

        Raises:
            ValueError: no ``queue`` here nor in the policy.
        """
        work = self._work_queue(queue)
        return RetryNames(
            work,
            dlx_name(work),
            tuple(retry_queue_name(work, ms) for ms in self.tiers),
            parking_lot_name(work) if self.parking_lot else None,
        )

    def _work_queue(self, queue: str | None) -> str:
        work = queue or self.queue
        if not work:
            raise ValueError(
                "which work queue? pass queue= (or build the policy with RetryPolicy(queue=...))"
            )
        return work

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether a failure with ``exc`` may be retried.

        Args:
            exc: what the handler raised.

        Returns:
            ``False`` for a ``fatal`` type or an exception with ``retryable = False``.
        """
        if isinstance(exc, self.fatal):
            return False
        return getattr(exc, "retryable", True) is not False

    # -- reading a delivery

    def attempts(self, message: _Delivered, queue: str | None = None) -> int:
        """Handler invocations that already failed before this delivery.

        Read from ``x-rabbitry-attempts`` when the message was republished (tier path),
        else from the broker's ``x-death`` count of rejections from the work queue
        (broker-driven path).

        Args:
            message: the delivery.
            queue: the work queue (default: the policy's ``queue``).

        Returns:
            The count (0 at the first delivery).
        """
        headers = message.headers
        ours = headers.get(ATTEMPTS_HEADER)
        if isinstance(ours, int) and not isinstance(ours, bool) and ours >= 0:
            return ours
        entry = _rejection(headers, queue or self.queue)
        count = entry.get("count") if entry else None
        return count if isinstance(count, int) and not isinstance(count, bool) else 0

    def plan(
        self,
        message: _Delivered,
        exc: BaseException,
        now: datetime | None = None,
        *,
        queue: str | None = None,
        retryable: bool | None = None,
    ) -> RetryDecision:
        """Decide where a message whose handler raised ``exc`` goes (pure; no I/O).

        Args:
            message: the failed delivery.
            exc: what the handler raised.
            now: the failure time (default: now, UTC).
            queue: the work queue (default: the policy's ``queue``).
            retryable: overrides :meth:`is_retryable`.

        Returns:
            Where the message goes and how (:class:`RetryDecision`).

        Raises:
            ValueError: no ``queue`` here nor in the policy.
        """
        work = self._work_queue(queue)
        now = now or datetime.now(UTC)
        attempts = self.attempts(message, work) + 1
        if retryable is None:
            retryable = self.is_retryable(exc)
        dlx = dlx_name(work)
        if retryable and attempts < self.max_attempts:
            delay_ms = self.delay_ms_for(attempts)
            target = retry_queue_name(work, delay_ms)
            if self.broker_driven:
                return RetryDecision("retry", "nack", dlx, target, {}, attempts, delay_ms / 1000)
            headers = self._failure_headers(message, exc, now, attempts, work)
            return RetryDecision(
                "retry", "publish", dlx, target, headers, attempts, delay_ms / 1000
            )
        if not self.parking_lot:
            return RetryDecision("drop", "ack", "", "", {}, attempts)
        headers = self._failure_headers(message, exc, now, attempts, work)
        headers[PARKED_REASON_HEADER] = "not-retryable" if not retryable else "max-attempts"
        return RetryDecision("park", "publish", dlx, parking_lot_name(work), headers, attempts)

    def _failure_headers(
        self, message: _Delivered, exc: BaseException, now: datetime, attempts: int, work: str
    ) -> dict[str, Any]:
        headers = dict(message.headers)
        rejection = _rejection(headers, work)
        if ORIGINAL_EXCHANGE_HEADER not in headers:
            exchange, routing_key = message.exchange, message.routing_key
            if rejection is not None:  # broker-driven: it came back through the DLX
                exchange = str(rejection.get("exchange", exchange))
                keys = rejection.get("routing-keys")
                if isinstance(keys, list) and keys:
                    routing_key = str(keys[0])
            headers[ORIGINAL_EXCHANGE_HEADER] = exchange
            headers[ORIGINAL_ROUTING_KEY_HEADER] = routing_key
        if FIRST_FAILURE_HEADER not in headers:
            first = rejection.get("time") if rejection is not None else None
            headers[FIRST_FAILURE_HEADER] = _iso(first if isinstance(first, datetime) else now)
        headers[LAST_FAILURE_HEADER] = _iso(now)
        headers[ATTEMPTS_HEADER] = attempts
        headers[EXCEPTION_TYPE_HEADER] = _type_name(exc)
        headers[EXCEPTION_MESSAGE_HEADER] = str(exc)[:_MAX_EXCEPTION_TEXT]
        return headers


def _rejection(headers: Mapping[str, Any], queue: str | None) -> dict[str, Any] | None:
    """The x-death entry for rejections from ``queue`` (any queue when ``None``)."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return None
    for entry in deaths:
        if (
            isinstance(entry, dict)
            and entry.get("reason") == "rejected"
            and (queue is None or entry.get("queue") == queue)
        ):
            return entry
    return None


def _iso(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _type_name(exc: BaseException) -> str:
    kind = type(exc)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"
