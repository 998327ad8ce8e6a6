"""Check the import graph of ``src/``: no cycles, and no import from a higher layer.

Every import counts: module level, under ``if TYPE_CHECKING:``, and inside functions
(a lazy import is still a dependency, only a later one). An edge goes to the module
that defines the imported name as Python resolves it:

- ``import a.b.c`` and ``from a.b import c`` where ``c`` is a submodule: an edge to
  ``a.b.c``;
- ``from a.b import name`` where ``name`` is not a submodule: an edge to ``a.b``
  (``a/b/__init__.py`` when ``a.b`` is a package, whatever it re-exports);
- relative imports are resolved against the importing module's package.

Imports of modules outside ``src/`` are ignored. The parent packages Python initialises
on the way to a submodule are not edges: otherwise every submodule a package's
``__init__`` imports would form a cycle with it.

Layers: ``LAYERS`` below lists, bottom to top, the groups of modules of ``rabbitry``. A
module may import modules of its own layer and of the layers below, never above. Every
module of ``rabbitry`` must match a layer; the first matching entry wins.

Usage: ``python tools/check_imports.py [SRC_DIR]`` (default: ``src`` next to ``tools``).
Exit status 0 when the graph is clean, 1 otherwise, with each cycle (the files and the
imported names of each edge) and each layer violation printed.
"""

from __future__ import annotations

import ast
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

# Bottom to top. A pattern is a module name, or a name ending in ".*" for a package and
# everything in it. The first layer (from the bottom) whose pattern matches a module is
# its layer, so an explicit name in a lower layer wins over a ".*" above.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "leaves",
        (
            "rabbitry._version",
            "rabbitry.exceptions.*",
            "rabbitry.broker",
            "rabbitry.record",
            "rabbitry._support.*",
        ),
    ),
    # Sans-IO: bytes in, events out. Knows nothing of sockets, asyncio or threads.
    ("protocol", ("rabbitry.protocol.*",)),
    (
        "engine helpers",
        (
            "rabbitry.message",
            "rabbitry.config.*",
            "rabbitry.recovery",
            "rabbitry.streams",
            "rabbitry.batching",
            "rabbitry.observability._state",
            # What the engine's channels offer the code that publishes on them.
            "rabbitry.publishing.*",
        ),
    ),
    # The asyncio engine: connection I/O, channels, recovery.
    ("engine", ("rabbitry.aio.*",)),
    # Built on the engine's AsyncConnection and AsyncChannel, asyncio only.
    (
        "high-level",
        (
            "rabbitry.topology._checks",
            "rabbitry.topology._model",
            "rabbitry.topology._policy",
            "rabbitry.topology._sharding",
            "rabbitry.topology._base",
            "rabbitry.topology._session",
            "rabbitry.topology._retry_policy",
            "rabbitry.topology._retry",
            "rabbitry.topology._retry_build",
            "rabbitry.topology._diff",
            "rabbitry.topology._definitions",
            "rabbitry.topology._conflicts",
            "rabbitry.topology._apply",
            "rabbitry._outbox.*",
            "rabbitry.outbox",
            "rabbitry._publisher.*",
            "rabbitry.publisher",
            "rabbitry.outbox_publisher",
            "rabbitry.pool",
            "rabbitry._consumer.*",
            "rabbitry.consumer",
            "rabbitry.rpc",
            "rabbitry.management.*",
        ),
    ),
    # rabbitry.AsyncConnection: the engine plus the factories of the high-level objects.
    ("connection with factories", ("rabbitry._connection",)),
    # The thread-safe twins.
    ("sync facade", ("rabbitry.sync.*",)),
    # Topology.apply / verify / delete take either connection.
    (
        "topology",
        (
            "rabbitry.topology",
            "rabbitry.topology._on_broker",
            "rabbitry.topology._topology",
            "rabbitry.topology._super_stream",
        ),
    ),
    # Objects with an asyncio and a thread-safe twin in one module, and rabbitry.run.
    (
        "twins",
        (
            "rabbitry.sharding",
            "rabbitry.sharded_queue",
            "rabbitry._batch_envelopes",
            "rabbitry.batching_publisher",
            "rabbitry._shovel.*",
            "rabbitry.shovel",
            "rabbitry.service",
        ),
    ),
    # The package's public names.
    ("package", ("rabbitry",)),
    # Optional extras and programs built on the library.
    (
        "applications",
        (
            "rabbitry.observability.*",
            "rabbitry.spark.*",
            "rabbitry.cli.*",
            "rabbitry.demo",
            "rabbitry.__main__",
        ),
    ),
)

