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
sync/async CPU ratio, uvloop against the default loop when the run has it, and the
goals table: each performance goal with its measured value or ratio and whether it is
met, computed from the cells of the run ("not measured" when a cell it needs is
missing):

1. S5 round trip: async msgs/s ≥ 0.85× raw, async p50 ≤ 1.15× raw p50, sync msgs/s
   ≥ 0.75× raw, client CPU per round trip ≤ 25 µs (async) and ≤ 35 µs (sync).
2. Sync client CPU ≤ 1.3× async in every scenario that has both.
3. The high-level rows (PARTS) within 1.2× the CPU of the channel-level row of the
   same API: the publishers on S1 and S2b, the consumers on S4 and S4m.
4. The same rows at ≥ 3× less client CPU per message than pika SelectConnection.
5. Both APIs at ≥ 0.9× the raw row's msgs/s of the same scenario in S1, S2b, S3, S4
   and S4m.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable

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
PIKA = "pika_select"  # goal 4's reference peer


class Part(NamedTuple):
    """A high-level row of goals 3 and 4 and the channel-level client of the same API."""

    label: str
    clients: dict[str, tuple[str, ...]]  # scenario: clients, the first with a cell is used
    base: str


PARTS = (
    Part(
        "AsyncPublisher (future each)",
        {
            "s1": ("rabbitry_publisher_each", "rabbitry_publisher"),  # "each" has no S1
            "s2b": ("rabbitry_publisher_each",),
        },
        "rabbitry_async",
    ),
    Part(
        "Publisher (sync)",
        {"s1": ("rabbitry_publisher_sync",), "s2b": ("rabbitry_publisher_sync",)},
        "rabbitry_sync",
    ),
    Part(
        "AsyncConsumer",
        {"s4": ("rabbitry_consumer",), "s4m": ("rabbitry_consumer",)},
        "rabbitry_async",
    ),
    Part(
        "Consumer (sync handler)",
        {"s4": ("rabbitry_consumer_sync",), "s4m": ("rabbitry_consumer_sync",)},
        "rabbitry_sync",
    ),
)
API = {"rabbitry_async": "async", "rabbitry_sync": "sync"}
THROUGHPUT = ("s1", "s2b", "s3", "s4", "s4m")  # goal 5: both APIs at 0.9× the raw cell
SYNC_CPU_MAX = 1.3  # goal 2: sync ÷ async client CPU, every scenario


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


Cell = dict[str, Any]
Cells = dict[tuple[str, str], Cell]
# A row of the goals table: goal number, goal, measured, the cells it is from, met.
GoalRow = tuple[str, str, str, str, str]
FMT: dict[str, Callable[[float], str]] = {
    "rate": fmt_rate,
    "cpu": fmt_us,
    "p50": lambda v: f"{v:.0f}",
}
UNIT = {"rate": "msgs/s", "cpu": "µs", "p50": "µs"}


class Side(NamedTuple):
    """A cell a goal reads: the client (the names tried when none ran) and its medians."""

    name: str
    cell: Cell | None


def side(cells: Cells, scen: str, *clients: str) -> Side:
    """The first of clients with a measured cell in scen."""
    for c in clients:
        cell = cells.get((c, scen))
        if ok(cell):
            return Side(c, cell)
    return Side(" / ".join(clients), None)


def value(s: Side, key: str) -> float | None:
    v = s.cell.get(key) if s.cell else None
    return None if v is None or v != v else float(v)


def missing(key: str, *sides: Side) -> str:
    """Why a goal on these cells is not measured."""
    why = []
    for s in sides:
        if s.cell is None:
            why.append(f"no {s.name} cell")
        elif value(s, key) is None:
            why.append(f"no {key} in {s.name}")
    return "; ".join(why) or f"{sides[-1].name} {key} is 0"


def yes(met: bool) -> str:
    return "yes" if met else "no"


def ratio_goal(
    num: str, goal: str, top: Side, bottom: Side, key: str, bound: float, at_most: bool
) -> GoalRow:
    """top's key ÷ bottom's, at most (or at least) bound."""
    a, b = value(top, key), value(bottom, key)
    if a is None or not b:
        return (num, goal, missing(key, top, bottom), "", "not measured")
    r = a / b
    fmt = FMT[key]
    src = f"{top.name} {fmt(a)} ÷ {bottom.name} {fmt(b)} {UNIT[key]}"
    return (num, goal, f"{r:.2f}×", src, yes(r <= bound if at_most else r >= bound))


