"""Queries behind the Cost page (finance): the warehouse's cost model over the query API.

Pool sizes come from the targets the warehouse saw in the window (role and GPUs, as the targets
file gave them); the numbers are those `moemeter report cost` prints for the same window and sheet.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd

from moemeter.contract import POOLS
from warehouse.cost import (
    BASES,
    CostReport,
    NoData,
    cost_over_time,
    cost_report,
    daily_statement,
    pool_tokens,
    price_sheet,
    rebucket,
    with_gpu_price,
)
from warehouse.cost import stored_pools as pools
from warehouse.export import host_rack
from warehouse.focus import focus_rows
from warehouse.prices import PriceSheet, default_sheet
from warehouse.read import run_time

from .live import Query

__all__ = [
    "BASES",
    "NoData",
    "CostReport",
    "cost_report",
    "daily_statement",
    "price_sheet",
    "pools",
    "over_time",
    "focus_csv",
    "host_rack",
    "latest_count",
    "default_sheet",
    "with_gpu_price",
]


def over_time(
    q: Query,
    p: dict[str, list[tuple[str, int]]],
    sheet: PriceSheet,
    start: datetime,
    end: datetime,
    step: timedelta,
    report: CostReport | None = None,
) -> pd.DataFrame:
    """Cost and $/M tokens per step of the window; from the window's `report` when its steps divide
    `step` (its tokens summed per step, not read again), else from the counters."""
    if (
        report is not None
        and (report.start, report.end) == (start, end)
        and step.total_seconds() % report.step_seconds == 0
    ):
        tokens = rebucket(report.tokens, step)
    else:
        tokens = pool_tokens(q, p, start, end, step.total_seconds())
    gpus = {role: sum(g for _, g in p[role]) for role in POOLS}
    return cost_over_time(tokens, gpus, sheet, start, end, step)


def focus_csv(
    q: Query,
    p: dict[str, list[tuple[str, int]]],
    start: datetime,
    end: datetime,
    rack: str,
    sheet: PriceSheet,
    basis: str,
) -> bytes:
    """The window's FOCUS 1.2 rows by tenant (`moemeter report focus --by tenant`), as CSV."""
    return focus_rows(q, p, start, end, rack, sheet, basis, "tenant").to_csv(index=False).encode()


def first_count(q: Query) -> datetime | None:
    """The first scrape that found a target up: counters count from there."""
    return run_time(q, "observed", "first")


def latest_count(q: Query) -> datetime | None:
    """The latest scrape that found a target up."""
    return run_time(q, "observed", "latest")


def statement_from(start: datetime, end: datetime, first: datetime | None, explicit: bool) -> datetime:
    """Where the daily statement of the window [start, end) starts: midnight of its first day; for
    a preset window, when moemeter first saw the rack if that is later (the hours before it were
    not observed and are not cost the tool observed), whether or not the window itself reaches
    back that far. An explicit window is the reader's: its days count whole."""
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    if not explicit and first is not None and day < first < end:
        return first
    return day