# Only modules of these top-level packages are given a layer.
LAYERED = ("rabbitry",)


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    # target module -> (line, imported names) of each import statement
    imports: dict[str, list[tuple[int, str]]] = field(default_factory=dict)


def find_modules(src: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        if not parts or not all(part.isidentifier() for part in parts):
            continue
        # A directory without __init__.py is not a package of src/.
        if any(
            not (src.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))
        ):
            continue
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package)
    return modules


def _resolve_base(module: Module, level: int, target: str | None) -> str | None:
    if level == 0:
        return target
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if level - 1 >= len(package):
        return None
    base = package[: len(package) - (level - 1)]
    if target:
        base = [*base, *target.split(".")]
    return ".".join(base) or None


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def collect_imports(modules: dict[str, Module]) -> None:
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        for node in _imports(tree):
            targets: list[tuple[str, str]] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.append((alias.name, alias.name))
            else:
                base = _resolve_base(module, node.level, node.module)
                if base is None:
                    continue
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    if submodule in modules:
                        targets.append((submodule, alias.name))
                    else:
                        targets.append((base, alias.name))
            for target, imported in targets:
                if target not in modules or target == module.name:
                    continue
                module.imports.setdefault(target, []).append((node.lineno, imported))


def strongly_connected(modules: dict[str, Module]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, iter(sorted(modules[root].imports))))
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(modules[child].imports))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components, key=lambda c: (-len(c), c))


def shortest_cycle(modules: dict[str, Module], component: Sequence[str]) -> list[str]:
    """One shortest cycle through the first module of a component (breadth-first)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(modules[node].imports):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child not in seen:
                    seen.add(child)
                    previous[child] = node
                    following.append(child)
        frontier = following
    return [start]


def layer_of(name: str) -> int | None:
    for number, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern.endswith(".*"):
                package = pattern[:-2]
                if name == package or name.startswith(package + "."):
                    return number
            elif name == pattern:
                return number
    return None


def _edge(modules: dict[str, Module], src: Path, source: str, target: str) -> str:
    uses = modules[source].imports[target]
    names = ", ".join(sorted({imported for _, imported in uses}))
    lines = ", ".join(str(line) for line in sorted({line for line, _ in uses}))
    path = modules[source].path.relative_to(src)
    return f"{path}:{lines} -> {target} ({names})"


def check(src: Path) -> tuple[list[str], int, int]:
    """The problems found in ``src``, the number of modules and of cyclic components."""
    modules = find_modules(src)
    collect_imports(modules)
    problems: list[str] = []
    components = strongly_connected(modules)
    for component in components:
        lines = [f"cycle among {len(component)} modules: {', '.join(component)}"]
        cycle = shortest_cycle(modules, component)
        lines.append("  for example:")
        for source, target in itertools.pairwise(cycle):
            lines.append("    " + _edge(modules, src, source, target))
        problems.append("\n".join(lines))
    for name in sorted(modules):
        if name.split(".")[0] not in LAYERED:
            continue
        layer = layer_of(name)
        if layer is None:
            problems.append(f"{modules[name].path.relative_to(src)}: {name} is in no layer")
            continue
        for target in sorted(modules[name].imports):
            if target.split(".")[0] not in LAYERED:
                continue
            target_layer = layer_of(target)
            if target_layer is not None and target_layer > layer:
                problems.append(
                    f"layer violation: {name} ({LAYERS[layer][0]}) imports {target} "
                    f"({LAYERS[target_layer][0]}): {_edge(modules, src, name, target)}"
                )
    return problems, len(modules), len(components)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    src = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "src"
    problems, module_count, cycle_count = check(src)
    for problem in problems:
        print(problem)
    violations = len(problems) - cycle_count
    print(
        f"check_imports: {module_count} modules, {cycle_count} import cycles, "
        f"{violations} layer problems",
        file=sys.stderr if problems else sys.stdout,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
