"""Check that the public API documents its parameters, return values and exceptions.

``make docs`` runs it before building the site: the API reference is generated from these
docstrings (mkdocstrings, Google style), so a parameter left out there is left out of the
documentation.

What is checked: every public function and every public method (name not starting with
``_``; inherited ones included) of the public names of :data:`MODULES` (their
``__all__``, or else every public name they define) and of every public name that the
modules of :data:`SOURCE_MODULES` define, exported or not (the sans-IO core, whose API
is used by the engines rather than shown in the reference), when it is defined in the
same top-level package and takes a parameter besides ``self``/``cls``. Properties and
functions nested in functions are not checked. For each, its Google-style docstring must
have:

* ``Args:`` with an entry (``name:`` or ``name (type):``) for every parameter besides
  ``self``/``cls`` (``*args`` may be written ``args`` or ``*args``, ``**kwargs`` likewise);
* ``Returns:`` (or ``Yields:``) when the return annotation is neither ``None`` nor
  ``NoReturn``/``Never`` (the awaited value, for a coroutine);
* ``Raises:`` with an entry for every exception class the body raises itself: a
  ``raise X(...)`` or ``raise X`` statement whose ``X`` (or its last dotted part) starts
  with a capital letter, outside nested functions and classes. A re-raise (``raise``,
  ``raise exc``) and an exception raised by a called function are not counted.

The implementation of an ``@overload``-ed function is the one checked (the last ``def``
of that name). Generated code (``protocol/spec.py``) is documented by its generator,
``tools/gen_spec.py``, and not checked here; the modules of :data:`PROTOCOL_PENDING` are
the only ones of the sans-IO core not checked yet.

Each violation is printed as ``path:line module.qualname: missing Args for x, y; missing
Returns; missing Raises for ValueError``; the exit status is 1 if there is any, else 0.

Usage::

    python tools/check_docstrings.py [--every-name] [MODULE ...]

Modules named on the command line are checked by their ``__all__``, or with
``--every-name`` by every public name they define.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The modules whose public names make up the API reference (docs/reference/*.md).
MODULES = (
    "rabbitry",
    "rabbitry.sync",
    "rabbitry.sync.rpc",
    "rabbitry.config",
    "rabbitry.rpc",
    "rabbitry.batching",
    "rabbitry.sharded_queue",
    "rabbitry.topology",
    "rabbitry.management",
    "rabbitry.observability",
    "rabbitry.spark",
    "rabbitry.exceptions",
)

#: Modules whose every public name is checked, whether ``__all__`` exports it or not.
SOURCE_MODULES = (
    "rabbitry.protocol.connection",
    "rabbitry.protocol.events",
    "rabbitry.protocol.frames",
    "rabbitry.protocol.greeting",
    "rabbitry.protocol._refusal",
    "rabbitry.protocol._handshake",
    "rabbitry.protocol._heartbeat",
    "rabbitry.protocol._tables",
    "rabbitry.protocol.message",
    "rabbitry.protocol.tags",
    "rabbitry.protocol.streams",
    "rabbitry.protocol.batching",
    "rabbitry.protocol.channel",
    "rabbitry.protocol.publish",
    "rabbitry.protocol._content",
)

#: Modules of ``rabbitry.protocol`` not checked yet (their public methods lacking
#: Args/Returns/Raises sections); none is left. A module listed here moves to
#: :data:`SOURCE_MODULES` once documented. ``protocol/spec.py`` is neither: it is
#: generated, and documented by its generator.
PROTOCOL_PENDING: tuple[str, ...] = ()

_SECTION = re.compile(r"^([A-Z][A-Za-z ]*):\s*$")
# An entry: ``name:``, ``name (type):``, ``*args:``; in Raises also ``A, B: ...``.
_ENTRY = re.compile(r"^\s*([\w.*]+(?:\s*[,/]\s*[\w.*]+)*)\s*(\([^)]*\))?\s*:")
_NO_RETURN = {"None", "NoReturn", "Never"}

_Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Target:
    """A function to check: where it is defined and under which name it is reported."""

    path: Path
    qualname: str
    module: str


@dataclass
class Sections:
    """The entry names of each section of a Google-style docstring."""

    entries: dict[str, set[str]] = field(default_factory=dict)

    def names(self, *sections: str) -> set[str] | None:
        """The entries of the first of ``sections`` present (``None``: none is)."""
        for section in sections:
            if section in self.entries:
                return self.entries[section]
        return None


def parse_docstring(doc: str) -> Sections:
    """The sections of a cleaned docstring (``inspect.cleandoc``) and their entries.

    A section starts at an unindented ``Name:`` line; its entries are its lines at the
    indentation of its first indented line that read ``name:`` or ``name (type):``
    (``*args`` counts as ``args``; ``A, B:`` or ``A / B:`` names both).
    """
    sections = Sections()
    current: set[str] | None = None
    entry_indent: int | None = None
    for line in doc.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            match = _SECTION.match(line)
            current = sections.entries.setdefault(match.group(1), set()) if match else None
            entry_indent = None
            continue
        if current is None:
            continue
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent and (entry := _ENTRY.match(line)):
            names = re.split(r"\s*[,/]\s*", entry.group(1))
            current.update(name.strip("*.") for name in names)
    return sections


def _public_functions(obj: object, top: str) -> list[object]:
    """The functions ``obj`` is or, for a class, its public methods (inherited too)."""
    if inspect.isfunction(obj):
        return [obj]
    if not inspect.isclass(obj):
        return []
    found: list[object] = []
    for klass in obj.__mro__:
        if klass.__module__.split(".")[0] != top:
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(attr, staticmethod | classmethod):
                attr = attr.__func__
            if inspect.isfunction(attr):
                found.append(attr)
    return found


def _defined_names(module_name: str, module: object) -> list[str]:
    """The public names ``module`` defines itself (not the ones it imports)."""
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module_name
    ]


def collect(modules: list[str], every_name: list[str] | None = None) -> list[Target]:
    """The functions of the public names of ``modules`` defined in their package.

    Args:
        modules: modules checked by their ``__all__`` (or, without one, by every public
            name they define).
        every_name: modules checked by every public name they define, exported or not.

    Returns:
        The functions to check, sorted by file and qualified name.
    """
    targets: dict[tuple[Path, str], Target] = {}
    wanted = [(name, False) for name in modules] + [(name, True) for name in every_name or ()]
    for module_name, every in wanted:
        module = importlib.import_module(module_name)
        top = module_name.split(".")[0]
        names = None if every else getattr(module, "__all__", None)
        if names is None:
            names = _defined_names(module_name, module)
        for name in names:
            for func in _public_functions(getattr(module, name), top):
                func = inspect.unwrap(func)  # type: ignore[arg-type]
                module_of = getattr(func, "__module__", None) or ""
                if module_of.split(".")[0] != top or "<locals>" in func.__qualname__:
                    continue
                path = Path(func.__code__.co_filename).resolve()
                if path.is_file():
                    targets.setdefault(
                        (path, func.__qualname__), Target(path, func.__qualname__, module_of)
                    )
    return sorted(targets.values(), key=lambda t: (str(t.path), t.qualname))


def _definitions(
    tree: ast.Module,
) -> dict[str, tuple[_Function, bool]]:
    """Every function of a module by qualified name, and whether it is a method."""
    found: dict[str, tuple[_Function, bool]] = {}

    def visit(body: list[ast.stmt], prefix: str, in_class: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found[f"{prefix}{node.name}"] = (node, in_class)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body, prefix, in_class)
                visit(node.orelse, prefix, in_class)

    visit(tree.body, "", False)
    return found


def _own_raises(node: _Function) -> set[str]:
    """The exception classes ``node``'s body raises itself (see the module docstring)."""
    raised: set[str] = set()
    todo: list[ast.AST] = list(node.body)
    while todo:
        child = todo.pop()
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(child, ast.Raise) and child.exc is not None:
            exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
            name = ast.unparse(exc).rsplit(".", 1)[-1]
            if isinstance(exc, ast.Name | ast.Attribute) and name[:1].isupper():
                raised.add(name)
        todo.extend(ast.iter_child_nodes(child))
    return raised


