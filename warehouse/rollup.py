"""Rollups and retention, maintained by the writer as minutes and hours close.

Raw samples roll up into per-minute rows once a later minute arrives, minutes into hours once a
later hour arrives; gauges as mean and max. Counter increments roll up from the raw rows into
the minute table as each minute closes, split by the wall time their intervals cover
(warehouse/sql/roll_increments.sql), and the roll's minute rows are summed into six minutes and
into hours at once (a minute lies in one of each), so anything computed from a rollup reconciles
exactly with the raw counters, over any window (warehouse/read.py). Retention then drops raw rows
after `raw_days`, minute and six-minute rows after `minute_days` and hour rows after `hour_days` —
never a row that is not rolled up yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import duckdb

from moemeter.contract import LONGEST_DAYS

from .read import HOUR, MINUTE, floor
from .requests import roll_requests_1h, roll_requests_slo_1m
from .sql import sql

# rollup_state names: counter rows of the table before this time were dropped by retention
KEPT_FROM = {"increments": "increments_from", "increments_1m": "increments_1m_from"}


@dataclass(frozen=True)
class Retention:
    raw_days: float = 2.0
    """Days raw samples and increments, per-snapshot expert load and per-request records are kept."""
    minute_days: float = 30.0
    """Days per-minute (and six-minute) rollups are kept."""
    hour_days: float = 365.0
    """Days per-hour rollups (per-expert load included) are kept."""

    def __post_init__(self) -> None:
        """A retention of no time, a negative one (its cutoff in the future) or NaN would drop rows
        as soon as they were written, or stop the roll-ups (a timestamp overflows past LONGEST_DAYS)."""
        for name in ("raw_days", "minute_days", "hour_days"):
            days = getattr(self, name)
            if not 0 < days <= LONGEST_DAYS:
                raise ValueError(f"Retention.{name} must be above 0 and at most {LONGEST_DAYS:,} days, not {days}")

    def days(self, table: str) -> float | None:
        """Days `table`'s rows are kept (None: for good)."""
        return getattr(self, KEPT[table][0]) if table in KEPT else None


KEPT = {
    # table: how long it is kept (a Retention field), and the roll (a rollup_state name) that must
    # have taken a row before it goes (None: nothing rolls it up)
    "samples": ("raw_days", "1m"),
    "increments": ("raw_days", "1m"),
    "samples_1m": ("minute_days", "1h"),
    "increments_1m": ("minute_days", "1m"),
    "pool_histograms_1m": ("minute_days", "1m"),
    # with the minutes, at the same cutoff: where minutes were dropped (increments_1m_from)
    # the read layer takes the hours, as it would for six-minute rows
    "increments_6m": ("minute_days", "1m"),
    "pool_histograms_6m": ("minute_days", "1m"),
    "expert_load": ("raw_days", "1h"),
    "expert_load_1h": ("hour_days", None),
    "requests": ("raw_days", "1h"),
    "requests_1h": ("hour_days", None),
    "requests_itl_1h": ("hour_days", None),
    "requests_slo_1h": ("hour_days", None),
    "requests_slo_1m": ("raw_days", None),
    "samples_1h": ("hour_days", None),
    "increments_1h": ("hour_days", None),
    "pool_histograms_1h": ("hour_days", None),
}
"""What retention trims; every other table is kept for good."""


SLO_MINUTES = "requests_slo_1m"
"""rollup_state name: the request records stored before this time are in requests_slo_1m."""
SLO_MINUTES_BACKFILL = timedelta(hours=7)
"""A warehouse that held no data when the roll-up first looked rolls the records stored this long
before its first minute: the alert banner's burn rates look back 6 h 16 min. One that holds data
and no per-minute SLO counts (from before them, or migration 023) rolls every record it keeps."""

# (state name, unit, source increments, target table suffix: warehouse/sql/rollup_samples_<suffix>.sql)
_LEVELS = (
    ("1m", timedelta(minutes=1), "increments", "1m"),
    ("1h", timedelta(hours=1), "increments_1m", "1h"),
)


COMPACT_REACH = timedelta(hours=2)
"""How far before the hour a minute roll closes its compaction reaches back: an interval that
straddles an hour's end adds to that hour in the next minute's roll (intervals are far shorter)."""
MINUTE_REACH = timedelta(minutes=10)
"""How long after an hour's end its minute rows are compacted: the interval that straddles the end
adds to the hour's last minute in the next minute's roll."""

