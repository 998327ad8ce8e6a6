"""Write the generated section of docs/benchmarks.md from one harness run.

    bench/peers/.venv/bin/python bench/bench_report.py [RAW | --latest] [--doc docs/benchmarks.md]

``make bench`` calls it after ``run_peers.py`` with ``--latest`` (the newest
``bench/peers/results/*.raw``). Everything between the two markers below is replaced;
the hand-written rest of the page is kept. If the markers are missing, the section is
appended at the end with them.

The section has, for that one run: every client's msgs/s, client CPU µs per message and
broker CPU µs per message per scenario (medians of the repeats), then rabbitry's ratios
to the raw-socket limit and to the best peer library, the publisher and consumer rows
against the limit and against the channel-level API they are built on (CPU), the
sync/async CPU ratio, the async API targets, and uvloop against the default loop when
the run has it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "peers"))

from run_peers import LABELS, SCEN_TITLE, SCENARIOS, fmt_rate, fmt_us, summarize  # noqa: E402

BEGIN = "<!-- bench:generated -->"
END = "<!-- /bench:generated -->"

# Every rabbitry row (both APIs, the high-level rows, the reference builds): never a peer.
OURS = {c for c in LABELS if c.startswith("rabbitry_")}
# The high-level rows, each with the channel-level row of the same API.
HIGH_LEVEL = {
    "rabbitry_publisher": "rabbitry_async",
    "rabbitry_publisher_each": "rabbitry_async",
    "rabbitry_publisher_sync": "rabbitry_sync",
    "rabbitry_consumer": "rabbitry_async",
    "rabbitry_consumer_sync": "rabbitry_sync",
}
# Peer cells that do not do what the scenario asks (no pipelining) are left out of "best".
NOT_PIPELINED = {("amqpstorm_client", s) for s in ("s2b", "s3", "s6")} | {
    ("rabbitpy_client", s) for s in ("s2b", "s3", "s6")
}
TARGETS = {  # scenario: (min ratio to the limit, max client CPU µs/msg)
    "s1": (0.9, 8.0),
    "s2b": (0.9, 10.0),
    "s3": (0.9, None),
    "s4": (0.9, 12.0),
    "s4m": (0.9, None),
}


def load(path: str) -> tuple[list[dict], dict]:
    results, meta = [], {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "meta" in d:
                meta = d["meta"]
            else:
                results.append(d)
    return results, meta


def ok(cell: dict | None) -> bool:
    return cell is not None and "rate" in cell


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "–"


def best_peer(cells: dict, clients: list[str], scen: str) -> str | None:
    peers = [
        c
        for c in clients
        if c not in OURS and c != "raw" and ok(cells.get((c, scen))) and (c, scen) not in NOT_PIPELINED
    ]
    return max(peers, key=lambda c: cells[(c, scen)]["rate"]) if peers else None


def render(cells: dict, clients: list[str], scenarios: list[str], meta: dict, raw: str) -> str:
    out = [BEGIN, ""]
    out.append("## Latest `make bench` run (generated)")
    out.append("")
    out.append(
        # The raw file is named, but not as a path: bench/peers/results/ is git-ignored,
        # so it exists only on the machine that ran the benchmark.
        f"Written by `bench/bench_report.py` from run `{os.path.basename(raw)}` "
        f"({meta.get('date', '?')}, repeats: {meta.get('repeats', '?')}, medians, "
        f"{meta.get('elapsed_min', 0):.1f} min; Python {meta.get('python', '?')}, "
        f"RabbitMQ {meta.get('broker_version', '?')}, {meta.get('cpus', '?')} CPUs). "
        "Regenerate with `make bench`; edit the text outside the markers only. The machine "
        "may have been shared: the \"other cores\" column says how busy the rest of it was, "
        "and only ratios between cells of this one run are meaningful."
    )
    out.append("")
    for s in scenarios:
        rows = [c for c in clients if (c, s) in cells]
        if not rows:
            continue
        lat = s == "s5"
        out.append(f"### {SCEN_TITLE.get(s, s)}")
        out.append("")
        head = "| client | n | msgs/s | client CPU µs/msg | broker CPU µs/msg | other cores |"
        sep = "|---|---:|---:|---:|---:|---:|"
        if lat:
            head += " p50 µs | p99 µs |"
            sep += "---:|---:|"
        out += [head, sep]
        for c in rows:
            cell = cells[(c, s)]
            if not ok(cell):
                out.append(f"| {LABELS.get(c, c)} | | n/a ({cell.get('unsupported', '?')}) | | | |")
                continue
            row = (
                f"| {LABELS.get(c, c)} | {cell['n']} | {fmt_rate(cell['rate'])} | "
                f"{fmt_us(cell['cpu'])} | {fmt_us(cell['broker'])} | {cell['other']:.2f} |"
            )
            if lat:
                row += f" {cell.get('p50', float('nan')):.0f} | {cell.get('p99', float('nan')):.0f} |"
            out.append(row)
        out.append("")

    ours = [c for c in ("rabbitry_async", "rabbitry_sync", "rabbitry_async_uvloop") if c in clients]
    if ours:
        out.append("### rabbitry against the limit and the best peer")
        out.append("")
        out.append(
            "| scenario | client | msgs/s ÷ limit | best peer (msgs/s) | msgs/s ÷ best peer "
            "| CPU µs/msg | CPU ÷ best peer's |"
        )
        out.append("|---|---|---:|---|---:|---:|---:|")
        for s in scenarios:
            lim = cells.get(("raw", s))
            bp = best_peer(cells, clients, s)
            bpc = cells.get((bp, s)) if bp else None
            for c in ours:
                me = cells.get((c, s))
                if not ok(me):
                    continue
                out.append(
                    f"| {s.upper()} | {LABELS.get(c, c)} | "
                    f"{ratio(me['rate'], lim['rate']) if ok(lim) else '–'} | "
                    f"{(LABELS.get(bp, bp) + ' ' + fmt_rate(bpc['rate'])) if bpc else '–'} | "
                    f"{ratio(me['rate'], bpc['rate']) if bpc else '–'} | {fmt_us(me['cpu'])} | "
                    f"{ratio(me['cpu'], bpc['cpu']) if bpc else '–'} |"
                )
        out.append("")

    high = [c for c in HIGH_LEVEL if c in clients]
    if high:
        out.append("### rabbitry's publishers and consumers against the limit and the channel API")
        out.append("")
        out.append(
            "| scenario | client | msgs/s | msgs/s ÷ limit | CPU µs/msg | channel API CPU µs/msg "
            "| CPU ÷ channel API |"
        )
        out.append("|---|---|---:|---:|---:|---:|---:|")
        for s in scenarios:
            lim = cells.get(("raw", s))
            for c in high:
                me, base = cells.get((c, s)), cells.get((HIGH_LEVEL[c], s))
                if not ok(me):
                    continue
                out.append(
                    f"| {s.upper()} | {LABELS.get(c, c)} | {fmt_rate(me['rate'])} | "
                    f"{ratio(me['rate'], lim['rate']) if ok(lim) else '–'} | {fmt_us(me['cpu'])} | "
                    f"{fmt_us(base['cpu']) if ok(base) else '–'} | "
                    f"{ratio(me['cpu'], base['cpu']) if ok(base) else '–'} |"
                )
        out.append("")

    if "rabbitry_async" in clients and "rabbitry_sync" in clients:
        out.append("### Sync API CPU against the async API (target ≤ 1.3×)")
        out.append("")
        out.append("| scenario | async µs/msg | sync µs/msg | sync ÷ async | within 1.3× |")
        out.append("|---|---:|---:|---:|---|")
        for s in scenarios:
            a, y = cells.get(("rabbitry_async", s)), cells.get(("rabbitry_sync", s))
            if ok(a) and ok(y):
                r = y["cpu"] / a["cpu"] if a["cpu"] else float("nan")
                out.append(
                    f"| {s.upper()} | {fmt_us(a['cpu'])} | {fmt_us(y['cpu'])} | {r:.2f} | "
                    f"{'yes' if r <= 1.3 else 'no'} |"
                )
        out.append("")

    if "rabbitry_async_uvloop" in clients and "rabbitry_async" in clients:
        out.append("### uvloop against the default asyncio loop (same async client code)")
        out.append("")
        out.append("| scenario | asyncio msgs/s | uvloop msgs/s | asyncio µs/msg | uvloop µs/msg | uvloop CPU ÷ asyncio |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for s in scenarios:
            a, u = cells.get(("rabbitry_async", s)), cells.get(("rabbitry_async_uvloop", s))
            if ok(a) and ok(u):
                out.append(
                    f"| {s.upper()} | {fmt_rate(a['rate'])} | {fmt_rate(u['rate'])} | "
                    f"{fmt_us(a['cpu'])} | {fmt_us(u['cpu'])} | {ratio(u['cpu'], a['cpu'])} |"
                )
        out.append("")

    for ref, cur in (("rabbitry_async_ref", "rabbitry_async"), ("rabbitry_sync_ref", "rabbitry_sync")):
        if ref in clients and cur in clients:
            out.append(f"### {LABELS.get(cur, cur)}: this build against the reference build")
            out.append("")
            out.append("| scenario | reference µs/msg | this build µs/msg | this ÷ reference |")
            out.append("|---|---:|---:|---:|")
            for s in scenarios:
                a, b = cells.get((ref, s)), cells.get((cur, s))
                if ok(a) and ok(b):
                    out.append(
                        f"| {s.upper()} | {fmt_us(a['cpu'])} | {fmt_us(b['cpu'])} | {ratio(b['cpu'], a['cpu'])} |"
                    )
            out.append("")

    if "rabbitry_async" in clients:
        out.append("### Async API targets in this run")
        out.append("")
        out.append("| target | measured | met |")
        out.append("|---|---:|---|")
        for s, (min_ratio, max_cpu) in TARGETS.items():
            me, lim = cells.get(("rabbitry_async", s)), cells.get(("raw", s))
            if s == "s4":
                lim = cells.get(("raw", "s4m")) or lim  # S4's limit is the S4m limit
            if ok(me) and ok(lim):
                r = me["rate"] / lim["rate"]
                out.append(f"| {s.upper()} ≥ {min_ratio}× limit | {r:.2f}× | {'yes' if r >= min_ratio else 'no'} |")
            if ok(me) and max_cpu is not None:
                out.append(
                    f"| {s.upper()} ≤ {max_cpu:g} µs/msg | {fmt_us(me['cpu'])} | "
                    f"{'yes' if me['cpu'] <= max_cpu else 'no'} |"
                )
        me = cells.get(("rabbitry_async", "s5"))
        if ok(me) and "p50" in me:
            out.append(f"| S5 p50 ≤ 110 µs | {me['p50']:.0f} µs | {'yes' if me['p50'] <= 110 else 'no'} |")
        out.append("")
    out.append(END)
    return "\n".join(out) + "\n"


def update(doc: str, section: str) -> None:
    text = open(doc).read() if os.path.exists(doc) else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(doc, "w") as f:
        f.write(text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="?")
    ap.add_argument("--latest", action="store_true")
    ap.add_argument("--doc", default="docs/benchmarks.md")
    ap.add_argument("--print", action="store_true", help="print the section, do not write")
    args = ap.parse_args()
    raw = args.raw
    if args.latest or not raw:
        files = sorted(glob.glob(os.path.join(HERE, "peers", "results", "*.raw")), key=os.path.getmtime)
        if not files:
            raise SystemExit("no bench/peers/results/*.raw: run the harness first")
        raw = files[-1]
    results, meta = load(raw)
    clients = list(dict.fromkeys(r["client"] for r in results))
    scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in results)]
    cells = summarize(results, clients, scenarios)
    section = render(cells, clients, scenarios, meta, raw)
    if args.print:
        print(section)
    else:
        update(args.doc, section)
        print(f"updated {args.doc} from {os.path.relpath(raw)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
