"""The ``python`` code blocks of README.md and docs/*.md, for the snippet tests.

Every block is one of three kinds, chosen by an HTML comment on the line just before its
opening fence (invisible on the rendered page):

* no marker: a complete program. ``tests/unit/test_docs_snippets.py`` compiles it and
  ``tests/integration/test_docs_snippets.py`` runs it against the broker at
  ``RABBITMQ_URL``, in a fresh interpreter; it must exit 0.
* ``<!-- snippet: sigterm -->``: a complete program that runs until SIGTERM (a
  service). The integration test starts it, sends SIGTERM after a few seconds and
  expects a clean exit.
* ``<!-- snippet: fragment; <reason> -->``: a piece of a larger program (it uses a
  ``conn`` or ``channel`` from the page, another client's API, a cluster, Spark...).
  It is compiled, with top-level ``await`` allowed, but not run. The reason is
  required, so that every fragment is a reviewed decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"<!--\s*snippet:\s*(?P<kind>[a-z]+)\s*(?:;\s*(?P<reason>.*?))?\s*-->")

RUN = "run"
SIGTERM = "sigterm"
FRAGMENT = "fragment"
KINDS = (RUN, SIGTERM, FRAGMENT)


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    kind: str
    reason: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets() -> list[Snippet]:
    """Every ``python`` block of every page, in page order."""
    found: list[Snippet] = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.fullmatch(before.strip())
            kind, reason = RUN, ""
            if marker is not None:
                kind, reason = marker["kind"], marker["reason"] or ""
            found.append(Snippet(path, line, match.group(1), kind, reason))
    return found
