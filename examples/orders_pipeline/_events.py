"""The generated event stream: realistic orders with known faults mixed in.

Pure Python (no Spark, no broker), deterministic for a given seed, so the test can
compute the exact outcome the pipeline must reach.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

__all__ = [
    "CATEGORIES",
    "FAULT_HEADER",
    "RATES_TO_EUR",
    "Event",
    "EventPlan",
    "Mix",
    "generate",
]

#: Header the generator sets on orders whose enrichment fails on purpose (fault
#: injection, as chaos tests do): ``transient`` fails on the first attempt only,
#: ``poison`` on every attempt.
FAULT_HEADER = "x-demo-fault"

#: The "rate service" of the enrichment step: EUR per unit of each currency.
RATES_TO_EUR: dict[str, float] = {
    "EUR": 1.0,
    "USD": 0.92,
    "GBP": 1.16,
    "CHF": 1.05,
    "SEK": 0.087,
    "JPY": 0.0061,
}

CATEGORIES = ("books", "electronics", "garden", "grocery", "toys", "fashion")

Kind = Literal["ok", "malformed", "invalid", "transient", "poison", "unroutable"]


@dataclass(frozen=True)
class Mix:
    """Which share of the events (in percent) carries which fault."""

    malformed: float = 1.0
    invalid: float = 2.0
    transient: float = 2.0
    poison: float = 0.5
    unroutable: float = 0.5
    duplicates: float = 2.0


@dataclass(frozen=True)
class Event:
    """One message to publish.

    Attributes:
        message_id: the AMQP ``message_id`` (a duplicate repeats its original's).
        routing_key: ``order.created.<category>``; unroutable events use a key no queue
            is bound to (``legacy.order.<category>``).
        body: the JSON payload (not JSON at all for ``malformed``).
        kind: the fault it carries (``ok`` for a clean order).
        fault: the value of :data:`FAULT_HEADER`, if any.
        duplicate: a deliberate second copy of an earlier event.
        amount_eur: the order's value in EUR (``ok`` and ``transient`` orders only).
        category: the order's category.
        minute: the event-time minute (UTC) of the order.
        customer: the customer id (``c-01234``), the natural key a partitioned run
            routes by (:mod:`orders_pipeline._partitions`); known for every event, also
            when its body is not JSON.
    """

    message_id: str
    routing_key: str
    body: bytes
    kind: Kind
    fault: str | None = None
    duplicate: bool = False
    amount_eur: float | None = None
    category: str | None = None
    minute: datetime | None = None
    customer: str = ""


@dataclass
class EventPlan:
    """The generated events and the outcome a correct pipeline reaches."""

    events: list[Event]
    kinds: Counter[str] = field(default_factory=Counter)

    @property
    def unique(self) -> list[Event]:
        """The events without the deliberate duplicates."""
        return [e for e in self.events if not e.duplicate]

    @property
    def duplicates(self) -> int:
        return sum(1 for e in self.events if e.duplicate)

    @property
    def unroutable(self) -> int:
        return sum(1 for e in self.events if e.kind == "unroutable")

    @property
    def valid_ids(self) -> set[str]:
        """Orders that must be aggregated once each (clean ones and transient ones)."""
        return {e.message_id for e in self.unique if e.kind in ("ok", "transient")}

    @property
    def parked_ids(self) -> set[str]:
        """Messages that must end in the parking lot once each."""
        return {e.message_id for e in self.unique if e.kind in ("malformed", "invalid", "poison")}

    def revenue(self) -> dict[tuple[datetime, str], tuple[float, int]]:
        """Expected (EUR total, order count) per (minute, category)."""
        totals: dict[tuple[datetime, str], tuple[float, int]] = {}
        for event in self.unique:
            if event.kind in ("ok", "transient"):
                assert event.minute is not None and event.category is not None
                assert event.amount_eur is not None
                key = (event.minute, event.category)
                amount, count = totals.get(key, (0.0, 0))
                totals[key] = (amount + event.amount_eur, count + 1)
        return totals


def _invalid(rng: random.Random, order: dict[str, object]) -> None:
    choice = rng.randrange(4)
    if choice == 0:
        order["amount"] = -round(rng.uniform(1, 200), 2)
    elif choice == 1:
        order["currency"] = rng.choice(["XXX", "BTC", "eur", ""])
    elif choice == 2:
        del order["category"]
    else:
        order["ts"] = "yesterday"


def _malformed(rng: random.Random, text: str) -> bytes:
    choice = rng.randrange(3)
    if choice == 0:
        return text[: rng.randrange(5, len(text) - 5)].encode()  # truncated
    if choice == 1:
        return text.replace(":", "=", 1).encode()  # not JSON syntax
    return b"\x00\xff" + text.encode()[:20]  # binary garbage


def generate(
    count: int,
    *,
    run_id: str,
    seed: int = 7,
    mix: Mix | None = None,
    start: datetime | None = None,
    span_minutes: int = 60,
) -> EventPlan:
    """``count`` order events (duplicates included) over ``span_minutes`` of event time.

    Message ids are ``<run_id>-<n>``; a duplicate is re-published a little later in the
    stream with its original's id, body and headers (what a producer that retries after
    a lost confirm does).
    """
    mix = mix or Mix()
    rng = random.Random(seed)
    start = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    span = timedelta(minutes=span_minutes)
    events: list[Event] = []
    kinds: Counter[str] = Counter()
    thresholds: list[tuple[float, Kind]] = []
    edge = 0.0
    shares: list[tuple[float, Kind]] = [
        (mix.malformed, "malformed"),
        (mix.invalid, "invalid"),
        (mix.transient, "transient"),
        (mix.poison, "poison"),
        (mix.unroutable, "unroutable"),
    ]
    for share, faulty in shares:
        edge += share / 100
        thresholds.append((edge, faulty))
    n = 0
    while len(events) < count:
        previous = [e for e in events[-200:] if e.kind != "unroutable" and not e.duplicate]
        if previous and rng.random() < mix.duplicates / 100:
            original = rng.choice(previous)
            events.append(
                Event(
                    original.message_id,
                    original.routing_key,
                    original.body,
                    original.kind,
                    original.fault,
                    True,
                    original.amount_eur,
                    original.category,
                    original.minute,
                    original.customer,
                )
            )
            kinds["duplicate"] += 1
            continue
        roll = rng.random()
        kind: Kind = next((k for edge, k in thresholds if roll < edge), "ok")
        ts = start + span * (n / max(count, 1)) + timedelta(milliseconds=rng.randrange(1000))
        category = rng.choice(CATEGORIES)
        currency = rng.choices(list(RATES_TO_EUR), weights=[50, 25, 10, 5, 5, 5])[0]
        amount = round(rng.lognormvariate(3.5, 0.8), 2)
        customer = f"c-{rng.randrange(5000):05d}"
        order: dict[str, object] = {
            "order_id": f"o-{n:07d}",
            "customer": customer,
            "category": category,
            "amount": amount,
            "currency": currency,
            "items": rng.randint(1, 5),
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
        message_id = f"{run_id}-{n:07d}"
        fault = kind if kind in ("transient", "poison") else None
        if kind == "invalid":
            _invalid(rng, order)
        text = json.dumps(order, separators=(",", ":"))
        body = _malformed(rng, text) if kind == "malformed" else text.encode()
        routing_key = f"{'legacy.order' if kind == 'unroutable' else 'order.created'}.{category}"
        valid = kind in ("ok", "transient")
        events.append(
            Event(
                message_id,
                routing_key,
                body,
                kind,
                fault,
                False,
                amount * RATES_TO_EUR[currency] if valid else None,
                category,
                ts.replace(second=0, microsecond=0) if valid else None,
                customer,
            )
        )
        kinds[kind] += 1
        n += 1
    return EventPlan(events, kinds)
