"""What fires now: the alert pack's engine and target rules judged over the warehouse with the
pack's thresholds (warehouse/alerts.py), for every page's banner."""

from __future__ import annotations

from datetime import datetime, timedelta

from warehouse.alerts import NIXL_MINUTES, AlertRules, Firing, evaluate_engines, signals_minutes
from warehouse.read import Query, run

RULES = AlertRules()


def firing(q: Query, latest: datetime, rules: AlertRules = RULES) -> list[Firing]:
    """The rules that fire at the latest scrape `latest` (inclusive)."""
    end = latest + timedelta(microseconds=1)  # the statements take [start, end): the latest scrape is in
    start = latest - timedelta(minutes=signals_minutes(rules))
    window = {"start": start, "end": end}
    nixl = run(q, "nixl_faults", {"start": latest - timedelta(minutes=NIXL_MINUTES), "end": latest})
    return evaluate_engines(rules, run(q, "engine_signals", window), nixl, run(q, "scrape_runs", window))


def banner(fired: list[Firing], shown: int = 6) -> str:
    """One line per firing alert (the first `shown`), then how many more."""
    lines = [
        f"**{f.rule}** {f.subject}: {f.message}" + (f" (since {f.since:%H:%M:%S} UTC)" if f.since is not None else "")
        for f in fired[:shown]
    ]
    if len(fired) > shown:
        lines.append(f"... and {len(fired) - shown} more")
    head = f"{len(fired)} alert{'s' if len(fired) != 1 else ''} firing (the alert pack's thresholds, judged on the warehouse):"
    return "\n".join([head, *(f"- {line}" for line in lines)])