def check_function(node: _Function, is_method: bool) -> list[str]:
    """What ``node``'s docstring is missing (empty: nothing, or out of scope)."""
    decorators = {ast.unparse(d).rsplit(".", 1)[-1] for d in node.decorator_list}
    if decorators & {"property", "cached_property", "setter", "deleter"}:
        return []
    args = node.args
    params = [a.arg for a in (*args.posonlyargs, *args.args)]
    if is_method and "staticmethod" not in decorators and params[:1] in (["self"], ["cls"]):
        params = params[1:]
    params += [a.arg for a in args.kwonlyargs]
    if args.vararg:
        params.append(args.vararg.arg)
    if args.kwarg:
        params.append(args.kwarg.arg)
    if not params:
        return []
    sections = parse_docstring(ast.get_docstring(node) or "")
    problems = []
    documented = sections.names("Args", "Arguments") or set()
    if missing := [p for p in params if p not in documented]:
        problems.append(f"missing Args for {', '.join(missing)}")
    returns = node.returns
    if returns is not None and ast.unparse(returns).strip("'\"") not in _NO_RETURN:
        if sections.names("Returns", "Yields") is None:
            problems.append("missing Returns")
    raised = _own_raises(node)
    listed = {name.rsplit(".", 1)[-1] for name in sections.names("Raises") or set()}
    if missing := sorted(raised - listed):
        problems.append(f"missing Raises for {', '.join(missing)}")
    return problems


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def check(targets: list[Target]) -> list[str]:
    """One line per target whose docstring misses something, sorted by file and line."""
    trees: dict[Path, dict[str, tuple[_Function, bool]]] = {}
    lines: list[tuple[str, int, str]] = []
    for target in targets:
        shown = _shown(target.path)
        if target.path not in trees:
            tree = ast.parse(target.path.read_text(encoding="utf-8"), str(target.path))
            trees[target.path] = _definitions(tree)
        definition = trees[target.path].get(target.qualname)
        if definition is None:
            continue  # made at run time (not a def statement of the file)
        node, is_method = definition
        if problems := check_function(node, is_method):
            name = f"{target.module}.{target.qualname}"
            lines.append(
                (shown, node.lineno, f"{shown}:{node.lineno} {name}: {'; '.join(problems)}")
            )
    return [text for _, _, text in sorted(lines)]


def main(argv: list[str] | None = None) -> int:
    """Check the modules named on the command line (default :data:`MODULES`).

    Args:
        argv: the command line arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status: 1 if a docstring misses something, else 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--every-name",
        action="store_true",
        help="check every public name the named modules define, not only their __all__",
    )
    parser.add_argument(
        "modules",
        nargs="*",
        help=f"default: {' '.join(MODULES)}, and every name of {' '.join(SOURCE_MODULES)}",
    )
    args = parser.parse_args(argv)
    source = str(ROOT / "src")
    if source not in sys.path:
        sys.path.insert(0, source)  # this tree's rabbitry, not an installed one
    if not args.modules:
        targets = collect(list(MODULES), list(SOURCE_MODULES))
    elif args.every_name:
        targets = collect([], args.modules)
    else:
        targets = collect(args.modules)
    problems = check(targets)
    for line in problems:
        print(line)
    print(
        f"check_docstrings: {len(targets)} functions, {len(problems)} with a docstring "
        "that misses something",
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
