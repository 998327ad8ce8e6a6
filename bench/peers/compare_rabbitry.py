"""Print the rabbitry-centred tables of docs/benchmarks.md from one results/*.raw file.

usage: compare_rabbitry.py results/<timestamp>.raw

Reads the JSON lines run_peers.py wrote and prints markdown: every client and
scenario (msgs/s, client CPU, broker CPU, other cores), rabbitry against the raw
limit and the best peer, sync against async CPU, and the targets. Medians when a
cell has several repeats. Nothing is measured here.
"""
from __future__ import annotations

import json
import statistics
import sys

from run_peers import LABELS, SCEN_TITLE

RABBITRY = ("rabbitry_async", "rabbitry_sync")
SCENARIOS = ["s1", "s2a", "s2b", "s3", "s4", "s4m", "s5"]
PIPELINED = {"s2b", "s3"}


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
    out = {}
    keys = ("msgs_per_s", "cpu_us_per_msg", "broker_cpu_us_per_msg", "other_cores",
            "lat_p50_us", "lat_p99_us")
    by = {}
    for r in results:
        if "msgs_per_s" in r:
            by.setdefault((r["client"], r["scenario"]), []).append(r)
        elif "unsupported" in r or "error" in r:
            out[(r["client"], r["scenario"])] = {"na": r.get("unsupported") or r.get("error")}
    for k, rs in by.items():
        c = {key: statistics.median(r[key] for r in rs) for key in keys if key in rs[0]}
        c["n"] = rs[0]["n"]
        c["runs"] = len(rs)
        c["sync_only"] = any("cannot pipeline" in x for r in rs for x in r.get("notes", []))
        out[k] = c
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
    peers = [c for c in clients if c != "raw" and not c.startswith("rabbitry_")]
    scens = [s for s in SCENARIOS if any(k[1] == s for k in cs)]

    if meta:
        print(f"meta: {json.dumps(meta)}\n")
    for s in scens:
        print(f"### {SCEN_TITLE[s]}\n")
        lat = s == "s5"
        print("| client | n | msgs/s | client CPU µs/msg | broker CPU µs/msg | other cores |"
              + (" p50 µs | p99 µs |" if lat else ""))
        print("|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if lat else ""))
        for c in clients:
            cell = cs.get((c, s))
            if cell is None:
                continue
            if "na" in cell:
                print(f"| {LABELS[c]} | | n/a | | | |" + (" | |" if lat else ""))
                continue
            tag = " (sync, not pipelined)" if cell["sync_only"] else ""
            row = (f"| {LABELS[c]} | {cell['n']} | {f_rate(cell['msgs_per_s'])}{tag} | "
                   f"{f_us(cell['cpu_us_per_msg'])} | {f_us(cell['broker_cpu_us_per_msg'])} | "
                   f"{cell['other_cores']:.2f} |")
            if lat:
                row += f" {cell['lat_p50_us']:.0f} | {cell['lat_p99_us']:.0f} |"
            print(row)
        print()

    print("### Ratios\n")
    print("| scenario | async msgs/s ÷ limit | sync msgs/s ÷ limit | best peer (msgs/s) "
          "| async ÷ best peer msgs/s | sync ÷ best peer msgs/s | lowest-CPU peer (µs/msg) "
          "| async ÷ that CPU | sync ÷ that CPU |")
    print("|---|---:|---:|---|---:|---:|---|---:|---:|")
    for s in scens:
        lim = cs.get(("raw", s), {})
        a = cs.get(("rabbitry_async", s), {})
        y = cs.get(("rabbitry_sync", s), {})
        ok = [(c, cs[(c, s)]) for c in peers if (c, s) in cs and "na" not in cs[(c, s)]
              and not (s in PIPELINED and cs[(c, s)]["sync_only"])]
        if not ok or "msgs_per_s" not in lim:
            continue
        bp, bpc = max(ok, key=lambda x: x[1]["msgs_per_s"])
        cp, cpc = min(ok, key=lambda x: x[1]["cpu_us_per_msg"])

        def r(x, y_, key):
            return f"{x[key] / y_[key]:.2f}" if key in x and key in y_ else "–"

        print(f"| {s.upper()} | {r(a, lim, 'msgs_per_s')} | {r(y, lim, 'msgs_per_s')} | "
              f"{LABELS[bp]} {f_rate(bpc['msgs_per_s'])} | {r(a, bpc, 'msgs_per_s')} | "
              f"{r(y, bpc, 'msgs_per_s')} | {LABELS[cp]} {f_us(cpc['cpu_us_per_msg'])} | "
              f"{r(a, cpc, 'cpu_us_per_msg')} | {r(y, cpc, 'cpu_us_per_msg')} |")
    print()

    print("### Sync vs async (client CPU µs/msg)\n")
    print("| scenario | async | sync | sync ÷ async | within 1.3x |")
    print("|---|---:|---:|---:|---|")
    for s in scens:
        a = cs.get(("rabbitry_async", s), {})
        y = cs.get(("rabbitry_sync", s), {})
        if "cpu_us_per_msg" in a and "cpu_us_per_msg" in y:
            q = y["cpu_us_per_msg"] / a["cpu_us_per_msg"]
            print(f"| {s.upper()} | {f_us(a['cpu_us_per_msg'])} | {f_us(y['cpu_us_per_msg'])} | "
                  f"{q:.2f} | {'yes' if q <= 1.3 else 'no'} |")
    print()

    print("### Targets\n")
    print("| target | async | met | sync | met |")
    print("|---|---:|---|---:|---|")

    def tp(s, frac, cpu_max):
        lim = cs.get(("raw", s), {}).get("msgs_per_s")
        for key, what in (("msgs_per_s", f"{s.upper()} ≥ {frac}× limit"),
                          ("cpu_us_per_msg", f"{s.upper()} ≤ {cpu_max} µs CPU/msg")):
            vals = []
            for c in RABBITRY:
                v = cs.get((c, s), {}).get(key)
                if v is None:
                    vals += ["–", "–"]
                elif key == "msgs_per_s":
                    if lim:
                        vals += [f"{v / lim:.2f}× ({f_rate(v)} vs {f_rate(lim)})",
                                 "yes" if v >= frac * lim else "no"]
                    else:
                        vals += ["–", "–"]
                else:
                    vals += [f_us(v), "yes" if v <= cpu_max else "no"]
            print(f"| {what} | " + " | ".join(vals) + " |")

    tp("s1", 0.9, 8)
    tp("s2b", 0.9, 10)
    vals = []
    for c in RABBITRY:
        v = cs.get((c, "s4"), {}).get("cpu_us_per_msg")
        vals += ([f_us(v), "yes" if v <= 12 else "no"] if v is not None else ["–", "–"])
    print("| S4 ≤ 12 µs CPU/msg | " + " | ".join(vals) + " |")
    vals = []
    for c in RABBITRY:
        v = cs.get((c, "s5"), {}).get("lat_p50_us")
        vals += ([f"{v:.0f} µs", "yes" if v <= 110 else "no"] if v is not None else ["–", "–"])
    print("| S5 p50 ≤ 110 µs | " + " | ".join(vals) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
