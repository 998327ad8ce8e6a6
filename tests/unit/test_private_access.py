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
    ("_publisher_core.py", "_confirms"),
    ("_publisher_core.py", "_flush"),
    ("_publisher_core.py", "_kick"),
    ("_publisher_core.py", "_proto"),
    ("_publisher_core.py", "_suspended"),
    ("_publisher_core.py", "_wait_writable"),
    ("_publisher_core.py", "_write_paused"),
    ("aio/_events.py", "_fail_pending"),
    ("aio/_lifecycle.py", "_kick"),
    ("aio/channel.py", "_await_recovery"),
    ("aio/channel.py", "_kick"),
    ("aio/channel.py", "_wait_writable"),
    ("aio/channel.py", "_write_paused"),
    ("outbox_publisher.py", "_kick"),
    ("pool.py", "_confirms"),
    ("pool.py", "_confirms_settled"),
    ("pool.py", "_fail_pending"),
    ("pool.py", "_proto"),
    ("publisher.py", "_confirms"),
    ("publisher.py", "_kick"),
    ("publisher.py", "_proto"),
    ("publisher.py", "_resend"),
    ("publisher.py", "_wait_writable"),
    ("publisher.py", "_write_paused"),
    ("sync/_connection.py", "_transport"),
    ("sync/_connection.py", "_writable_hooks"),
    ("sync/_connection.py", "_write_paused"),
    ("sync/channel.py", "_proto"),
    ("sync/channel.py", "_publish_encoded"),
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
