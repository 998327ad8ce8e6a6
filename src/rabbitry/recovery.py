"""Automatic recovery: the policy, the connection states, and what triggers recovery.

The mechanism lives in :class:`rabbitry.AsyncConnection` (the sync ``Connection``
forwards to it). With ``recovery=RecoveryPolicy()`` a connection that dies for a reason
worth retrying (socket error, missed heartbeats, a broker close such as 320
CONNECTION_FORCED) is not closed: it goes to ``RECOVERING``, reconnects across all
configured hosts with exponential backoff and jitter, and replays, in order:

1. channels, with their numbers, QoS, confirm and tx modes;
2. the topology record: exchanges, queues (a server-named queue gets a new name and the
   bindings and consumers follow it; rename callbacks fire), bindings;
3. consumers, with the same tags and callbacks.

It never recovers from an application ``close()``, an authentication failure or an
access refusal: those need a person, not a retry. An entity that fails to re-declare is
reported to the recovery-error callbacks and skipped (``on_entity_error="skip"``) or
ends the connection (``"abort"``). Deliveries of the old channels cannot be acked any
more (their tags died with the old connection and the broker redelivers them): each
channel has an *epoch*, and an ack for a message of an older epoch is dropped with a
warning instead of being sent, where it would close the new channel with 406.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Literal

from .exceptions import (
    AuthenticationError,
    ConfigurationError,
    ConnectionAccessRefused,
    ConnectionClosedByBroker,
    ConnectionLost,
    HeartbeatTimeout,
    InvalidPath,
    NotAllowed,
    RemoteProtocolError,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
)

__all__ = [
    "DEFAULT_RECOVERY",
    "NackRetry",
    "RecoveryPolicy",
    "State",
    "is_permanent",
    "is_recoverable",
]


def _check_backoff(
    initial_delay: float, max_delay: float, multiplier: float, jitter: float
) -> None:
    if not initial_delay >= 0:
        raise ConfigurationError(f"initial_delay: must be >= 0, got {initial_delay}")
    if not max_delay >= initial_delay:
        raise ConfigurationError(
            f"max_delay: must be >= initial_delay ({initial_delay}), got {max_delay}"
        )
    if not multiplier >= 1:
        raise ConfigurationError(f"multiplier: must be >= 1, got {multiplier}")
    if not 0 <= jitter < 1:
        raise ConfigurationError(f"jitter: must be in [0, 1), got {jitter}")


def _backoff(
    attempt: int,
    initial_delay: float,
    max_delay: float,
    multiplier: float,
    jitter: float,
    rand: float | None,
) -> float:
    """Exponential backoff capped at ``max_delay``, times a factor in ``1 ± jitter``."""
    base = min(max_delay, initial_delay * multiplier**attempt)
    if not jitter:
        return base
    factor = 1 + jitter * (2 * (random.random() if rand is None else rand) - 1)
    return min(max_delay, base * factor)


class State(enum.Enum):
    """What a connection is doing."""

    CONNECTING = "connecting"
    OPEN = "open"
    RECOVERING = "recovering"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """How a connection recovers.

    Args:
        initial_delay: seconds before the first reconnect attempt.
        max_delay: the cap of the exponential backoff, in seconds.
        multiplier: growth of the delay per failed attempt.
        jitter: each delay is multiplied by a random factor in ``1 ± jitter``.
        max_attempts: give up (the connection ends ``CLOSED``) after this many failed
            reconnect attempts; ``None`` keeps trying.
        shuffle_hosts: try the configured addresses in random order on each attempt
            (otherwise in the given order). Either way the address whose connection
            was lost is tried last.
        on_entity_error: ``"skip"`` an entity that fails to re-declare (after reporting
            it), or ``"abort"`` recovery and close.
        during_recovery: operations issued while recovering ``"wait"`` (up to their own
            timeout) for the connection to come back, or ``"fail"`` at once with
            :class:`rabbitry.ConnectionRecovering`.
        record_channel_topology: record what the channel methods declare, bind and
            delete (``exchange_declare``, ``queue_declare`` including server-named
            queues, ``queue_bind``, ``exchange_bind`` and their opposites; passive
            declares are not recorded) so that recovery declares it again, as it does
            for ``Topology.apply``. ``False`` replays only what ``Topology`` declared.
    """

    initial_delay: float = 0.1
    max_delay: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.25
    max_attempts: int | None = None
    shuffle_hosts: bool = False
    on_entity_error: Literal["skip", "abort"] = "skip"
    during_recovery: Literal["wait", "fail"] = "wait"
    record_channel_topology: bool = True

    def __post_init__(self) -> None:
        _check_backoff(self.initial_delay, self.max_delay, self.multiplier, self.jitter)
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool) or self.max_attempts < 1
        ):
            raise ConfigurationError(f"max_attempts: must be >= 1 or None, got {self.max_attempts}")
        if self.on_entity_error not in ("skip", "abort"):
            raise ConfigurationError(
                f"on_entity_error: must be 'skip' or 'abort', got {self.on_entity_error!r}"
            )
        if not isinstance(self.record_channel_topology, bool):
            raise ConfigurationError(
                "record_channel_topology: must be True or False, got "
                f"{self.record_channel_topology!r}"
            )
        if self.during_recovery not in ("wait", "fail"):
            raise ConfigurationError(
                f"during_recovery: must be 'wait' or 'fail', got {self.during_recovery!r}"
            )

    def delay(self, attempt: int, rand: float | None = None) -> float:
        """Seconds to wait before reconnect attempt ``attempt`` (0 is the first).

        Args:
            attempt: how many attempts failed before this one.
            rand: a number in [0, 1) for the jitter (default: ``random.random()``).

        Returns:
            The delay in seconds (exponential, capped at ``max_delay``, with jitter).
        """
        return _backoff(
            attempt, self.initial_delay, self.max_delay, self.multiplier, self.jitter, rand
        )


@dataclass(frozen=True, slots=True)
class NackRetry:
    """Send a message again, after a backoff, when the broker nacks it.

    RabbitMQ nacks a publish when a queue cannot take it: most often a quorum queue
    without a leader during an election (a transient state: the same message is accepted
    a moment later), or a queue at ``x-max-length`` with ``x-overflow=reject-publish``.
    With ``AsyncPublisher(nack_retry=NackRetry())`` a nacked message keeps its window
    slot and its future, is sent again with the same ``message_id`` after
    ``delay(attempt)``, and the future resolves on the confirm of a later attempt; only
    when ``max_attempts`` re-sends were nacked too does it fail with
    :class:`rabbitry.Nacked`. The publish deadline (``timeout``) still applies.

    Args:
        max_attempts: re-sends after the first nack before giving up (>= 1).
        initial_delay: seconds before the first re-send.
        max_delay: the cap of the exponential backoff, in seconds.
        multiplier: growth of the delay per nacked attempt.
        jitter: each delay is multiplied by a random factor in ``1 ± jitter``.
    """

    max_attempts: int = 10
    initial_delay: float = 0.05
    max_delay: float = 2.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigurationError(f"max_attempts: must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts: must be >= 1, got {self.max_attempts}")
        _check_backoff(self.initial_delay, self.max_delay, self.multiplier, self.jitter)

    def delay(self, attempt: int, rand: float | None = None) -> float:
        """Seconds to wait before re-send ``attempt``.

        Args:
            attempt: how many re-sends came before this one (0 is the first re-send).
            rand: a number in [0, 1) for the jitter (default: ``random.random()``).

        Returns:
            The delay in seconds (exponential, capped at ``max_delay``, with jitter).
        """
        return _backoff(
            attempt, self.initial_delay, self.max_delay, self.multiplier, self.jitter, rand
        )


#: The policy a connection uses unless it is given another one or ``recovery=None``.
DEFAULT_RECOVERY = RecoveryPolicy()


def is_recoverable(exc: BaseException) -> bool:
    """Whether a connection that ended with ``exc`` should be recovered.

    Yes for a lost socket, missed heartbeats, a broker-side close (320 and the like) and
    a protocol violation by the broker; no for our own close, refused credentials,
    refused access and an unknown virtual host.
    """
    if isinstance(exc, AuthenticationError | ConnectionAccessRefused | InvalidPath):
        return False
    return isinstance(
        exc, ConnectionLost | HeartbeatTimeout | ConnectionClosedByBroker | RemoteProtocolError
    )


def is_permanent(exc: BaseException) -> bool:
    """Whether a failed reconnect attempt means recovery can never succeed.

    Yes for refused credentials, refused access (403), an unknown virtual host (402)
    and 530 NOT_ALLOWED (the virtual host was deleted, or the user lost its
    permissions on it), except "vhost ... is down", which a restarting virtual host
    answers for a moment. Everything else (refused or reset sockets, timeouts, 320
    CONNECTION_FORCED, 541, a failing credentials provider, TLS) is retried.
    """
    if isinstance(
        exc,
        AuthenticationError
        | ConnectionAccessRefused
        | InvalidPath
        | VirtualHostNotFound
        | VirtualHostAccessRefused,
    ):
        return True
    if isinstance(exc, NotAllowed):
        return "is down" not in exc.reply_text
    return False
