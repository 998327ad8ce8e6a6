"""Where a harness client spends its CPU, by area, from a py-spy sampling profile.

    bench/peers/.venv/bin/python bench/pyspy_breakdown.py rabbitry_async s4 [--n 50000]

Runs one harness scenario (``bench/peers/worker.py``; S4* queues are pre-filled first)
under ``py-spy record --gil --threads`` (samples that hold the GIL: CPU, not waits) and sorts every sample by the innermost
frame that belongs to a known area: rabbitry's codec (``rabbitry/protocol``: frame
parsing, method and property coding, publish encoding), the asyncio engine
(``rabbitry/aio``), the sync facade (``rabbitry/sync``), the asyncio library, socket
and selector calls, the benchmark's own client code, and the rest. The codec share is
the most a compiled helper for the codec could remove (docs/benchmarks.md). Needs
py-spy (``pip install py-spy``) and permission to trace a child process.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers")
sys.path.insert(0, PEERS)

from run_peers import PREFILLED, cleanup, prefill  # noqa: E402

AREAS = [
    ("codec (rabbitry/protocol)", re.compile(r"rabbitry/protocol/")),
    ("engine (rabbitry/aio)", re.compile(r"rabbitry/aio/")),
    ("sync facade (rabbitry/sync)", re.compile(r"rabbitry/sync/")),
    ("rabbitry other", re.compile(r"rabbitry/")),
    ("socket / selectors / threading", re.compile(r"(selectors|socket|threading|queue)\.py")),
    ("asyncio", re.compile(r"asyncio/")),
    ("uvloop", re.compile(r"uvloop")),
    ("benchmark client", re.compile(r"bench/peers/")),
]
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def classify(stack: str) -> tuple[str, str]:
    frames = [f for f in stack.split(";") if f]
    for frame in reversed(frames):  # innermost first
        m = FRAME.match(frame)
        where = m.group("file") if m else frame
        for name, pattern in AREAS:
            if pattern.search(where):
                return name, frame
    return "other", frames[-1] if frames else "?"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("client")
    ap.add_argument("scenario")
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    queue = f"pyspy.{uuid.uuid4().hex[:8]}"
    if args.scenario in PREFILLED:
        prefill(queue, args.n)
    out = tempfile.mktemp(suffix=".txt", prefix="pyspy-")
    pyspy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    cmd = [pyspy, "record", "--format", "raw", "--rate", str(args.rate), "--threads", "--gil",
           "--nonblocking", "-o", out, "--", sys.executable, "worker.py", args.client,
           args.scenario, queue, str(args.n)]
    try:
        subprocess.run(cmd, cwd=PEERS, check=True, capture_output=True, text=True)
    finally:
        cleanup(queue)
    areas: collections.Counter[str] = collections.Counter()
    leaves: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(out) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or "(idle)" in stack or "importlib" in stack:
                continue  # idle threads, and imports (start-up, outside the timed part)
            # drop py-spy's "thread (0x...)" / "process ..." prefixes
            stack = ";".join(p for p in stack.split(";") if not p.startswith(("thread ", "process ")))
            area, leaf = classify(stack)
            areas[area] += int(count)
            leaves[area][leaf] += int(count)
    os.unlink(out)
    total = sum(areas.values()) or 1
    print(f"{args.client} {args.scenario} n={args.n}: {total} samples at {args.rate}/s (busy only)")
    for area, count in areas.most_common():
        print(f"  {100 * count / total:5.1f} %  {area}")
    for area, count in areas.most_common():
        if count >= total / 10 or area.startswith("codec"):
            print(f"  {area}, innermost frames:")
            for leaf, count in leaves[area].most_common(args.top):
                print(f"    {100 * count / total:5.1f} %  {leaf}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