# How each counter rollup is compacted: per series and its resets (warehouse/sql/rollup_compact_series.sql),
# or per pool, sample name and bound (rollup_compact_pools.sql).
PER_SERIES, PER_POOL = "rollup_compact_series", "rollup_compact_pools"


def _compact(con: duckdb.DuckDBPyConnection, tables: dict[str, str], start: datetime, until: datetime) -> None:
    """One row per period and key of each table's rows in [start, until), stored hour by hour, key by
    key (a minute table's series' minutes side by side)."""
    window = {"start": start, "until": until}
    for table, compaction in tables.items():
        con.execute(sql(compaction, table=table), window)
        con.execute(sql("rollup_compact_delete", table=table), window)
        con.execute(sql("rollup_compact_insert", table=table))
        con.execute(sql("rollup_drop", table="compacted"))


def compacted(start: datetime, until: datetime) -> dict[str, tuple[datetime, datetime]]:
    """The hours [a, b) a minute roll over [start, until) compacts, by the per-series table
    (increments_1h: compact_hours, increments_1m: compact_minutes; their pool tables alike); a
    reader of the rolled tables (the lake's publisher) takes them again from there."""
    out = {}
    if floor(until, HOUR) > floor(start, HOUR):
        out["increments_1h"] = (floor(start, HOUR) - COMPACT_REACH, floor(until, HOUR))
    if floor(until - MINUTE_REACH, HOUR) > floor(start - MINUTE_REACH, HOUR):
        out["increments_1m"] = (floor(start - MINUTE_REACH, HOUR), floor(until - MINUTE_REACH, HOUR))
    return out


def compact_hours(con: duckdb.DuckDBPyConnection, start: datetime, until: datetime) -> None:
    """One increments_1h row per series and hour (one pool_histograms_1h row per pool, sample name and
    bound) for the hours in [start, until), and one increments_6m (pool_histograms_6m) row per
    series (pool) and six minutes of them, each hour's rows stored series by series.

    Each minute's roll adds a row per series to the hour (the six minutes) its raw increments cover
    (sixty a closed hour); readers only sum a period's rows (warehouse/sql/increase.sql), so their
    sum stands for them. Run in the roll's transaction: a reader sees the rows before or after,
    never neither."""
    _compact(
        con,
        {t: PER_SERIES for t in ("increments_1h", "increments_6m")}
        | {t: PER_POOL for t in ("pool_histograms_1h", "pool_histograms_6m")},
        start,
        until,
    )


def compact_minutes(con: duckdb.DuckDBPyConnection, start: datetime, until: datetime) -> None:
    """One increments_1m row per series and minute (one pool_histograms_1m row per pool, sample name
    and bound) for the hours in [start, until), each hour's rows stored series by series.

    An interval that straddles a minute's start adds to that minute in two rolls, so a minute
    holds about two rows per series; and a roll stores a minute of every series, so a series'
    rows lie among all the others'. Compacted, an hour's rows are half as many and a series'
    sixty minutes lie together, a target's series side by side (ids are given in page order): a
    day's read of one target's or one family's series skips the blocks of rows that hold none of
    them (DuckDB's per-block min/max) instead of reading every row of the day. Run in the roll's
    transaction, as compact_hours."""
    _compact(con, {"increments_1m": PER_SERIES, "pool_histograms_1m": PER_POOL}, start, until)


def _store_rolled(con: duckdb.DuckDBPyConnection, table: str, pools: str) -> None:
    """The temp table `rolled` (a roll's rows of a per-series rollup) into `table`, and its
    histogram and summary series summed per pool into `pools`."""
    con.execute(sql("rollup_store", table=table))
    con.execute(sql("rollup_store_pools", table=pools))