def max_goal(num: str, goal: str, s: Side, key: str, bound: float) -> GoalRow:
    v = value(s, key)
    if v is None:
        return (num, goal, missing(key, s), "", "not measured")
    return (num, goal, f"{FMT[key](v)} {UNIT[key]}", s.name, yes(v <= bound))


def s5_goals(cells: Cells) -> list[GoalRow]:
    raw, a, y = (side(cells, "s5", c) for c in ("raw", "rabbitry_async", "rabbitry_sync"))
    return [
        ratio_goal("1", "S5 async msgs/s ≥ 0.85× raw", a, raw, "rate", 0.85, at_most=False),
        ratio_goal("1", "S5 async p50 ≤ 1.15× raw p50", a, raw, "p50", 1.15, at_most=True),
        ratio_goal("1", "S5 sync msgs/s ≥ 0.75× raw", y, raw, "rate", 0.75, at_most=False),
        max_goal("1", "S5 async client CPU ≤ 25 µs per round trip", a, "cpu", 25.0),
        max_goal("1", "S5 sync client CPU ≤ 35 µs per round trip", y, "cpu", 35.0),
    ]


def sync_cpu_goal(cells: Cells, scenarios: list[str]) -> GoalRow:
    """One row for every scenario with both APIs: the worst ratio and the ones over."""
    goal = f"sync ≤ {SYNC_CPU_MAX}× async client CPU, every scenario"
    ratios: dict[str, float] = {}
    for s in scenarios:
        a = value(side(cells, s, "rabbitry_async"), "cpu")
        y = value(side(cells, s, "rabbitry_sync"), "cpu")
        if a and y is not None:
            ratios[s.upper()] = y / a
    if not ratios:
        return ("2", goal, "no scenario with both APIs", "", "not measured")
    worst = max(ratios, key=lambda s: ratios[s])
    over = [s for s, r in ratios.items() if r > SYNC_CPU_MAX]
    src = f"over in {', '.join(over)}" if over else "none over"
    src += f" (of {len(ratios)} scenarios: sync ÷ async table)"
    return ("2", goal, f"max {ratios[worst]:.2f}× ({worst})", src, yes(not over))


def part_goals(cells: Cells) -> list[GoalRow]:
    """Goal 3: each high-level row within 1.2× the CPU of its API's channel-level row."""
    rows = []
    for part in PARTS:
        for scen, clients in part.clients.items():
            me, base = side(cells, scen, *clients), side(cells, scen, part.base)
            goal = f"{scen.upper()} {part.label} CPU ≤ 1.2× {API[part.base]} channel API"
            rows.append(ratio_goal("3", goal, me, base, "cpu", 1.2, at_most=True))
    return rows


def pika_goals(cells: Cells) -> list[GoalRow]:
    """Goal 4: pika's client CPU per message at least 3× each high-level row's."""
    rows = []
    for part in PARTS:
        for scen, clients in part.clients.items():
            me, pika = side(cells, scen, *clients), side(cells, scen, PIKA)
            goal = f"{scen.upper()} {part.label}: pika CPU ≥ 3× its CPU"
            rows.append(ratio_goal("4", goal, pika, me, "cpu", 3.0, at_most=False))
    return rows


def throughput_goals(cells: Cells) -> list[GoalRow]:
    """Goal 5: both APIs at 0.9× the raw cell of the same scenario (never another's)."""
    rows = []
    for scen in THROUGHPUT:
        raw = side(cells, scen, "raw")
        for client, api in API.items():
            me = side(cells, scen, client)
            goal = f"{scen.upper()} {api} msgs/s ≥ 0.9× raw"
            rows.append(ratio_goal("5", goal, me, raw, "rate", 0.9, at_most=False))
    return rows


def goals_section(cells: Cells, scenarios: list[str]) -> list[str]:
    rows = [
        *s5_goals(cells),
        sync_cpu_goal(cells, scenarios),
        *part_goals(cells),
        *pika_goals(cells),
        *throughput_goals(cells),
    ]
    return [
        "### Goals in this run",
        "",
        "Each ratio is computed from the medians of this run's cells above. A goal whose",
        'cells are missing from the run is "not measured". Goal 4\'s reference peer is',
        "pika SelectConnection (`pika_select`): its client CPU per message ÷ rabbitry's.",
        "",
        "| # | goal | measured | from the cells | met |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


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
        out.append("### Sync API CPU against the async API (goal: ≤ 1.3×)")
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

    out += goals_section(cells, scenarios)
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
