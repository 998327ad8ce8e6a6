"""No module of the package uses a private name that another module owns.

A name is private when it has one leading underscore and is no dunder. For every module M
under ``src/rabbitry``, three kinds of use are violations.

Members of another module's class. The private members of a class are its methods
(properties included), the names assigned in its body, and the ``self._name`` /
``cls._name`` attributes its methods assign; a ``typing.Protocol`` owns none (it only
describes the classes that match it). An attribute access ``expr._name`` where ``expr``
is not ``self``, ``cls`` or ``super()`` (own or inherited members) and ``_name`` is a
private member of a class of another module is a violation:

- when no class of M has a member ``_name`` either;
- when a class of M has one too (the names coincide) and M does not show that ``expr``
  is an object of such a class.

What M shows, without knowing types: the classes ``expr`` is known to be an object of.
``expr`` is known when it is

- a class of M itself (``C._name``), or a call of one (``C()._name``);
- a name narrowed by an enclosing ``if isinstance(x, C)``, ``isinstance(x, C) and ...``
  or ``not isinstance(x, C) or ...`` (when that code does not rebind it);
- a name of the enclosing function (or of the module, at its top level) with a declared
  type: a parameter or a variable annotated with classes (``x: C``, ``x: C | D | None``,
  ``x: "C"``, ``x: Optional[C]``, ``x: C[T]``; mypy holds every binding to it);
- without one, a name all of whose bindings there are assignments of known
  expressions; a loop target, an unannotated parameter or any other binding makes it
  unknown;
- ``self.attr`` (``cls.attr``), known the same way from what the class declares or
  assigns to ``attr`` in its body and methods.

Known classes pass when each is a class of M that has the member ``_name`` itself (an
inherited one does not count), or a class from outside the
package (imported from a module that is not ``rabbitry``'s, ``typing`` and the ABC
modules excepted: their names are no classes of objects). An access to a name that no
class of the package owns (``sys._getframe``, a named tuple's ``_replace``) is not the
package's concern.

Private names of other modules. A private *module* (``sync/_portal``) is the package's
own, and any module of the package may import it or reach it as an attribute of its
package; a private *name* defined in a module (``_helper``, ``_Batch``, ``_limit``)
belongs to that module. Importing it (``from .x import _name``, a re-export ``as _name``
included) or reaching it on an imported module (``x._name``, ``rabbitry.x._name``, read
or assigned) is a violation.

Reflection. ``getattr``, ``hasattr``, ``setattr`` and ``delattr`` with a literal private
name on anything but ``self`` or ``cls`` are violations, whoever owns the name.

A class or module that a collaborator must drive offers it an explicit interface
instead: a method that does the work (tell, don't ask), or public members and functions
documented as being for the library's own use.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "rabbitry"

_REFLECTION = ("getattr", "hasattr", "setattr", "delattr")
_FUNCTION = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
# Imported from these, a name is no class an object has (``Any``, a Protocol, an ABC).
_TYPING = ("typing", "typing_extensions", "collections.abc", "abc")
_OUTSIDE = "<a class from outside the package>"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "super"
        and not node.args
    )


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
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} {self.what}"


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


def _annotated_classes(annotation: ast.expr | None) -> list[ast.expr] | None:
    """The classes an annotation names (``None`` and type arguments aside), as the
    expressions naming them; ``None`` when it is no class or union of classes."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.Name | ast.Attribute):
        return [annotation]
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        left, right = _annotated_classes(annotation.left), _annotated_classes(annotation.right)
        return None if left is None or right is None else left + right
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return []
    if isinstance(annotation, ast.Subscript):
        generic = annotation.value
        if isinstance(generic, ast.Name) and generic.id == "Optional":
            return _annotated_classes(annotation.slice)
        if isinstance(generic, ast.Name | ast.Attribute):
            return [generic]  # a generic class: ``_Waiter[T]``, ``asyncio.Future[T]``
    return None


def _narrowed(test: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """``(name, classes)`` when ``test`` is ``isinstance(name, C)`` or
    ``isinstance(name, (C, D))``."""
    if not (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
        and isinstance(test.args[0], ast.Name)
    ):
        return None
    kinds = test.args[1]
    classes = list(kinds.elts) if isinstance(kinds, ast.Tuple) else [kinds]
    if not all(isinstance(c, ast.Name | ast.Attribute) for c in classes):
        return None
    return test.args[0].id, classes


def _rebinds(nodes: list[ast.stmt] | ast.expr, name: str) -> bool:
    roots = nodes if isinstance(nodes, list) else [nodes]
    return any(
        isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load)
        for root in roots
        for node in ast.walk(root)
    )


@dataclass
class _Bindings:
    """How a name (or a ``self`` attribute) gets its values in one scope."""

    annotations: list[ast.expr | None] = field(default_factory=list)
    values: list[tuple[ast.expr, ast.AST]] = field(default_factory=list)
    other: bool = False


