"""The recovery policy: which failures recovery retries and which end it."""

from __future__ import annotations

import pytest

from rabbitry import ConfigurationError, RecoveryPolicy
from rabbitry.exceptions import (
    AuthenticationError,
    ConnectError,
    ConnectionAccessRefused,
    ConnectionForced,
    ConnectionLost,
    CredentialsError,
    HeartbeatTimeout,
    InternalError,
    InvalidPath,
    NotAllowed,
    Timeout,
    TLSError,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
)
from rabbitry.recovery import is_permanent, is_recoverable


@pytest.mark.parametrize(
    "exc",
    [
        AuthenticationError("refused"),
        ConnectionAccessRefused(403, "ACCESS_REFUSED - access to vhost 'v' refused"),
        InvalidPath(402, "INVALID_PATH"),
        NotAllowed(530, "NOT_ALLOWED - vhost v not found"),
        NotAllowed(530, "NOT_ALLOWED - access to vhost 'v' refused for user 'guest'"),
        # What a reconnect attempt raises for those two, typed for the application.
        VirtualHostNotFound("127.0.0.1:5672: the broker has no virtual host 'v'"),
        VirtualHostAccessRefused("127.0.0.1:5672: user 'guest' may not use virtual host 'v'"),
    ],
)
def test_failures_that_no_retry_can_heal_end_recovery(exc: Exception) -> None:
    assert is_permanent(exc)
    assert not is_recoverable(exc) or isinstance(
        exc, NotAllowed | VirtualHostNotFound | VirtualHostAccessRefused
    )


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionLost("reset"),
        HeartbeatTimeout("silent"),
        ConnectionForced(320, "CONNECTION_FORCED - broker forced connection closure"),
        InternalError(541, "INTERNAL_ERROR"),
        NotAllowed(530, "NOT_ALLOWED - vhost v is down"),
        ConnectError("refused"),
        Timeout("no answer"),
        TLSError("handshake"),
        CredentialsError("provider raised"),
    ],
)
def test_transient_failures_are_retried(exc: Exception) -> None:
    assert not is_permanent(exc)


def test_record_channel_topology_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="record_channel_topology"):
        RecoveryPolicy(record_channel_topology="no")  # type: ignore[arg-type]
    assert RecoveryPolicy().record_channel_topology is True