class Rollups:
    def __init__(self, retention: Retention | None = None) -> None:
        self.retention = retention or Retention()
        self._through: dict[str, datetime | None] = {}
        self._loaded = False

    def _load(self, con: duckdb.DuckDBPyConnection) -> None:
        stored = dict(con.execute(sql("rollup_state")).fetchall())
        first = con.execute(sql("rollup_first")).fetchall()[0][0]
        for name, unit, *_ in _LEVELS:
            # start at the oldest data (of any kind: a file may hold request records alone), so a
            # database from before rollups is covered too
            self._through[name] = stored.get(name) or (floor(first, unit) if first is not None else None)
        # a file whose minute counts were dropped (migration 023) rolls every record it keeps again
        self._through[SLO_MINUTES] = stored.get(SLO_MINUTES) or (floor(first, MINUTE) if first is not None else None)
        self._loaded = True

    def advance(self, con: duckdb.DuckDBPyConnection, now: datetime) -> None:
        """Roll up every whole minute and hour before `now`; apply retention when an hour closes."""
        if not self._loaded:
            self._load(con)
        hour_closed = False
        for name, unit, inc, suffix in _LEVELS:
            until = floor(now, unit)
            start = self._through.get(name) or until
            if until <= start:
                self._through[name] = start
                continue
            self._roll(con, inc, suffix, start, until)
            if name == "1m":
                hours = compacted(start, until)
                if "increments_1h" in hours:
                    compact_hours(con, *hours["increments_1h"])
                if "increments_1m" in hours:
                    compact_minutes(con, *hours["increments_1m"])
            con.execute(sql("rollup_state_set"), {"name": name, "through": until})
            self._through[name] = until
            hour_closed |= name == "1h"
        until = floor(now, timedelta(minutes=1))
        start = self._through.get(SLO_MINUTES) or until - SLO_MINUTES_BACKFILL
        if start < until:
            # an hour of stored records a statement: rolling every record a file keeps again
            # (migration 023) takes as much memory as an hour's
            a = start
            while a < until:
                roll_requests_slo_1m(con, a, min(a + HOUR, until))
                a += HOUR
            con.execute(sql("rollup_state_set"), {"name": SLO_MINUTES, "through": until})
            self._through[SLO_MINUTES] = until
        if hour_closed:
            self.apply_retention(con, now)

    @staticmethod
    def _roll(
        con: duckdb.DuckDBPyConnection,
        inc: str,
        suffix: str,
        start: datetime,
        until: datetime,
    ) -> None:
        if inc == "increments":  # raw increments split by wall time into minutes, and those minutes summed
            con.execute(  # per six minutes and per hour, which they nest in
                sql("rollup_rolled"),
                {"from": start, "until": until, "unit_us": 60_000_000},
            )
            _store_rolled(con, "increments_1m", "pool_histograms_1m")
            con.execute(sql("rollup_rename_rolled"))
            for table, pools, period in (
                ("increments_6m", "pool_histograms_6m", timedelta(minutes=6)),
                ("increments_1h", "pool_histograms_1h", HOUR),
            ):
                con.execute(sql("rollup_from_minutes"), {"width": period})
                _store_rolled(con, table, pools)
                con.execute(sql("rollup_drop", table="rolled"))
            con.execute(sql("rollup_drop", table="rolled_minutes"))
        # gauges: from raw samples into minutes, from minutes into hours (the mean weighted by samples)
        window = {"start": start, "until": until}
        con.execute(sql(f"rollup_samples_{suffix}"), window)
        if suffix == "1h":
            con.execute(sql("rollup_expert_load_1h"), window)
            roll_requests_1h(con, start, until)

    def apply_retention(self, con: duckdb.DuckDBPyConnection, now: datetime) -> dict[str, int]:
        """Delete what is past its retention and already rolled up; returns rows deleted per table."""
        if not self._loaded:
            self._load(con)
        r, through = self.retention, self._through
        deleted = {}
        for table, (kept, roll) in KEPT.items():
            cutoff = now - timedelta(days=getattr(r, kept))
            rolled = through.get(roll) if roll else None
            if rolled is not None:
                cutoff = min(cutoff, rolled)
            # the records by when they were stored (what their roll-up follows), the others by ts
            delete = sql("rollup_retention_requests") if table == "requests" else sql("rollup_retention", table=table)
            n = con.execute(delete, {"cutoff": cutoff}).fetchall()[0][0]
            deleted[table] = int(n)
            if table in KEPT_FROM:  # the read layer serves a window's edges before it from a coarser table
                con.execute(sql("rollup_state_keep"), {"name": KEPT_FROM[table], "through": cutoff})
        return deleted