def _name_bindings(scope: ast.AST, name: str) -> _Bindings:
    """The bindings of the local ``name`` in ``scope`` (a function, or the module)."""
    found = _Bindings()
    if isinstance(scope, _FUNCTION):
        arguments = scope.args
        for arg in (
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            *filter(None, (arguments.vararg, arguments.kwarg)),
        ):
            if arg.arg == name:
                found.annotations.append(arg.annotation)
    counted: set[int] = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name:
                found.annotations.append(node.annotation)
                counted.add(id(node.target))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    found.values.append((node.value, scope))
                    counted.add(id(target))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            counted.add(id(node.target))  # keeps the name's type
    for node in ast.walk(scope):
        if isinstance(node, ast.Name) and node.id == name and id(node) not in counted:
            found.other = found.other or isinstance(node.ctx, ast.Store | ast.Del)
        elif isinstance(node, ast.ExceptHandler | ast.Global | ast.Nonlocal):
            names = node.names if isinstance(node, ast.Global | ast.Nonlocal) else [node.name]
            found.other = found.other or name in names
    return found


def _attribute_bindings(cls: ast.ClassDef, name: str) -> _Bindings:
    """The bindings of ``self.name`` (and ``cls.name``) in the body of ``cls``."""
    found = _Bindings()
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if stmt.target.id == name:
                found.annotations.append(stmt.annotation)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    found.values.append((stmt.value, cls))
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            counted: set[int] = set()
            for node in ast.walk(stmt):
                if isinstance(node, ast.AnnAssign) and _is_self_attribute(node.target, name):
                    found.annotations.append(node.annotation)
                    counted.add(id(node.target))
                elif isinstance(node, ast.Assign):
                    for target in node.targets:
                        if _is_self_attribute(target, name):
                            found.values.append((node.value, stmt))
                            counted.add(id(target))
                elif isinstance(node, ast.AugAssign):
                    counted.add(id(node.target))
            for node in ast.walk(stmt):
                if (
                    _is_self_attribute(node, name)
                    and id(node) not in counted
                    and isinstance(getattr(node, "ctx", None), ast.Store | ast.Del)
                ):
                    found.other = True
    return found


def _is_self_attribute(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id in ("self", "cls")
    )


@dataclass
class _Package:
    """What the scan needs to know of the whole package."""

    trees: dict[str, ast.Module]
    modules: set[str] = field(default_factory=set)
    owners: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    classes: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.modules = {_module_name(path) for path in self.trees}
        for path, tree in self.trees.items():
            self.classes[path] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    members = _class_members(node)
                    self.classes[path].setdefault(node.name, set()).update(members)
                    for name in members:
                        self.owners[name].add(path)


