"""Every ``python`` block in README.md and docs/*.md compiles.

The collector and the markers are in ``tests/support/docs_snippets.py``; the runnable
blocks also run against the broker, in ``tests/integration/test_docs_snippets.py``.
"""

from __future__ import annotations

import ast
import builtins

import pytest
from tests.support.docs_snippets import FRAGMENT, KINDS, Snippet, snippets

ALL = snippets()


def test_the_collector_finds_the_blocks() -> None:
    assert len(ALL) >= 40
    assert {s.path.name for s in ALL} >= {"README.md", "consuming.md", "publishing.md"}
    assert sum(s.kind != FRAGMENT for s in ALL) >= 8


@pytest.mark.parametrize("snippet", ALL, ids=[s.id for s in ALL])
def test_snippet_compiles(snippet: Snippet) -> None:
    assert snippet.kind in KINDS, f"{snippet.id}: unknown marker kind {snippet.kind!r}"
    if snippet.kind == FRAGMENT:
        assert snippet.reason, f"{snippet.id}: a fragment marker needs a reason"
        # A fragment may sit inside an ``async def`` of the page: allow top-level await.
        compile(snippet.code, snippet.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    else:
        # A program runs as written: no top-level await.
        compile(snippet.code, snippet.id, "exec")


@pytest.mark.parametrize(
    "snippet", [s for s in ALL if s.kind != FRAGMENT], ids=[s.id for s in ALL if s.kind != FRAGMENT]
)
def test_programs_use_only_names_they_define(snippet: Snippet) -> None:
    """A program reads no name it neither defines, imports nor gets from builtins."""
    tree = ast.parse(snippet.code)
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    defined.add(arg.arg)
                defined |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        elif isinstance(node, ast.Lambda):
            defined |= {a.arg for a in [*node.args.args, *node.args.kwonlyargs]}
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    used = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    assert not used - defined, f"{snippet.id}: undefined names {sorted(used - defined)}"
