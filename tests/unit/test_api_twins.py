"""The sync API is a twin of the asyncio API: same members, same parameters.

The twin rule (docs/architecture.md, "The twin rule"): every public class that does I/O
comes as ``AsyncX`` for asyncio and ``X`` for threads, with the same public members, and
every method with the same parameters in the same order, kinds and defaults; a coroutine
on the async side is a blocking call on the sync side. This module compares every pair
in ``PAIRS`` mechanically, so a feature added to one side only, or a parameter
renamed/reordered/re-defaulted on one side, fails here. Members that exist on one side
only are listed in ``SYNC_ONLY`` / ``ASYNC_ONLY``, each with its reason. Members of the
asyncio classes that only the library's own objects use are listed in ``LIBRARY_ONLY``:
they are outside the twin promise, and their documentation says they are not for
applications.

Public members are the non-underscore names visible on the class (methods, properties,
class attributes) *plus* the public instance attributes assigned in ``__init__``
(``AsyncConnection.params`` and ``AsyncChannel.close_exc`` are plain attributes while
their sync twins are read-only properties; both count as the same member).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

import pytest

import rabbitry
from rabbitry import AsyncChannel, AsyncConnection, Channel, Connection
from rabbitry.batching_publisher import AsyncBatchingPublisher, BatchingPublisher
from rabbitry.consumer import AsyncConsumer
from rabbitry.management import AsyncManagementClient, ManagementClient
from rabbitry.outbox_publisher import AsyncOutboxPublisher
from rabbitry.pool import AsyncChannelPool
from rabbitry.publisher import AsyncPublisher
from rabbitry.sharded_queue import AsyncShardedQueueConsumer, ShardedQueueConsumer
from rabbitry.sharding import (
    AsyncShardedConsumer,
    AsyncShardedPublisher,
    ShardedConsumer,
    ShardedPublisher,
)
from rabbitry.shovel import AsyncShovel, Shovel
from rabbitry.sync.consumer import Consumer
from rabbitry.sync.outbox_publisher import OutboxPublisher
from rabbitry.sync.pool import ChannelPool
from rabbitry.sync.publisher import Publisher

# Members that exist on one side only, deliberately. Keep these minimal: every entry
# needs a reason, and an entry that stops being one-sided fails the test (so the list
# cannot silently go stale).
SYNC_ONLY: dict[type, dict[str, str]] = {
    Connection: {
        # The sync twin runs its own IO thread; asyncio code runs on the caller's loop.
        "io_thread_name": "diagnostics for the IO thread that only the sync API has",
        # Size of the dispatcher queue (callback thread); asyncio runs callbacks on the
        # loop, so there is no queue to size.
        "callback_queue_size": "bounds the sync callback dispatcher, which asyncio lacks",
    },
    Channel: {},
}
ASYNC_ONLY: dict[type, dict[str, str]] = {
    AsyncConnection: {},
    AsyncChannel: {},
}
# Members of the asyncio classes for the library's own objects that run on the event
# loop (its consumers, the channels of a connection), documented as not for applications.
# The sync twin runs those objects on its IO thread, inside the asyncio classes, so it
# has no use for them. Each needs a reason; a stale entry fails like the lists above.
LIBRARY_ONLY: dict[type, dict[str, str]] = {
    AsyncConnection: {
        "read_flow": "the read back-pressure handle of the consumers on the loop",
        "consumer_cancelled": "a channel tells its connection that one of its consumers ended",
    },
    AsyncChannel: {
        "start_consumer": "AsyncConsumer, the RPC client and Channel.consume subscribe with it",
        "abandon_consumer": "the same consumers end their subscription with it",
    },
}

# Every twin pair of the public API (docs/architecture.md lists the same pairs).
PAIRS = [
    (AsyncConnection, Connection),
    (AsyncChannel, Channel),
    (AsyncPublisher, Publisher),
    (AsyncOutboxPublisher, OutboxPublisher),
    (AsyncChannelPool, ChannelPool),
    (AsyncConsumer, Consumer),
    (AsyncShardedPublisher, ShardedPublisher),
    (AsyncShardedConsumer, ShardedConsumer),
    (AsyncShardedQueueConsumer, ShardedQueueConsumer),
    (AsyncBatchingPublisher, BatchingPublisher),
    (AsyncShovel, Shovel),
    (AsyncManagementClient, ManagementClient),
    (rabbitry.AsyncRpcClient, rabbitry.RpcClient),
    (rabbitry.AsyncRpcServer, rabbitry.RpcServer),
]
PAIR_IDS = [sync_cls.__name__ for _, sync_cls in PAIRS]
# The two pairs the checks of channels and connections below assume.
CORE_PAIRS = PAIRS[:2]
CORE_IDS = PAIR_IDS[:2]


def _init_attributes(cls: type) -> set[str]:
    """Public ``self.<name> = ...`` / ``self.<name>: T = ...`` targets in ``__init__``s."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:  # every class but ``object``
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= _self_targets(ast.parse(textwrap.dedent(inspect.getsource(init))))
    return names


