"""The read layer for counters: increases over a window, exact at its edges, whichever tables serve it.

A window is `[start, end)` of wall time; an increment stored at scrape time `ts` covers
`(ts - seconds, ts]`; a window takes the share of each interval that lies inside it
(docs/definitions.md, Windows). Raw increments are kept two days, their per-minute split 30 days,
their per-hour split a year (warehouse/rollup.py); `plan` chooses which table serves which piece
of a window (whole hours from the hour table where the step allows, whole minutes from the minute
table, the edges from raw rows) and every page, report and export reads through it, so the same
window gives the same numbers everywhere and consecutive windows add up.

A statement (warehouse/sql/*.sql) names the series it wants in a `picked` CTE (series_id, ...),
puts the line `/*increase*/` after it, and selects from `per_series` (bucket, series_id, delta,
seconds, idle_seconds); see warehouse/sql/increase.sql.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from .readonly import Params
from .sql import sql

Query = Callable[[str, Params | None], pd.DataFrame]
"""A read: a DuckDB-backed callable (the query API's client, or `LocalQuery` in this process)."""

MINUTE, HOUR = timedelta(minutes=1), timedelta(hours=1)
EPOCH = datetime(1970, 1, 1)
US = 1_000_000


def floor(t: datetime, unit: timedelta) -> datetime:
    return EPOCH + (t - EPOCH) // unit * unit


def ceil(t: datetime, unit: timedelta) -> datetime:
    f = floor(t, unit)
    return f if f == t else f + unit


def _us(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Holdings:
    """What the counter tables hold: raw rows before `through` are also in the minute and hour
    tables; raw rows before `raw_from` and minute rows before `minutes_from` were dropped."""

    through: datetime | None = None
    raw_from: datetime | None = None
    minutes_from: datetime | None = None

    @classmethod
    def of(cls, q: Query) -> Holdings:
        df = q("SELECT name, through FROM rollup_state", None)
        d = {r.name: pd.Timestamp(r.through).to_pydatetime() for r in df.itertuples()}
        return cls(d.get("1m"), d.get("increments_from"), d.get("increments_1m_from"))


def plan(start: datetime, end: datetime, step_seconds: float | None, held: Holdings) -> dict[str, Any]:
    """The named parameters of warehouse/sql/increase.sql for [start, end) in steps of `step_seconds`
    (None: one bucket, the whole window). Steps of whole minutes (hours) may read the minute (hour)
    table: every bucket then holds whole periods. A piece whose finer rows were dropped by retention
    is served from the next coarser table, prorated within its period."""
    if end <= start:
        raise ValueError(f"a window must end after it starts ({start:%Y-%m-%d %H:%M:%S} .. {end:%Y-%m-%d %H:%M:%S})")
    minutes = step_seconds is None or step_seconds % 60 == 0
    hours = step_seconds is None or step_seconds % 3600 == 0
    r0, r1 = (ceil(start, MINUTE), floor(end, MINUTE)) if minutes else (end, end)
    if r0 >= r1:
        r0 = r1 = end
    if held.raw_from is not None and start < held.raw_from:
        r0 = start
        if r1 < held.raw_from:
            r1 = end
    h0, h1 = (ceil(r0, HOUR), floor(r1, HOUR)) if hours else (r0, r0)
    if h0 >= h1:
        h0 = h1 = r0
    if held.minutes_from is not None and r0 < r1:
        if r0 < held.minutes_from:
            h0, h1 = r0, max(h1, r0)
        if h1 < held.minutes_from:
            h1 = r1
    if step_seconds is None:
        origin, step = _us(start), _us(end) - _us(start)
    else:
        step = round(step_seconds * US)
        origin = _us(start) // step * step
    return {
        "start": start,
        "end": end,
        "r0": r0,
        "r1": r1,
        "h0": h0,
        "h1": h1,
        "through": held.through or EPOCH,
        "origin_us": origin,
        "step_us": step,
    }


def served_by(p: dict[str, Any]) -> tuple[str, ...]:
    """The tables a plan reads (raw rows not rolled up yet are read wherever rollups serve)."""
    out = []
    if p["start"] < p["r0"] or p["r1"] < p["end"] or p["r0"] < p["r1"]:
        out.append("increments")
    if p["r0"] < p["h0"] or p["h1"] < p["r1"]:
        out.append("increments_1m")
    if p["h0"] < p["h1"]:
        out.append("increments_1h")
    return tuple(out)


INCLUDE = "/*increase*/"


def statement(name: str) -> str:
    """warehouse/sql/<name>.sql, its `/*increase*/` line replaced by the read layer's CTEs."""
    text = sql(name)
    if INCLUDE not in text:
        raise ValueError(f"warehouse/sql/{name}.sql does not read increases (no {INCLUDE} line)")
    return text.replace(INCLUDE, sql("increase"))


def increases(
    q: Query,
    name: str,
    start: datetime,
    end: datetime,
    step_seconds: float | None,
    params: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Run warehouse/sql/<name>.sql over the prorated increases in [start, end); `params` are the
    statement's own named parameters (any name but the read layer's)."""
    p = plan(start, end, step_seconds, Holdings.of(q))
    clash = set(params or ()) & set(p)
    if clash:
        raise ValueError(f"parameter names taken by the read layer: {sorted(clash)}")
    return q(statement(name), {**p, **(params or {})})
