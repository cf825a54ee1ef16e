"""What fires now: the alert pack's engine, pool, target, SLO and cost rules judged over the
warehouse with the pack's thresholds (warehouse/alerts.py), for every page's banner."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from warehouse.alerts import (
    BURN_LOOKBACK_MINUTES,
    NIXL_MINUTES,
    POOL_RETIRED_HOURS,
    AlertRules,
    Firing,
    Objective,
    cost_lookback_minutes,
    evaluate_absent,
    evaluate_burn,
    evaluate_cost,
    evaluate_engines,
    signals_minutes,
)
from warehouse.cost import pool_tokens, price_sheet, stored_pools
from warehouse.goodput import NoSloSheet, stored_sheet
from warehouse.read import EPOCH, Query, floor, run
from warehouse.rollup import SLO_MINUTES
from warehouse.slo import slo_params

RULES = AlertRules()


def firing(q: Query, latest: datetime, rules: AlertRules = RULES) -> list[Firing]:
    """The rules that fire at the latest scrape `latest` (inclusive)."""
    end = latest + timedelta(microseconds=1)  # the statements take [start, end): the latest scrape is in
    start = latest - timedelta(minutes=signals_minutes(rules))
    window = {"start": start, "end": end}
    nixl = run(q, "nixl_faults", {"start": latest - timedelta(minutes=NIXL_MINUTES), "end": latest})
    fired = evaluate_engines(rules, run(q, "engine_signals", window), nixl, run(q, "scrape_runs", window))
    last = run(q, "pools_last_scraped", {"start": latest - timedelta(hours=POOL_RETIRED_HOURS), "end": end})
    absent = evaluate_absent(rules, last, pd.Timestamp(latest))
    return fired + absent + burning(q, latest, rules) + cost_spikes(q, latest, rules)


def burning(q: Query, latest: datetime, rules: AlertRules = RULES) -> list[Firing]:
    """The SLO classes whose error budget burns too fast at `latest`'s whole minute: from the
    per-minute SLO counts (requests_slo_1m) and the records stored since they were rolled up."""
    try:
        sheet = stored_sheet(q)
    except NoSloSheet:
        return []
    classes = {name: Objective(c.objective, c.period_days) for name, c in sheet.classes_at(latest).items()}
    minute = timedelta(minutes=1)
    until = floor(latest, minute)  # judged on whole minutes, up to the latest scrape's
    rolled = run(q, "rollup_through", {"name": SLO_MINUTES})["through"].iloc[0]
    params = {
        "since": until - timedelta(minutes=BURN_LOOKBACK_MINUTES),
        "until": until,
        # the records the roll-up has not counted yet (all of them before it ever ran)
        "ingested_from": EPOCH if pd.isna(rolled) else pd.Timestamp(rolled).to_pydatetime(),
        "ingested_until": None,
        "finished_from": until - timedelta(minutes=BURN_LOOKBACK_MINUTES),
        "finished_until": until,
        **slo_params(None, None),
    }
    return evaluate_burn(rules, run(q, "slo_burn", params), classes, pd.Timestamp(until))


def cost_spikes(q: Query, latest: datetime, rules: AlertRules = RULES) -> list[Firing]:
    """The pools whose $/M tokens over the last hour spiked against their 24 hours, at `latest`:
    each pool's tokens per minute (docs/definitions.md, Tokens) and its GPUs' cost in that minute at
    the price sheet's GPU-hour price then."""
    minute = timedelta(minutes=1)
    end = floor(latest, minute)
    start = end - timedelta(minutes=cost_lookback_minutes(rules))
    pools = stored_pools(q, start, end)
    if not any(pools.values()):
        return []
    tokens = pool_tokens(q, pools, start, end, minute.total_seconds())
    if tokens.empty:
        return []
    sheet = price_sheet(q)
    buckets = pd.to_datetime(tokens["bucket"])
    rows = []
    for pool, members in pools.items():
        gpus = sum(g for _, g in members)
        if not gpus:
            continue
        counted = tokens["prompt"] - tokens["cached"] if pool == "prefill" else tokens["generated"]
        usd = [sheet.gpu_cost(pool, gpus, b, b + minute) for b in buckets.dt.to_pydatetime()]
        rows.append(pd.DataFrame({"bucket": buckets, "pool": pool, "tokens": counted, "usd": usd}))
    return evaluate_cost(rules, pd.concat(rows), pd.Timestamp(latest)) if rows else []


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
