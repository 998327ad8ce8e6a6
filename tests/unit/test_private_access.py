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


# Private names of modules. A private *module* (``_portal``) is the package's own and
# may be imported by any module of the package; a private *name* (``_wait``, ``_Batch``)
# belongs to the module that defines it. Another module that needs it is given a public
# name in that module (which stays package-internal when the module is private), not
# the private one: imported (``from .x import _name``), read off the module
# (``x._name``), or reached by a string (``getattr(obj, "_name")``).

_REFLECTION = ("getattr", "hasattr", "setattr", "delattr")


def _module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["rabbitry", *parts])


def _import_target(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``node`` imports from, inside ``module``."""
    if not node.level:
        return node.module or ""
    base = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def find_private_name_uses(trees: dict[str, ast.Module]) -> list[str]:
    """Each use of another module's private name in ``trees`` (paths relative to the
    package, as ``_parse`` gives them), as ``"path:line what"``."""
    modules = {_module_name(path) for path in trees}
    found: list[str] = []
    for path, tree in trees.items():
        module, is_package = _module_name(path), path.endswith("__init__.py")
        module_aliases: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _import_target(module, is_package, node)
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        module_aliases.add(alias.asname or alias.name)
                    elif _is_private(alias.name) and target in modules:
                        found.append(f"{path}:{node.lineno} imports {alias.name} from {target}")
            elif isinstance(node, ast.Import):
                module_aliases.update(
                    alias.asname for alias in node.names if alias.asname and alias.name in modules
                )
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and _is_private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_aliases
            ):
                found.append(f"{path}:{node.lineno} uses {node.value.id}.{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in _REFLECTION
                and len(node.args) >= 2
                and not _is_self(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _is_private(node.args[1].value)
            ):
                found.append(f"{path}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    return sorted(found)


def test_no_private_name_of_another_module_is_used() -> None:
    found = find_private_name_uses(_parse())
    report = "\n".join(f"  {use}" for use in found)
    assert not found, f"private names of other modules used:\n{report}"


def _trees(sources: dict[str, str]) -> dict[str, ast.Module]:
    return {path: ast.parse(text) for path, text in sources.items()}


def test_the_private_name_scan_catches_imports_module_reads_and_strings() -> None:
    trees = _trees(
        {
            "a.py": "_limit = 1\ndef _helper(): ...\n",
            "b.py": "from .a import _limit\n",
            "c.py": "from . import a\nx = a._helper()\n",
            "d.py": "def f(obj): return getattr(obj, '_state'), hasattr(obj, '_x')\n",
        }
    )
    assert find_private_name_uses(trees) == [
        "b.py:1 imports _limit from rabbitry.a",
        "c.py:2 uses a._helper",
        "d.py:1 getattr(..., '_state')",
        "d.py:1 hasattr(..., '_x')",
    ]


def test_the_private_name_scan_allows_private_modules_self_and_outside_names() -> None:
    trees = _trees(
        {
            "sub/__init__.py": "",
            "sub/_portal.py": "class Portal: ...\n",
            "e.py": "from .sub import _portal\n"
            "from .sub._portal import Portal\n"
            "from os import _exit\n",
            "f.py": "class F:\n"
            "    def g(self): return getattr(self, '_x'), getattr(self, '__doc__')\n",
        }
    )
    assert find_private_name_uses(trees) == []