class _Scan(ast.NodeVisitor):
    """The violations of one module."""

    def __init__(self, package: _Package, path: str) -> None:
        self.package = package
        self.path = path
        self.module = _module_name(path)
        self.is_package = path.endswith("__init__.py")
        self.aliases: dict[str, str] = {}
        self.outside: set[str] = set()
        self.scopes: list[ast.AST] = []
        self.narrowed: list[tuple[str, list[ast.expr]]] = []
        self.found: list[Violation] = []
        for node in ast.walk(package.trees[path]):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self._bind(node)

    def _bind(self, node: ast.Import | ast.ImportFrom) -> None:
        modules = self.package.modules
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.partition(".")[0]
                if alias.asname and alias.name in modules:
                    self.aliases[alias.asname] = alias.name
                elif not alias.asname and (top in modules or top == "rabbitry"):
                    self.aliases[top] = top
                elif top != "rabbitry" and alias.name not in _TYPING:
                    self.outside.add(alias.asname or top)
            return
        target = _import_target(self.module, self.is_package, node)
        for alias in node.names:
            if f"{target}.{alias.name}" in modules:
                self.aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
            elif not node.level and target.partition(".")[0] != "rabbitry":
                if target not in _TYPING:
                    self.outside.add(alias.asname or alias.name)

    def _report(self, node: ast.AST, what: str) -> None:
        self.found.append(Violation(self.path, getattr(node, "lineno", 0), what))

    def _resolve(self, node: ast.expr) -> str | None:
        """The module of the package ``node`` names, if it names one."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            if base is not None and f"{base}.{node.attr}" in self.package.modules:
                return f"{base}.{node.attr}"
        return None

    def _visit_scope(self, node: ast.AST) -> None:
        self.scopes.append(node)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _visit_scope

    def _visit_narrowed(self, test: ast.expr, body: list[ast.stmt] | ast.expr) -> None:
        narrowing = _narrowed(test)
        if narrowing is not None and not _rebinds(body, narrowing[0]):
            self.narrowed.append(narrowing)
        for node in body if isinstance(body, list) else [body]:
            self.visit(node)
        if narrowing is not None and not _rebinds(body, narrowing[0]):
            self.narrowed.pop()

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._visit_narrowed(node.test, node.body)
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit(node.test)
        self._visit_narrowed(node.test, node.body)
        self.visit(node.orelse)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        """``isinstance(x, C) and x._y``, ``not isinstance(x, C) or x._y``."""
        pushed = 0
        for value in node.values:
            self.visit(value)
            test = value
            if isinstance(node.op, ast.Or):
                is_not = isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not)
                test = value.operand if isinstance(value, ast.UnaryOp) and is_not else None
            narrowing = _narrowed(test) if test is not None else None
            if narrowing is not None and not any(_rebinds(v, narrowing[0]) for v in node.values):
                self.narrowed.append(narrowing)
                pushed += 1
        del self.narrowed[len(self.narrowed) - pushed :]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        target = _import_target(self.module, self.is_package, node)
        if target in self.package.modules and target != self.module:
            for alias in node.names:
                if _is_private(alias.name) and f"{target}.{alias.name}" not in self.package.modules:
                    self._report(node, f"imports {alias.name} from {target}")

    def visit_Call(self, node: ast.Call) -> None:
        if (
            isinstance(node.func, ast.Name)
            and node.func.id in _REFLECTION
            and len(node.args) >= 2
            and not _is_self(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
        ):
            self._report(node, f"{node.func.id}(..., {node.args[1].value!r})")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)
        if not _is_private(node.attr) or _is_self(node.value):
            return
        module = self._resolve(node.value)
        if module is not None:
            if f"{module}.{node.attr}" not in self.package.modules and module != self.module:
                self._report(node, f"uses {ast.unparse(node.value)}.{node.attr} of {module}")
            return
        owning = self.package.owners.get(node.attr, set())
        others = sorted(owning - {self.path})
        if not others or self._proven_own(node):
            return
        shared = " (also a member here, not provably one of this module's classes)"
        self._report(
            node,
            f"{ast.unparse(node.value)}.{node.attr} owned by {', '.join(others)}"
            + (shared if self.path in owning else ""),
        )

    def _proven_own(self, node: ast.Attribute) -> bool:
        """Whether ``node.value`` is known to be an object of a class of this module that
        has the member ``node.attr``, or of a class from outside the package."""
        scope = next(
            (s for s in reversed(self.scopes) if isinstance(s, _FUNCTION)),
            self.package.trees[self.path],
        )
        classes = self._classes_of(node.value, scope, depth=0)
        members = self.package.classes[self.path]
        return bool(classes) and all(
            c == _OUTSIDE or node.attr in members.get(c, ()) for c in classes or ()
        )

    def _class_named(self, expr: ast.expr) -> str | None:
        """The class of this module ``expr`` names, ``_OUTSIDE``, or ``None`` (not known)."""
        if isinstance(expr, ast.Name) and expr.id in self.package.classes[self.path]:
            return expr.id
        root = expr
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.outside:
            return _OUTSIDE
        return None

    def _named(self, exprs: list[ast.expr] | None) -> set[str] | None:
        names = [self._class_named(e) for e in exprs] if exprs is not None else [None]
        return None if None in names else {n for n in names if n is not None}

    def _classes_of(self, expr: ast.expr, scope: ast.AST, depth: int) -> set[str] | None:
        """The classes ``expr`` evaluates to an object of, as far as its declared types,
        ``isinstance`` tests and constructor calls show (``None``: not known)."""
        if depth > 4:
            return None
        if isinstance(expr, ast.Call):
            return self._named([expr.func])
        if isinstance(expr, ast.Name) and expr.id not in ("self", "cls"):
            if depth == 0:
                for name, classes in reversed(self.narrowed):
                    if name == expr.id:
                        return self._named(classes)
            bindings = _name_bindings(scope, expr.id)
            if not (bindings.annotations or bindings.values or bindings.other):
                local = self.package.classes[self.path]
                return {expr.id} if expr.id in local else None
        elif isinstance(expr, ast.Attribute) and _is_self(expr.value):
            owner = next((s for s in reversed(self.scopes) if isinstance(s, ast.ClassDef)), None)
            if owner is None or isinstance(expr.value, ast.Call):
                return None
            bindings = _attribute_bindings(owner, expr.attr)
        else:
            return None
        if bindings.annotations:  # the declared type, which mypy holds every binding to
            found: set[str] = set()
            for annotation in bindings.annotations:
                named = self._named(_annotated_classes(annotation))
                if named is None:
                    return None
                found |= named
            return found
        if bindings.other or not bindings.values:
            return None
        classes: set[str] = set()
        for value, where in bindings.values:
            value_classes = self._classes_of(value, where, depth + 1)
            if value_classes is None:
                return None
            classes |= value_classes
        return classes


def scan(trees: dict[str, ast.Module]) -> list[Violation]:
    """Each use of a private name another module owns in ``trees``.

    ``trees`` maps the path of each module relative to the package (``sync/_portal.py``)
    to its AST.
    """
    package = _Package(trees)
    found: list[Violation] = []
    for path in sorted(trees):
        visitor = _Scan(package, path)
        visitor.visit(trees[path])
        found.extend(visitor.found)
    return sorted(found, key=lambda v: (v.module, v.line, v.what))


def parse_package(root: Path) -> dict[str, ast.Module]:
    return {
        path.relative_to(root).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(root.rglob("*.py"))
    }


@cache
def find_violations() -> tuple[Violation, ...]:
    return tuple(scan(parse_package(PACKAGE)))


def test_no_private_name_of_another_module_is_used() -> None:
    found = find_violations()
    report = "\n".join(f"  {v}" for v in found)
    assert not found, f"private names of other modules used:\n{report}"
