"""Load a client module against a reference build of rabbitry (before/after runs).

``BENCH_RABBITRY_REF`` names a directory holding another version's ``rabbitry``
package (e.g. ``git archive <commit> src | tar -x -C /tmp/ref``, then
``/tmp/ref/src``). It goes first on ``sys.path`` before rabbitry is imported, so the
same scenario code runs on both builds in one harness run. Without it the scenarios
report "not supported".
"""
from __future__ import annotations

import os
import sys

from common import NotSupported

REF = os.environ.get("BENCH_RABBITRY_REF")


def activate() -> bool:
    if not REF:
        return False
    if "rabbitry" in sys.modules:
        raise RuntimeError("rabbitry was imported before the reference build was selected")
    sys.path.insert(0, REF)
    return True


def missing(name: str):
    if not name.startswith("s"):
        raise AttributeError(name)

    def unsupported(ctx) -> None:
        raise NotSupported("set BENCH_RABBITRY_REF to a reference build's src directory")

    return unsupported
