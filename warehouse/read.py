"""The read layer for counters: increases over a window, exact at its edges, whichever tables serve it.

A window is `[start, end)` of wall time; an increment stored at scrape time `ts` covers
`(ts - seconds, ts]`; a window takes the share of each interval that lies inside it
(docs/definitions.md, Windows). Raw increments are kept two days, their per-minute and
six-minute splits 30 days, their per-hour split a year (warehouse/rollup.py); `plan` chooses which
table serves which piece of a window (whole hours from the hour table and whole six minutes from
the six-minute table where the step allows, whole minutes from the minute table, the edges from
raw rows) and every page and report reads through it, so the same
window gives the same numbers everywhere and consecutive windows add up.

A statement (warehouse/sql/*.sql) names the series it wants in a `picked` CTE (series_id, ...),
puts the line `/*increase*/` after it, and selects from `per_series` (bucket, series_id, delta,
seconds, idle_seconds); see warehouse/sql/increase.sql. A pooled statement (the line
`/*pool_increase*/`) asks for histogram and summary series summed per pool instead: its `picked`
keys them by `/*pool_key*/` (POOL_KEY; one row per key, SELECT DISTINCT), and `per_series` holds
a row per pool, sample name and bucket bound, whose minutes and hours come from the pool rollups
(warehouse/migrations/017_pool_histograms.sql): on the twin rack the Live page's latency
histograms read 202 pooled series there instead of 7,272 engines' bucket series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from moemeter.contract import DEFAULT_INTERVAL

from .readonly import Params
from .requests import ITL_BIN_SCALE
from .sql import bind, sql
from .sql import text as written

Query = Callable[[str, Params | None], pd.DataFrame]
"""A read: a DuckDB-backed callable (the query API's client, or `LocalQuery` in this process)."""

MINUTE, SIX, HOUR = timedelta(minutes=1), timedelta(minutes=6), timedelta(hours=1)
EPOCH = datetime(1970, 1, 1)
US = 1_000_000
POINTS = 120  # points per chart


def floor(t: datetime, unit: timedelta) -> datetime:
    return EPOCH + (t - EPOCH) // unit * unit


def steps(start: datetime, end: datetime, step: timedelta) -> Iterator[tuple[datetime, datetime, datetime]]:
    """Each epoch-aligned step that overlaps `[start, end)`: (the step's start, as a step's rows are
    keyed, and the step cut to the window, `a` to `b`)."""
    t = floor(start, step)
    while t < end:
        yield t, max(t, start), min(t + step, end)
        t += step


def by_step(frame: pd.DataFrame) -> dict[datetime, Any]:
    """A frame of per-step rows (a `bucket` column) as each step's row, keyed as `steps` keys them."""
    return {pd.Timestamp(r.bucket).to_pydatetime(): r for r in frame.itertuples()}


def ceil(t: datetime, unit: timedelta) -> datetime:
    f = floor(t, unit)
    return f if f == t else f + unit


def micros(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Window:
    """`[start, end)` in steps of `step_seconds` (epoch-aligned, the first and last cut to the window)."""

    start: datetime
    end: datetime
    step_seconds: int

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @classmethod
    def ending(cls, latest: datetime, seconds: float, scrape_interval: float = DEFAULT_INTERVAL) -> Window:
        """The `seconds` up to and including `latest` (a scrape's or a record's time): the window ends
        a microsecond after it, so what happened at `latest` is inside."""
        end = latest + timedelta(microseconds=1)
        return cls.between(end - timedelta(seconds=seconds), end, scrape_interval)

    @classmethod
    def between(cls, start: datetime, end: datetime, scrape_interval: float = DEFAULT_INTERVAL) -> Window:
        """A step that gives ~POINTS points and never less than two scrape intervals (so every step
        holds at least one increase); from a minute up, whole minutes, six minutes or hours (the
        rollups serve it: a day's step of 12 minutes reads a fifth of the rows minutes would)."""
        step = max(int(2 * scrape_interval), int((end - start).total_seconds() // POINTS))
        for unit in (3600, 360, 60):
            if step >= unit:
                step = -(-step // unit) * unit
                break
        return cls(start, end, step)

    @property
    def period(self) -> timedelta | None:
        """The rollup period that serves gauges and expert snapshots at this step (None: raw rows)."""
        for unit in (HOUR, MINUTE):
            if self.step_seconds % unit.total_seconds() == 0:
                return unit
        return None


def fragment(name: str, **identifiers: str) -> str:
    """warehouse/sql/<name>.sql, a piece the read layer puts in a statement, as one line without its
    comment: a statement may name the piece's marker in a comment of its own (increase.sql's
    /*members*/, live_gauges.sql's /*samples*/)."""
    lines = sql(name, **identifiers).splitlines()
    return " ".join(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("--"))


# Gauge samples at a window's resolution (/*samples*/ in a statement): raw rows or a rollup, with
# the same columns (a raw sample is its own mean and max); and per-expert load likewise.
SAMPLES = {None: fragment("read_raw_samples"), MINUTE: "samples_1m", HOUR: "samples_1h"}
EXPERT_LOAD = {None: "expert_load", MINUTE: "expert_load", HOUR: "expert_load_1h"}


def run(q: Query, name: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
    """warehouse/sql/<name>.sql (its includes in place) with the named parameters it uses."""
    return q(*bind(sql(name), params or {}))


def timestamp(v: Any) -> datetime | None:
    """A stored time as a naive UTC datetime; None for a NULL (NaT)."""
    return None if v is None or pd.isna(v) else pd.Timestamp(v).to_pydatetime()


def run_time(q: Query, name: str, column: str, params: dict[str, Any] | None = None) -> datetime | None:
    """One time from a one-row statement (a min or max); None where there is none."""
    df = run(q, name, params)
    return timestamp(df[column].iloc[0]) if len(df) else None


def at_resolution(q: Query, name: str, w: Window, params: dict[str, Any] | None = None) -> pd.DataFrame:
    """warehouse/sql/<name>.sql over the gauge samples (/*samples*/) or per-expert load
    (/*expert_load*/) of the table that suits the window's step. A rollup row is stamped with its
    period's start, so the period the window starts in counts whole ($since); the statement also
    gets $start, $end and $step_us."""
    period = w.period
    text = sql(name).replace("/*samples*/", SAMPLES[period]).replace("/*expert_load*/", EXPERT_LOAD[period])
    since = floor(w.start, period) if period is not None else w.start
    p = {"start": w.start, "since": since, "end": w.end, "step_us": w.step_seconds * US}
    return q(*bind(text, {**p, **(params or {})}))


@dataclass(frozen=True)
class Holdings:
    """What the counter tables hold: raw rows before `through` are also in the minute and hour
    tables; raw rows before `raw_from` and minute rows before `minutes_from` were dropped."""

    through: datetime | None = None
    raw_from: datetime | None = None
    minutes_from: datetime | None = None
    """(Six-minute rows went with the minutes: retention drops both at one cutoff.)"""
    longest_seconds: float = 0.0
    """The longest interval a raw row covers: how far past a piece a row may reach back into it."""
    pooled: bool = False
    """The file keeps the pool rollups (pool_histograms_1m and _1h) beside the per-series ones."""
    sixes: bool = False
    """The file keeps six-minute rollups (increments_6m, and pool_histograms_6m where `pooled`)."""

    @classmethod
    def of(cls, q: Query) -> Holdings:
        r = run(q, "holdings").iloc[0]
        longest = 0.0 if r.longest is None or pd.isna(r.longest) else float(r.longest)
        through, raw_from, minutes_from = timestamp(r.through), timestamp(r.raw_from), timestamp(r.minutes_from)
        return cls(through, raw_from, minutes_from, longest, bool(r.pooled), bool(r.sixes))


def plan(start: datetime, end: datetime, step_seconds: float | None, held: Holdings) -> dict[str, Any]:
    """The named parameters of warehouse/sql/increase.sql for [start, end) in steps of `step_seconds`
    (None: one bucket, the whole window). Steps of whole minutes (six minutes, hours) may read the
    minute (six-minute, hour) table: every bucket then holds whole periods. The pieces nest:
    raw [start, r0), minutes [r0, s0), six minutes [s0, h0), hours [h0, h1), six minutes [h1, s1),
    minutes [s1, r1), raw [r1, end). A piece whose finer rows were dropped by retention is served
    from the hour table, prorated within its period."""
    if end <= start:
        raise ValueError(f"a window must end after it starts ({start:%Y-%m-%d %H:%M:%S} .. {end:%Y-%m-%d %H:%M:%S})")
    minutes = step_seconds is None or step_seconds % 60 == 0
    sixes = held.sixes and (step_seconds is None or step_seconds % 360 == 0)
    hours = step_seconds is None or step_seconds % 3600 == 0
    r0, r1 = (ceil(start, MINUTE), floor(end, MINUTE)) if minutes else (end, end)
    if r0 >= r1:
        r0 = r1 = end
    if held.raw_from is not None and start < held.raw_from:
        r0 = start
        if r1 < held.raw_from:
            r1 = end
    # six-minute pieces inside the minutes' [r0, r1), hours inside those (or the minutes', where the
    # file keeps no six-minute rows: then none of them is read)
    s0, s1 = (ceil(r0, SIX), floor(r1, SIX)) if sixes else (r0, r1)
    if s0 >= s1:
        s0 = s1 = r0
    h0, h1 = (ceil(s0, HOUR), floor(s1, HOUR)) if hours else (s0, s0)
    if h0 >= h1:
        h0 = h1 = s0
    if not sixes:
        s0, s1 = h0, h1
    if held.minutes_from is not None and r0 < r1:
        if r0 < held.minutes_from:
            h0, h1 = r0, max(h1, r0)
        if h1 < held.minutes_from:
            h1 = r1
        s0, s1 = min(s0, h0), max(s1, h1)
    if step_seconds is None:
        origin, step = micros(start), micros(end) - micros(start)
    else:
        step = round(step_seconds * US)
        origin = micros(start) // step * step

    def whole(unit: timedelta, *edges: datetime) -> bool:
        """Every row of the table of `unit` inside the pieces between `edges` lies inside one bucket."""
        u = micros(EPOCH + unit)
        one_bucket = step_seconds is None or (step % u == 0 and origin % u == 0)
        return one_bucket and all(micros(t) % u == 0 for t in edges)

    six_edges = [t for a, b in ((s0, h0), (h1, s1)) if a < b for t in (a, b)]
    if six_edges and not whole(SIX, *six_edges):  # increase.sql takes six-minute rows whole
        raise AssertionError(f"six-minute pieces [{s0}, {h0}) and [{h1}, {s1}) in {step_seconds} s steps are not whole")
    return {
        "start": start,
        "end": end,
        "r0": r0,
        "r1": r1,
        "s0": s0,
        "s1": s1,
        "h0": h0,
        "h1": h1,
        "through": held.through or EPOCH,
        "origin_us": origin,
        "step_us": step,
        "reach_us": math.ceil(held.longest_seconds * US) + 1,
        "whole_minutes": whole(MINUTE, r0, s0, s1, r1),
        "whole_hours": whole(HOUR, h0, h1),
    }


def served_by(p: dict[str, Any]) -> tuple[str, ...]:
    """The tables a plan reads (raw rows not rolled up yet are read wherever rollups serve)."""
    out = []
    if p["start"] < p["r0"] or p["r1"] < p["end"] or p["r0"] < p["r1"]:
        out.append("increments")
    if p["r0"] < p["s0"] or p["s1"] < p["r1"]:
        out.append("increments_1m")
    if p["s0"] < p["h0"] or p["h1"] < p["s1"]:
        out.append("increments_6m")
    if p["h0"] < p["h1"]:
        out.append("increments_1h")
    return tuple(out)


POOL_KEY = "{'role': role, 'metric': metric, 'le': le}"
"""A pooled statement's key: one sample name of a histogram or summary (and one bucket bound, or
NULL for a sum or a count) in one pool (the role of its targets)."""
SOURCES = {"raw": "increments", "minutes": "increments_1m", "sixes": "increments_6m", "hours": "increments_1h"}
POOL_TABLES = {"minutes": "pool_histograms_1m", "sixes": "pool_histograms_6m", "hours": "pool_histograms_1h"}


MEMBERS = fragment("read_members").replace("/*pool_key*/", POOL_KEY)
"""A pooled statement's member series (histogram and summary series only, as the pool rollups hold):
the statement's pools' series first, a join of the few picked, not a key for every row."""
NO_ROWS = fragment("read_no_rows")
"""What a file without six-minute rollups (a lake's rack) reads for them: `plan` leaves their pieces
empty, and a table it does not have could not be named (nor another read: the query API's limit on
relations)."""


def sources(pooled: bool, held: Holdings) -> dict[str, str]:
    """What /*members*/, /*raw*/, /*minutes*/, /*sixes*/ and /*hours*/ of warehouse/sql/increase.sql
    read. For a pooled statement: the raw rows keyed by pool; the pool rollups where the file keeps
    them, else (a lake's rack) the per-series rollups keyed by pool, the same numbers read the slow
    way."""
    if not pooled:
        return {"members": "", **SOURCES, **({} if held.sixes else {"sixes": NO_ROWS})}
    out = {"members": MEMBERS, "raw": fragment("read_per_pool_raw")}
    for name, table in POOL_TABLES.items():
        out[name] = (
            fragment("read_pool_rollup", table=table).replace("/*pool_key*/", POOL_KEY)
            if held.pooled
            else fragment("read_per_pool", table=SOURCES[name])
        )
    if not held.sixes:
        out["sixes"] = NO_ROWS
    return out


def statement(name: str, held: Holdings) -> str:
    """warehouse/sql/<name>.sql, its `/*increase*/` (or `/*pool_increase*/`) line replaced by the read
    layer's CTEs over the tables that serve it."""
    text = sql(name)
    pooled = "/*pool_increase*/" in text
    if pooled:
        text = text.replace("/*pool_increase*/", sql("increase")).replace("/*pool_key*/", POOL_KEY)
    elif "/*increase*/" not in written(name):
        raise ValueError(f"warehouse/sql/{name}.sql does not read increases (no /*increase*/ line)")
    for piece, table in sources(pooled, held).items():
        text = text.replace(f"/*{piece}*/", table)
    return text


def request_window(start: datetime, end: datetime) -> dict[str, Any]:
    """The /*requests_hourly*/ parameters for the requests that finished in [start, end): its whole
    hours from the hourly tables (and the records not rolled up yet); a statement reads the edges
    [start, finished_from) and [finished_until, end) from the records. No whole hour: all edges."""
    h0, h1 = ceil(start, timedelta(hours=1)), floor(end, timedelta(hours=1))
    return request_hours(h0, h1) if h0 < h1 else request_hours(start, start)


def request_hours(start: datetime, end: datetime) -> dict[str, Any]:
    """The parameters of /*requests_hourly*/ for the hours [start, end): the hourly tables' rows and
    the records not rolled up yet."""
    return {
        "finished_from": start,
        "finished_until": end,
        "ingested_from": None,
        "ingested_until": None,
        "bin_scale": ITL_BIN_SCALE,
    }


def increases(
    q: Query,
    name: str,
    start: datetime,
    end: datetime,
    step_seconds: float | None,
    params: dict[str, Any] | None = None,
    sixes: bool = True,
) -> pd.DataFrame:
    """Run warehouse/sql/<name>.sql over the prorated increases in [start, end); `params` are the
    statement's own named parameters (any name but the read layer's). `sixes=False`: minute rows
    serve where six-minute rows could, as in the lake, which holds none (a six-minute row is its
    minutes added as doubles: its last bit may differ from theirs summed exactly)."""
    held = Holdings.of(q)
    if not sixes:
        held = replace(held, sixes=False)
    p = plan(start, end, step_seconds, held)
    clash = set(params or ()) & set(p)
    if clash:
        raise ValueError(f"parameter names taken by the read layer: {sorted(clash)}")
    return q(*bind(statement(name, held), {**p, **(params or {})}))
