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
    found = find_violations()
    report = "\n".join(f"  {v}" for v in found)
    assert not found, f"private members of another module's class used:\n{report}"
