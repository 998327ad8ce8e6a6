"""Print the "Publisher" tables of docs/benchmarks.md from one results/*.raw file.

usage: compare_publisher.py results/<timestamp>.raw

For the publishing scenarios (S1 no confirms, S2b pipelined confirms, S3 persistent +
confirms, S6 batches of 1000 + confirms): every client's msgs/s and client CPU µs/msg,
then rabbitry's Publisher against the raw limit, against the best peer, and against
rabbitry's own channel-level API. Medians when a cell has several repeats. Nothing is
measured here.
"""
from __future__ import annotations

import json
import statistics
import sys

from run_peers import LABELS, SCEN_TITLE

SCENARIOS = ["s1", "s2b", "s3", "s6"]
PUBLISHERS = {
    "rabbitry_publisher": "rabbitry_async",
    "rabbitry_publisher_each": "rabbitry_async",
    "rabbitry_publisher_sync": "rabbitry_sync",
}
OURS = {"raw", *(c for c in LABELS if c.startswith("rabbitry_"))}


def load(path: str):
    results, meta = [], None
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "meta" in d:
                meta = d["meta"]
            else:
                results.append(d)
    return results, meta


def cells(results):
    by, out = {}, {}
    for r in results:
        key = (r["client"], r["scenario"])
        if "msgs_per_s" in r:
            by.setdefault(key, []).append(r)
        else:
            out[key] = {"na": r.get("unsupported") or r.get("error")}
    for key, rs in by.items():
        out[key] = {
            k: statistics.median(r[k] for r in rs)
            for k in ("msgs_per_s", "cpu_us_per_msg", "broker_cpu_us_per_msg", "other_cores")
        }
        out[key]["n"] = rs[0]["n"]
        out[key]["sync_only"] = any("cannot pipeline" in x for r in rs for x in r.get("notes", []))
    return out


def f_rate(v):
    return f"{v / 1000:.1f}k" if v >= 10_000 else (f"{v / 1000:.2f}k" if v >= 1000 else f"{v:.0f}")


def f_us(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def main() -> int:
    results, meta = load(sys.argv[1])
    cs = cells(results)
    clients = []
    for r in results:
        if r["client"] not in clients:
            clients.append(r["client"])
    peers = [c for c in clients if c not in OURS]
    scens = [s for s in SCENARIOS if any(k[1] == s for k in cs)]
    if meta:
        print(f"meta: {json.dumps(meta)}\n")

    for s in scens:
        print(f"### {SCEN_TITLE[s]}\n")
        print("| client | n | msgs/s | client CPU µs/msg | broker CPU µs/msg | other cores |")
        print("|---|---:|---:|---:|---:|---:|")
        for c in clients:
            cell = cs.get((c, s))
            if cell is None:
                continue
            if "na" in cell:
                print(f"| {LABELS[c]} | | n/a | | | |")
                continue
            tag = " (sync, not pipelined)" if cell["sync_only"] else ""
            print(f"| {LABELS[c]} | {cell['n']} | {f_rate(cell['msgs_per_s'])}{tag} | "
                  f"{f_us(cell['cpu_us_per_msg'])} | {f_us(cell['broker_cpu_us_per_msg'])} | "
                  f"{cell['other_cores']:.2f} |")
        print()

    print("### Publisher ratios\n")
    print("| scenario | API | msgs/s ÷ limit | best peer (msgs/s) | ÷ best peer msgs/s "
          "| lowest-CPU peer (µs/msg) | CPU ÷ that peer | CPU ÷ channel API |")
    print("|---|---|---:|---|---:|---|---:|---:|")
    for s in scens:
        lim = cs.get(("raw", s), {})
        ok = [(c, cs[(c, s)]) for c in peers
              if (c, s) in cs and "na" not in cs[(c, s)] and not cs[(c, s)]["sync_only"]]
        for pub, channel_api in PUBLISHERS.items():
            me = cs.get((pub, s), {})
            if "msgs_per_s" not in me:
                continue
            base = cs.get((channel_api, s), {})

            def r(a, b, key):
                return f"{a[key] / b[key]:.2f}" if key in a and key in b and b[key] else "–"

            if ok:
                bp, bpc = max(ok, key=lambda x: x[1]["msgs_per_s"])
                cp, cpc = min(ok, key=lambda x: x[1]["cpu_us_per_msg"])
                best = f"{LABELS[bp]} {f_rate(bpc['msgs_per_s'])}"
                low = f"{LABELS[cp]} {f_us(cpc['cpu_us_per_msg'])}"
            else:
                bpc = cpc = {}
                best = low = "–"
            print(f"| {s.upper()} | {LABELS[pub]} | {r(me, lim, 'msgs_per_s')} | {best} | "
                  f"{r(me, bpc, 'msgs_per_s')} | {low} | {r(me, cpc, 'cpu_us_per_msg')} | "
                  f"{r(me, base, 'cpu_us_per_msg')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
