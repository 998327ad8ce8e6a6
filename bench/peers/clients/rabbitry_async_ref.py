"""rabbitry_async on the reference build in BENCH_RABBITRY_REF (see _ref.py)."""
from __future__ import annotations

from clients import _ref

if _ref.activate():
    from clients.rabbitry_async import s1, s2a, s2b, s3, s4, s4m, s5, s6  # noqa: F401
else:
    __getattr__ = _ref.missing
