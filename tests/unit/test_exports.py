"""The public surface: ``rabbitry.__all__`` and the exception tree."""

from __future__ import annotations

import inspect
import re
import sys

import pytest

import rabbitry
import rabbitry.exceptions as exc_module
from rabbitry.exceptions import channel_error_for, connection_error_for

# The exceptions ``rabbitry`` exports: the ones applications catch around client calls,
# and the outcomes a consumer's handler raises. Every other exception is exported by
# ``rabbitry.exceptions`` alone. A change to this set is a change of the public face.
FACE_EXCEPTIONS = {
    "AMQPConnectionError",
    "AMQPError",
    "ChannelClosed",
    "ConfigurationError",
    "InvalidStateError",
    "Nacked",
    "NotFound",
    "PreconditionFailed",
    "PublishError",
    "PublishOutcomeUnknown",
    "Reject",
    "Requeue",
    "Retry",
    "Timeout",
    "Unroutable",
}

NUMBER_TYPES = {"Float32", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32"}


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


def test_the_top_level_exports_exactly_the_face_exceptions() -> None:
    exported = {
        name
        for name in rabbitry.__all__
        if inspect.isclass(getattr(rabbitry, name))
        and issubclass(getattr(rabbitry, name), BaseException)
    }
    assert exported == FACE_EXCEPTIONS
    for name in exported:
        # The same object, not a copy or a shadowing definition.
        assert getattr(rabbitry, name) is getattr(exc_module, name), name


@pytest.mark.parametrize("name", sorted(set(exc_module.__all__) - FACE_EXCEPTIONS))
def test_every_other_exception_is_still_an_attribute_of_the_package(name: str) -> None:
    # Not in __all__ (nor in a star import), but ``rabbitry.ConnectionLost`` and
    # ``from rabbitry import ConnectionLost`` keep working.
    assert name not in rabbitry.__all__
    assert getattr(rabbitry, name) is getattr(exc_module, name)
    namespace: dict[str, object] = {}
    exec(f"from rabbitry import {name}", namespace)
    assert namespace[name] is getattr(exc_module, name)


@pytest.mark.parametrize("name", sorted(NUMBER_TYPES))
def test_number_types_live_in_the_message_module(name: str) -> None:
    import rabbitry.message
    import rabbitry.protocol

    assert name in rabbitry.message.__all__
    assert name not in rabbitry.__all__
    assert getattr(rabbitry, name) is getattr(rabbitry.message, name)
    assert getattr(rabbitry, name) is getattr(rabbitry.protocol, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = rabbitry.NoSuchThing


@pytest.mark.parametrize("name", _exception_names())
def test_exceptions_name_the_module_that_defines_them(name: str) -> None:
    # Each class keeps the module it is defined in (no rewritten __module__): one of the
    # package's private modules, behind the one face of rabbitry.exceptions.
    cls = getattr(exc_module, name)
    assert cls.__module__.startswith("rabbitry.exceptions._"), cls.__module__
    assert getattr(sys.modules[cls.__module__], name) is cls


def test_exception_names_cover_the_module() -> None:
    # Every public exception class defined in the module is listed in its __all__.
    defined = {
        name
        for name, obj in vars(exc_module).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__.startswith(exc_module.__name__ + ".")
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
