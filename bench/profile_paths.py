"""Print where the Python calls of each hot path go (the budget test's measurement).

    PYTHONPATH=src .venv/bin/python bench/profile_paths.py [path ...] [--n 2000] [--top 25]

Paths: async.publish, async.publish_confirm, async.publish_batch, async.consume_ack and
the same with ``sync.``; async.publisher_each, async.consumer_handler and
sync.consumer_handler. Needs the broker at RABBITMQ_URL (default localhost). Counts are
calls per message over the measured phase, summed over every thread involved.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from integration.perf_paths import PATHS, measure  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="*", default=PATHS)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    for path in args.paths:
        m = measure(path, url, f"rabbitry-profile-{uuid.uuid4().hex[:8]}", n=args.n)
        print(
            f"\n{path}: {m.calls_per_msg:.1f} calls/msg, "
            f"{m.retained_bytes_per_msg:.1f} retained bytes/msg"
        )
        for name, per_msg in m.top(args.top):
            print(f"  {per_msg:7.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
