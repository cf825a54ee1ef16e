"""The Fleet page's numbers: each rack of the lake side by side over one window, every figure the
one the rack's own pages and reports give (docs/definitions.md): its cost report's cost, idle cost,
$/M input and output and rack tokens/s per GPU; P90 per-user tokens/s from its hourly inter-token
latency histogram; the worst layer balancedness of its EPLB instances; the SLO classes burning
their error budget at the window's end (the alert pack's burn rules, as its banner judges them).
Pure: each rack is a Query."""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd

from warehouse.cost import NoData, cost_report, stored_pools
from warehouse.read import HOUR, MINUTE, Query, Window, ceil, floor
from warehouse.readonly import QueryError as QueryError  # for the page

from .alerts import burning
from .cost import first_count
from .experts import eplb_targets, rank_steps
from .users import itl_quantiles_from_histogram

COLUMNS = [
    "rack",
    "gpus",
    "tokens_per_second_per_gpu",
    "p90_user_tokens_per_second",
    "usd_per_mtok_input",
    "usd_per_mtok_output",
    "cost_usd",
    "idle_cost_usd",
    "worst_balancedness",
    "slo_alerts",
]


@dataclass(frozen=True)
class FleetWindow:
    """One window for every rack: whole minutes up to the minute before the least-published rack's
    watermark (its last minute may still take the tail of an interval)."""

    start: datetime
    end: datetime

    @classmethod
    def ending(cls, watermarks: Mapping[str, datetime], span: timedelta) -> FleetWindow | None:
        if not watermarks:
            return None
        end = floor(min(watermarks.values()), MINUTE) - MINUTE
        return cls(end - span, end)


def worst_balancedness(q: Query, w: Window) -> float:
    """The lowest mean/max rank load over the window of any MoE layer of any EPLB instance (NaN: none)."""
    worst = math.nan
    for target in eplb_targets(q):
        steps = rank_steps(q, w, target)
        if steps.empty:
            continue
        per = steps.groupby(["layer", "rank"])["tokens"].sum().groupby("layer")
        bal = (per.mean() / per.max()).dropna()
        if len(bal):
            worst = float(bal.min()) if math.isnan(worst) else min(worst, float(bal.min()))
    return worst


def rack_line(q: Query, rack: str, start: datetime, end: datetime) -> dict[str, object]:
    """One rack's row over [start, end), from its first scrape where that is later (as the Cost page
    counts a preset window); NaN where it has nothing to say (no counters, no closed hour of
    requests, no EPLB instance)."""
    row: dict[str, object] = {c: math.nan for c in COLUMNS}
    row["rack"] = rack
    first = first_count(q)
    if first is not None and start < first < end:  # unobserved time is not observed cost, as on the Cost page
        start = first
    try:
        r = cost_report(q, stored_pools(q, start, end), start, end, revenue_too=False)
    except (NoData, ValueError):
        r = None
    if r is not None:
        gpus = r.prefill.gpus + r.decode.gpus
        row["gpus"] = gpus
        seconds = (end - start).total_seconds()
        if gpus:  # the rack figure: prefill prompt tokens and decode generated tokens over all its GPUs
            row["tokens_per_second_per_gpu"] = (r.prompt_tokens + r.generated_tokens) / seconds / gpus
        for col, cost, tokens in (
            ("usd_per_mtok_input", r.prefill.cost_usd, r.computed_prompt_tokens),
            ("usd_per_mtok_output", r.decode.cost_usd, r.generated_tokens),
        ):
            per = r.per_mtok(cost, tokens)  # None without tokens; a price of 0 is $0/M, not "none"
            row[col] = math.nan if per is None else per
        row["cost_usd"] = r.cost_usd
        row["idle_cost_usd"] = r.prefill.idle_cost_usd + r.decode.idle_cost_usd
    h0, h1 = ceil(start, HOUR), floor(end, HOUR)
    if h0 < h1:  # the lake holds request latencies per closed hour
        _, itl90 = itl_quantiles_from_histogram(q, h0, h1)
        row["p90_user_tokens_per_second"] = 1 / itl90 if itl90 > 0 else math.nan
    row["worst_balancedness"] = worst_balancedness(q, Window.between(start, end))
    row["slo_alerts"] = ", ".join(f"{f.rule} ({f.subject.removeprefix('class ')})" for f in burning(q, end))
    return row


READERS = 8
"""Racks read at once: a rack's line is a dozen small lake reads, most of their time spent on the
catalog's metadata and on opening Parquet files, each rack on its own connection."""


def fleet_lines(racks: Mapping[str, Query], start: datetime, end: datetime) -> pd.DataFrame:
    """A row per rack (COLUMNS), in the order given."""
    with ThreadPoolExecutor(max(1, min(READERS, len(racks)))) as pool:
        lines = list(pool.map(lambda item: rack_line(item[1], item[0], start, end), racks.items()))
    return pd.DataFrame(lines, columns=COLUMNS)