def _self_targets(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
                and not target.attr.startswith("_")
            ):
                names.add(target.attr)
    return names


def public_members(cls: type) -> set[str]:
    on_class = {name for name in dir(cls) if not name.startswith("_")}
    # Anything inherited from ``object`` is not part of the API.
    on_class -= {name for name in dir(object) if not name.startswith("_")}
    return on_class | _init_attributes(cls)


def _static(cls: type, name: str) -> Any:
    """The member as defined on the class, or None for an instance attribute."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def _is_method(member: Any) -> bool:
    return inspect.isfunction(member)


def _signature_shape(func: Any) -> list[tuple[str, inspect._ParameterKind, Any]]:
    """Names, kinds and defaults of the parameters (annotations ignored), minus self."""
    params = list(inspect.signature(func).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def _describe(shape: list[tuple[str, inspect._ParameterKind, Any]]) -> str:
    parts = []
    for name, kind, default in shape:
        text = f"{kind.description} {name}"
        if default is not inspect.Parameter.empty:
            text += f"={default!r}"
        parts.append(text)
    return ", ".join(parts)


def _member_differences(async_cls: type, sync_cls: type) -> list[str]:
    """Everything that breaks the twin promise between two classes (empty = twins)."""
    problems: list[str] = []
    async_members = public_members(async_cls)
    sync_members = public_members(sync_cls)
    sync_only = SYNC_ONLY.get(sync_cls, {})
    async_only = ASYNC_ONLY.get(async_cls, {}) | LIBRARY_ONLY.get(async_cls, {})

    for name in sorted(async_members - sync_members - set(async_only)):
        problems.append(f"{async_cls.__name__}.{name} has no twin on {sync_cls.__name__}")
    for name in sorted(sync_members - async_members - set(sync_only)):
        problems.append(f"{sync_cls.__name__}.{name} has no twin on {async_cls.__name__}")
    for name in sorted(set(sync_only) - (sync_members - async_members)):
        problems.append(f"stale SYNC_ONLY entry {sync_cls.__name__}.{name}: not one-sided")
    for name in sorted(set(async_only) - (async_members - sync_members)):
        problems.append(
            f"stale ASYNC_ONLY/LIBRARY_ONLY entry {async_cls.__name__}.{name}: not one-sided"
        )

    for name in sorted(async_members & sync_members):
        a = _static(async_cls, name)
        s = _static(sync_cls, name)
        if _is_method(a) != _is_method(s):
            problems.append(
                f"{name}: a method on one side only "
                f"({async_cls.__name__}: {type(a).__name__}, {sync_cls.__name__}: "
                f"{type(s).__name__})"
            )
            continue
        if not _is_method(a):
            continue  # properties and attributes: presence is what matters
        a_shape, s_shape = _signature_shape(a), _signature_shape(s)
        if a_shape != s_shape:
            problems.append(
                f"{name}: parameters differ\n"
                f"  {async_cls.__name__}: ({_describe(a_shape)})\n"
                f"  {sync_cls.__name__}: ({_describe(s_shape)})"
            )
    return problems


@pytest.mark.parametrize(("async_cls", "sync_cls"), PAIRS, ids=PAIR_IDS)
def test_public_members_are_twins(async_cls: type, sync_cls: type) -> None:
    problems = _member_differences(async_cls, sync_cls)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("async_cls", "sync_cls"), CORE_PAIRS, ids=CORE_IDS)
def test_member_sets_are_not_trivially_empty(async_cls: type, sync_cls: type) -> None:
    # Guards the comparison itself: if discovery broke, everything would "match".
    members = public_members(async_cls)
    assert len(members) >= 10
    assert "close" in members
    assert "is_open" in members
    assert "close_exc" in members  # an instance attribute on the async side


def test_async_methods_are_coroutines_and_sync_ones_are_not() -> None:
    """A coroutine on the async side is a blocking call on the sync side, never async."""
    for async_cls, sync_cls in PAIRS:
        for name in public_members(async_cls) & public_members(sync_cls):
            s = _static(sync_cls, name)
            if _is_method(s):
                assert not inspect.iscoroutinefunction(s), f"{sync_cls.__name__}.{name}"
                assert not inspect.isasyncgenfunction(s), f"{sync_cls.__name__}.{name}"


def test_context_manager_twins() -> None:
    # async with <-> with: the dunders differ by name, so they are checked by hand.
    for async_cls, sync_cls in PAIRS:
        name = sync_cls.__name__
        assert hasattr(async_cls, "__aenter__") == hasattr(sync_cls, "__enter__"), name
        assert hasattr(async_cls, "__aexit__") == hasattr(sync_cls, "__exit__"), name
        if hasattr(async_cls, "__aenter__"):
            assert inspect.iscoroutinefunction(async_cls.__aenter__), name
            assert not inspect.iscoroutinefunction(sync_cls.__enter__), name


def test_every_pair_has_members_to_compare() -> None:
    # Guards the discovery for every pair, as the core check above does for two.
    for async_cls, sync_cls in PAIRS:
        shared = public_members(async_cls) & public_members(sync_cls)
        assert len(shared) >= 2, sync_cls.__name__


def test_connection_init_parameters_identical() -> None:
    a = inspect.signature(AsyncConnection.__init__).parameters
    s = inspect.signature(Connection.__init__).parameters
    assert list(a) == list(s)
    for name in a:
        assert a[name].kind == s[name].kind, name
        assert a[name].default == s[name].default, name
        # Both modules use postponed annotations, so these are the source strings.
        assert a[name].annotation == s[name].annotation, name


def test_allow_lists_are_minimal() -> None:
    # Growing these lists should be a deliberate, reviewed decision.
    assert sum(len(v) for v in SYNC_ONLY.values()) <= 2
    assert sum(len(v) for v in ASYNC_ONLY.values()) == 0
    assert sum(len(v) for v in LIBRARY_ONLY.values()) <= 4


def test_library_only_members_say_they_are_not_for_applications() -> None:
    # What the twin rule leaves out must not become user API by accident.
    for cls, members in LIBRARY_ONLY.items():
        for name in members:
            doc = " ".join((inspect.getdoc(_static(cls, name)) or "").split())
            assert "not for applications" in doc, f"{cls.__name__}.{name}"


# ------------------------------------------------------------- consumer twins
# rabbitry.sync.consumer.Consumer is the twin of rabbitry.consumer.AsyncConsumer (its
# docstring: "Same arguments and semantics"). In PAIRS too; these add the consumer's own
# promises (constructor, blocking start/stop).

CONSUMER_PAIR = (AsyncConsumer, Consumer)


def test_consumer_public_members_are_twins() -> None:
    problems = _member_differences(*CONSUMER_PAIR)
    assert not problems, "\n".join(problems)


def test_consumer_shared_members_have_the_same_shape() -> None:
    # Whatever both sides have must match (signatures, method vs property), even while
    # some members were missing on one side.
    problems = [
        p for p in _member_differences(*CONSUMER_PAIR) if "has no twin on Consumer" not in p
    ]
    assert not problems, "\n".join(problems)
    shared = public_members(AsyncConsumer) & public_members(Consumer)
    assert {"start", "stop", "stats", "is_running", "queue", "consumer_tag"} <= shared


def test_consumer_init_parameters_identical() -> None:
    a = inspect.signature(AsyncConsumer.__init__).parameters
    s = inspect.signature(Consumer.__init__).parameters
    assert list(a) == list(s)
    for name in a:
        assert a[name].kind == s[name].kind, name
        assert a[name].default == s[name].default, name


def test_consumer_start_stop_block_with_timeout_and_are_not_coroutines() -> None:
    for name in ("start", "stop"):
        assert inspect.iscoroutinefunction(getattr(AsyncConsumer, name)), name
        sync = getattr(Consumer, name)
        assert not inspect.iscoroutinefunction(sync), name
        params = inspect.signature(sync).parameters
        assert params["timeout"].default is None, name
        assert ".call(" in inspect.getsource(sync), name


def test_consumer_context_manager_twins() -> None:
    assert inspect.iscoroutinefunction(AsyncConsumer.__aenter__)
    assert inspect.iscoroutinefunction(AsyncConsumer.__aexit__)
    assert not inspect.iscoroutinefunction(Consumer.__enter__)
    assert not inspect.iscoroutinefunction(Consumer.__exit__)


# ------------------------------------------------------------- the checker checks


class _Base:
    def __init__(self) -> None:
        self.state = 1

    def method(self, a: int, *, timeout: float | None = None) -> None: ...


class _AsyncBase:
    def __init__(self) -> None:
        self.state = 1

    async def method(self, a: int, *, timeout: float | None = None) -> None: ...


def test_checker_accepts_twins() -> None:
    assert _member_differences(_AsyncBase, _Base) == []


def test_checker_flags_a_member_added_to_one_side() -> None:
    class SyncPlus(_Base):
        def new_feature(self) -> None: ...

    class AsyncPlus(_AsyncBase):
        def __init__(self) -> None:
            super().__init__()
            self.new_attribute = 2

    assert any("new_feature" in p for p in _member_differences(_AsyncBase, SyncPlus))
    assert any("new_attribute" in p for p in _member_differences(AsyncPlus, _Base))


@pytest.mark.parametrize(
    "variant",
    [
        "def method(self, b: int, *, timeout: float | None = None) -> None: ...",
        "def method(self, a: int, *, timeout: float | None = 5.0) -> None: ...",
        "def method(self, a: int, timeout: float | None = None) -> None: ...",
        "def method(self, a: int, *, timeout: float | None = None, x: int = 0) -> None: ...",
        "def method(self, *, timeout: float | None = None, a: int = 0) -> None: ...",
    ],
    ids=["renamed", "default", "kind", "extra", "order"],
)
def test_checker_flags_parameter_drift(variant: str) -> None:
    namespace: dict[str, Any] = {}
    exec(variant, namespace)
    drifted = type("Drifted", (_Base,), {"method": namespace["method"]})
    problems = _member_differences(_AsyncBase, drifted)
    assert any("parameters differ" in p for p in problems), problems


def test_checker_ignores_annotations() -> None:
    def method(self: object, a: str, *, timeout: int | None = None) -> int:
        return 0

    other = type("Annotated", (_Base,), {"method": method})
    assert _member_differences(_AsyncBase, other) == []


@pytest.mark.parametrize("cls", [Connection, Channel])
def test_every_blocking_sync_method_takes_timeout(cls: type) -> None:
    """Every method that waits on the IO thread (``portal.call``) accepts ``timeout=``."""
    blocking = []
    for name in sorted(public_members(cls)):
        member = _static(cls, name)
        if not _is_method(member):
            continue
        source = inspect.getsource(member)
        if ".call(" not in source:
            continue
        blocking.append(name)
        params = inspect.signature(member).parameters
        assert "timeout" in params, f"{cls.__name__}.{name} blocks but takes no timeout="
        assert params["timeout"].default is None, f"{cls.__name__}.{name}"
    assert len(blocking) >= 5  # the scan found the blocking methods at all


# ------------------------------------------------------------- outbox publisher twins
# rabbitry.OutboxPublisher is the twin of rabbitry.AsyncOutboxPublisher (what
# ``publisher(outbox=...)`` returns on each side).

OUTBOX_PAIR = (AsyncOutboxPublisher, OutboxPublisher)


def test_outbox_publisher_public_members_are_twins() -> None:
    problems = _member_differences(*OUTBOX_PAIR)
    assert not problems, "\n".join(problems)
    shared = public_members(AsyncOutboxPublisher) & public_members(OutboxPublisher)
    assert {"publish", "publish_many", "flush", "close", "stats", "outbox"} <= shared


def test_outbox_publisher_blocking_methods() -> None:
    for name in ("publish", "publish_many", "flush", "close"):
        assert inspect.iscoroutinefunction(getattr(AsyncOutboxPublisher, name)), name
        sync = getattr(OutboxPublisher, name)
        assert not inspect.iscoroutinefunction(sync), name
        assert ".call(" in inspect.getsource(sync), name
        assert inspect.signature(sync).parameters["timeout"].default is None, name
    assert not inspect.iscoroutinefunction(AsyncOutboxPublisher.stats)
    assert inspect.iscoroutinefunction(AsyncOutboxPublisher.__aexit__)
    assert not inspect.iscoroutinefunction(OutboxPublisher.__exit__)


def test_publisher_factories_take_the_outbox_last() -> None:
    for cls in (AsyncConnection, Connection):
        params = inspect.signature(cls.publisher).parameters
        assert list(params)[-1] == "outbox", cls
        assert params["outbox"].default is None
