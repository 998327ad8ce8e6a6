"""rabbitry_async with uvloop's event loop (the optional ``uvloop`` extra).

Same scenario code as ``rabbitry_async.py``; only the loop differs: every
``asyncio.run`` of that module runs on uvloop once the policy is installed.
"""
from __future__ import annotations

import asyncio

try:
    import uvloop
except ImportError:  # the bench venv has it; report instead of failing the run
    uvloop = None

from common import NotSupported

if uvloop is not None:
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    from clients.rabbitry_async import s1, s2a, s2b, s3, s4, s4m, s5, s6  # noqa: F401
else:
    def __getattr__(name: str):
        if not name.startswith("s"):
            raise AttributeError(name)

        def unsupported(ctx) -> None:
            raise NotSupported("uvloop is not installed")

        return unsupported
