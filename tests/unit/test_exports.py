"""The public surface: ``rabbitry.__all__`` and the exception tree."""

from __future__ import annotations

import inspect
import re

import pytest

import rabbitry
import rabbitry.exceptions as exc_module
from rabbitry.exceptions import channel_error_for, connection_error_for

# Members of ``rabbitry.exceptions.__all__`` deliberately NOT re-exported at top level.
# The reply-code subclasses below are rare enough to be caught as
# ConnectionClosedByBroker / ChannelClosedByBroker (with ``reply_code``); users who want
# them import them from ``rabbitry.exceptions``. Adding a new exception to the module
# forces a decision: export it, or list it here.
NOT_EXPORTED = {
    # connection-level reply codes
    "AMQPNotImplemented",  # 540
    "AMQPSyntaxError",  # 502
    "ChannelError",  # 504
    "CommandInvalid",  # 503
    "ConnectionAccessRefused",  # 403 (connection level)
    "FrameError",  # 501
    "InternalError",  # 541
    "InvalidPath",  # 402
    "NotAllowed",  # 530
    "ResourceError",  # 506
    "UnexpectedFrame",  # 505
    # channel-level reply codes
    "ContentTooLarge",  # 311
    "NoConsumers",  # 313
    "NoRoute",  # 312
    # helpers (functions, not exceptions): internal to the engine
    "channel_error_for",
    "connection_error_for",
}


def _natural(name: str) -> list[object]:
    """The order ruff's RUF022 keeps ``__all__`` in: case-sensitive, numbers by value
    (``Int8`` before ``Int16``)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _exception_names() -> list[str]:
    return [
        name
        for name in exc_module.__all__
        if inspect.isclass(getattr(exc_module, name))
        and issubclass(getattr(exc_module, name), BaseException)
    ]


def test_all_names_exist() -> None:
    missing = [name for name in rabbitry.__all__ if not hasattr(rabbitry, name)]
    assert not missing


def test_all_is_sorted_and_unique() -> None:
    assert len(set(rabbitry.__all__)) == len(rabbitry.__all__)
    assert list(rabbitry.__all__) == sorted(rabbitry.__all__, key=_natural)


def test_exceptions_all_is_sorted_unique_and_exists() -> None:
    names = exc_module.__all__
    assert len(set(names)) == len(names)
    assert list(names) == sorted(names, key=_natural)
    assert all(hasattr(exc_module, name) for name in names)


def test_star_import_matches_all() -> None:
    namespace: dict[str, object] = {}
    exec("from rabbitry import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(rabbitry.__all__)


def test_every_exception_is_exported_or_deliberately_not() -> None:
    module_names = set(exc_module.__all__)
    exported = module_names & set(rabbitry.__all__)
    not_exported = module_names - set(rabbitry.__all__)
    assert not_exported == NOT_EXPORTED, (
        f"newly unexported: {sorted(not_exported - NOT_EXPORTED)}; "
        f"now exported or gone (update NOT_EXPORTED): {sorted(NOT_EXPORTED - not_exported)}"
    )
    for name in exported:
        # The same object, not a copy or a shadowing definition.
        assert getattr(rabbitry, name) is getattr(exc_module, name), name


def test_top_level_exceptions_all_come_from_the_exceptions_module() -> None:
    for name in rabbitry.__all__:
        obj = getattr(rabbitry, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert name in exc_module.__all__, name
            assert obj.__module__ == "rabbitry.exceptions", name


def test_exception_names_cover_the_module() -> None:
    # Every public exception class defined in the module is listed in its __all__.
    defined = {
        name
        for name, obj in vars(exc_module).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == exc_module.__name__
        and not name.startswith("_")
    }
    assert defined == set(_exception_names())


HANDLER_OUTCOMES = {"HandlerSignal", "Retry", "Reject", "Requeue"}


@pytest.mark.parametrize(
    "name", sorted(set(_exception_names()) - {"ServiceStopped"} - HANDLER_OUTCOMES)
)
def test_every_error_derives_from_amqp_error(name: str) -> None:
    assert issubclass(getattr(exc_module, name), rabbitry.AMQPError)


@pytest.mark.parametrize("name", sorted(HANDLER_OUTCOMES))
def test_handler_outcomes_are_not_amqp_errors(name: str) -> None:
    # A handler's decision is no failure of the library: ``except AMQPError`` around
    # client calls must not catch it.
    outcome = getattr(exc_module, name)
    assert issubclass(outcome, rabbitry.HandlerSignal)
    assert not issubclass(outcome, rabbitry.AMQPError)


def test_a_malformed_envelope_is_both_an_error_and_a_reject() -> None:
    assert issubclass(rabbitry.BatchFormatError, rabbitry.AMQPError)
    assert issubclass(rabbitry.BatchFormatError, rabbitry.Reject)
    assert issubclass(rabbitry.BatchFormatError, ValueError)


def test_service_stopped_is_not_caught_by_except_exception() -> None:
    # Like KeyboardInterrupt: application code's ``except Exception`` must not swallow it.
    assert not issubclass(rabbitry.ServiceStopped, Exception)
    assert issubclass(rabbitry.ServiceStopped, BaseException)


def test_builtin_bases() -> None:
    assert issubclass(rabbitry.Timeout, TimeoutError)
    assert issubclass(rabbitry.InvalidStateError, RuntimeError)
    assert issubclass(rabbitry.AMQPConnectionError, ConnectionError)
    assert issubclass(rabbitry.ConfigurationError, ValueError)
    assert issubclass(rabbitry.LocalProtocolError, ValueError)
    # Catching the builtin catches ours.
    with pytest.raises(TimeoutError):
        raise rabbitry.Timeout("late")
    with pytest.raises(ConnectionError):
        raise rabbitry.ConnectionLost("gone")


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (404, rabbitry.NotFound),
        (406, rabbitry.PreconditionFailed),
        (403, rabbitry.AccessRefused),
        (405, rabbitry.ResourceLocked),
    ],
)
def test_channel_registry(code: int, cls: type) -> None:
    err = channel_error_for(code, "text", 50, 10)
    assert type(err) is cls
    assert isinstance(err, rabbitry.ChannelClosedByBroker)
    assert (err.reply_code, err.reply_text, err.class_id, err.method_id) == (code, "text", 50, 10)


def test_connection_registry() -> None:
    err = connection_error_for(320, "CONNECTION_FORCED - shutdown")
    assert type(err) is rabbitry.ConnectionForced
    assert isinstance(err, rabbitry.ConnectionClosedByBroker)
    assert isinstance(err, ConnectionError)
    assert err.reply_code == 320


def test_unknown_codes_fall_back_to_the_base_classes() -> None:
    assert type(channel_error_for(599)) is rabbitry.ChannelClosedByBroker
    assert type(connection_error_for(599)) is rabbitry.ConnectionClosedByBroker


def test_registries_are_level_specific() -> None:
    # 403 exists at both levels with different classes.
    assert type(channel_error_for(403)) is rabbitry.AccessRefused
    assert type(connection_error_for(403)) is exc_module.ConnectionAccessRefused
    # A channel code is not a connection code.
    assert type(connection_error_for(404)) is rabbitry.ConnectionClosedByBroker
