"""No module of the package uses a private name of a class defined in another module.

Definition. For every module M under ``src/rabbitry``: an attribute access ``expr._name``
(one leading underscore, not a dunder) where ``expr`` is not the bare name ``self`` or
``cls``, and ``_name`` is a private member of a class defined in another module and of no
class defined in M, is a violation. The private members of a class are its methods
(properties included), the names assigned in its body, and the ``self._name`` /
``cls._name`` attributes its methods assign; a ``typing.Protocol`` owns none (it only
describes the classes that match it). Accesses through ``self`` and ``cls`` (own
or inherited members) are allowed, and so are accesses to a name that a class of M also
defines (the access is then taken to be M's own).

A class that a collaborator must drive offers it an explicit interface instead: a method
that does the work (tell, don't ask), or public members documented as being for the
library's own use.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "rabbitry"

# Ratchet: (module, private name) pairs not fixed yet. Remove a pair once the module no
# longer reaches into that private name (test_remaining_is_current fails until it is
# removed); never add one.
REMAINING: set[tuple[str, str]] = {
    ("_consumer_core.py", "_pause_reading"),
    ("_consumer_core.py", "_resume_reading"),
    ("_consumer_core.py", "_start_consumer"),
    ("aio/_consumers.py", "_forget_if_auto_deleted"),
    ("aio/_consumers.py", "_pause_reading"),
    ("aio/_consumers.py", "_resume_reading"),
    ("aio/_events.py", "_consumers"),
    ("aio/_events.py", "_on_closed"),
    ("aio/_events.py", "_on_confirm"),
    ("aio/_events.py", "_on_consumer_cancelled"),
    ("aio/_events.py", "_on_delivery"),
    ("aio/_events.py", "_on_flow"),
    ("aio/_events.py", "_on_return"),
    ("aio/_events.py", "_on_rpc_reply"),
    ("aio/_events.py", "_suspend"),
    ("aio/_lifecycle.py", "_channels"),
    ("aio/_recovery.py", "_candidates"),
    ("aio/_recovery.py", "_channels"),
    ("aio/_recovery.py", "_closing"),
    ("aio/_recovery.py", "_connect_one"),
    ("aio/_recovery.py", "_consumer_specs"),
    ("aio/_recovery.py", "_give_up"),
    ("aio/_recovery.py", "_handle_events"),
    ("aio/_recovery.py", "_lose_consumer"),
    ("aio/_recovery.py", "_mark_lost"),
    ("aio/_recovery.py", "_notify_recovery_error"),
    ("aio/_recovery.py", "_notify_renamed"),
    ("aio/_recovery.py", "_open_channel"),
    ("aio/_recovery.py", "_recovery_done"),
    ("aio/_recovery.py", "_republish"),
    ("aio/_recovery.py", "_reset_attempt"),
    ("aio/_recovery.py", "_resubscribe_one"),
    ("aio/_recovery.py", "_resume"),
    ("aio/channel.py", "_forget_if_auto_deleted"),
    ("aio/channel.py", "_records_channel_topology"),
    ("aio/connection.py", "_await_rpc"),
    ("aio/connection.py", "_internal"),
    ("aio/connection.py", "_on_connection_lost"),
    ("aio/connection.py", "_on_connection_made"),
    ("aio/connection.py", "_out"),
    ("aio/connection.py", "_records"),
    ("consumer.py", "_abandon_consumer"),
    ("protocol/channel.py", "_events"),
    ("protocol/channel.py", "_out"),
    ("rpc.py", "_start_consumer"),
    ("service.py", "_loop"),
    ("sync/_connection.py", "_abort"),
    ("sync/_connection.py", "_begin_batch"),
    ("sync/_connection.py", "_end_batch"),
    ("sync/_connection.py", "_pause_reading"),
    ("sync/_connection.py", "_resume_reading"),
    ("sync/_consume.py", "_abandon_consumer"),
    ("sync/_consume.py", "_start_consumer"),
    ("sync/channel.py", "_closed"),
    ("sync/channel.py", "_dispatcher"),
    ("sync/channel.py", "_post"),
    ("sync/channel.py", "_require_portal"),
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any(
        (isinstance(base, ast.Name) and base.id == "Protocol")
        or (isinstance(base, ast.Attribute) and base.attr == "Protocol")
        for base in cls.bases
    )


def _class_members(cls: ast.ClassDef) -> set[str]:
    """The private members of ``cls``: methods, body assignments, ``self._x`` stores.

    A ``typing.Protocol`` owns nothing: it describes members of the classes that match
    it, so declaring another class's private name in one does not make its use local.
    """
    if _is_protocol(cls):
        return set()
    members: set[str] = set()
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            members.add(stmt.name)
            for node in ast.walk(stmt):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and _is_self(node.value)
                ):
                    members.add(node.attr)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    members.add(target.id)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            members.add(stmt.target.id)
    return {name for name in members if _is_private(name)}


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    expr: str
    name: str
    owners: tuple[str, ...]

    def __str__(self) -> str:
        owners = ", ".join(self.owners)
        return f"{self.module}:{self.line} {self.expr}.{self.name} (owned by {owners})"


def _parse() -> dict[str, ast.Module]:
    return {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


@cache
def find_violations() -> tuple[Violation, ...]:
    trees = _parse()
    owners: dict[str, set[str]] = defaultdict(set)
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for name in _class_members(node):
                    owners[name].add(module)
    found: list[Violation] = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            if _is_self(node.value):
                continue
            owning = owners.get(node.attr, set())
            if not owning or module in owning:
                continue
            found.append(
                Violation(
                    module, node.lineno, ast.unparse(node.value), node.attr, tuple(sorted(owning))
                )
            )
    return tuple(sorted(found, key=lambda v: (v.module, v.line, v.name)))


def test_no_private_access_across_modules() -> None:
    new = [v for v in find_violations() if (v.module, v.name) not in REMAINING]
    report = "\n".join(f"  {v}" for v in new)
    assert not new, f"private members of another module's class used:\n{report}"


def test_remaining_is_current() -> None:
    occurring = {(v.module, v.name) for v in find_violations()}
    stale = sorted(REMAINING - occurring)
    assert not stale, f"fixed, remove from REMAINING: {stale}"
