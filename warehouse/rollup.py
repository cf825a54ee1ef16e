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

from .read import HOUR, floor
from .requests import roll_requests_1h, roll_requests_slo_1m
from .sql import sql

GAUGE_KINDS = ("gauge", "unknown", "untyped", "info", "stateset")
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


SLO_MINUTES = "requests_slo_1m"
"""rollup_state name: the request records stored before this time are in requests_slo_1m."""
SLO_MINUTES_BACKFILL = timedelta(hours=7)
"""A warehouse without the per-minute SLO counts (new, or from before them) rolls the records stored
this long before its first minute: the alert banner's burn rates look back 6 h 16 min."""

# (state name, unit, source increments, source samples, target table suffix)
_LEVELS = (
    ("1m", timedelta(minutes=1), "increments", "samples", "1m"),
    ("1h", timedelta(hours=1), "increments_1m", "samples_1m", "1h"),
)


COMPACT_REACH = timedelta(hours=2)
"""How far before the hour a minute roll closes its compaction reaches back: an interval that
straddles an hour's end adds to that hour in the next minute's roll (intervals are far shorter)."""
MINUTE_REACH = timedelta(minutes=10)
"""How long after an hour's end its minute rows are compacted: the interval that straddles the end
adds to the hour's last minute in the next minute's roll."""

# The columns a compaction keeps per key: a per-series rollup's sums and resets, a pool rollup's sums.
SUMS = "sum(delta) AS delta, sum(seconds) AS seconds, sum(idle_seconds) AS idle_seconds"
PER_SERIES = ("series_id", f"{SUMS}, sum(resets)::INTEGER AS resets")
PER_POOL = ("role, metric, le", SUMS)


def _compact(
    con: duckdb.DuckDBPyConnection, tables: dict[str, tuple[str, str]], start: datetime, until: datetime
) -> None:
    """One row per period and key of each table's rows in [start, until), stored hour by hour, key by
    key (a minute table's series' minutes side by side)."""
    for table, (key, sums) in tables.items():
        con.execute(
            f"""CREATE OR REPLACE TEMP TABLE compacted AS
                SELECT ts, {key}, {sums} FROM {table} WHERE ts >= ? AND ts < ?
                GROUP BY ts, {key} ORDER BY time_bucket(INTERVAL 1 HOUR, ts), {key}, ts""",
            [start, until],
        )
        con.execute(f"DELETE FROM {table} WHERE ts >= ? AND ts < ?", [start, until])
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM compacted")
        con.execute("DROP TABLE compacted")


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


def from_minutes(width: str) -> str:
    """Rows of `width` (an interval that a minute divides: six minutes, an hour) from minute rows
    (FROM and GROUP BY ALL to follow): a raw row's shares of the minutes of a period add up to its
    share of the period, its reset to the period its scrape closed (migration 019 fills the
    six-minute table from the minutes the same way)."""
    return (
        f"SELECT time_bucket(INTERVAL {width}, ts) AS ts, series_id, sum(delta) AS delta, sum(seconds) AS seconds, "
        "sum(idle_seconds) AS idle_seconds, sum(resets)::INTEGER AS resets"
    )


def _store_rolled(con: duckdb.DuckDBPyConnection, table: str, pools: str) -> None:
    """The temp table `rolled` (a roll's rows of a per-series rollup) into `table`, and its
    histogram and summary series summed per pool into `pools`."""
    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM rolled")
    con.execute(f"INSERT INTO {pools} BY NAME " + sql("roll_pool_histograms"))


class Rollups:
    def __init__(self, retention: Retention | None = None) -> None:
        self.retention = retention or Retention()
        self._through: dict[str, datetime | None] = {}
        self._loaded = False

    def _load(self, con: duckdb.DuckDBPyConnection) -> None:
        stored = dict(con.execute("SELECT name, through FROM rollup_state").fetchall())
        first = con.execute("""SELECT least((SELECT min(ts) FROM samples), (SELECT min(ts) FROM expert_load),
                                            (SELECT min(ingested_at) FROM requests))""").fetchall()[0][0]
        for name, unit, *_ in _LEVELS:
            # start at the oldest data (of any kind: a file may hold request records alone), so a
            # database from before rollups is covered too
            self._through[name] = stored.get(name) or (floor(first, unit) if first is not None else None)
        self._through[SLO_MINUTES] = stored.get(SLO_MINUTES)
        self._loaded = True

    def advance(self, con: duckdb.DuckDBPyConnection, now: datetime) -> None:
        """Roll up every whole minute and hour before `now`; apply retention when an hour closes."""
        if not self._loaded:
            self._load(con)
        hour_closed = False
        for name, unit, inc, smp, suffix in _LEVELS:
            until = floor(now, unit)
            start = self._through.get(name) or until
            if until <= start:
                self._through[name] = start
                continue
            self._roll(con, unit, inc, smp, suffix, start, until)
            if name == "1m":
                hours = compacted(start, until)
                if "increments_1h" in hours:
                    compact_hours(con, *hours["increments_1h"])
                if "increments_1m" in hours:
                    compact_minutes(con, *hours["increments_1m"])
            con.execute(
                "INSERT INTO rollup_state VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET through = excluded.through",
                [name, until],
            )
            self._through[name] = until
            hour_closed |= name == "1h"
        until = floor(now, timedelta(minutes=1))
        start = self._through.get(SLO_MINUTES) or until - SLO_MINUTES_BACKFILL
        if start < until:
            roll_requests_slo_1m(con, start, until)
            con.execute(
                "INSERT INTO rollup_state VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET through = excluded.through",
                [SLO_MINUTES, until],
            )
            self._through[SLO_MINUTES] = until
        if hour_closed:
            self.apply_retention(con, now)

    @staticmethod
    def _roll(
        con: duckdb.DuckDBPyConnection,
        unit: timedelta,
        inc: str,
        smp: str,
        suffix: str,
        start: datetime,
        until: datetime,
    ) -> None:
        width = f"INTERVAL {int(unit.total_seconds())} SECOND"
        if inc == "increments":  # raw increments split by wall time into minutes, and those minutes summed
            con.execute(  # per six minutes and per hour, which they nest in
                "CREATE OR REPLACE TEMP TABLE rolled AS " + sql("roll_increments"),
                {"from": start, "until": until, "unit_us": 60_000_000},
            )
            _store_rolled(con, "increments_1m", "pool_histograms_1m")
            con.execute("ALTER TABLE rolled RENAME TO rolled_minutes")
            for table, pools, period in (
                ("increments_6m", "pool_histograms_6m", "6 MINUTE"),
                ("increments_1h", "pool_histograms_1h", "1 HOUR"),
            ):
                con.execute(f"CREATE TEMP TABLE rolled AS {from_minutes(period)} FROM rolled_minutes GROUP BY ALL")
                _store_rolled(con, table, pools)
                con.execute("DROP TABLE rolled")
            con.execute("DROP TABLE rolled_minutes")
        if smp == "samples":
            values = "avg(x.value), max(x.value), count(x.value)"
            kinds = f"AND s.kind IN {GAUGE_KINDS}"
        else:  # from minutes: the mean weighted by samples, the max of maxima
            values = "sum(x.value * x.n) / nullif(sum(x.n), 0), max(x.max), sum(x.n)"
            kinds = ""
        con.execute(
            f"""INSERT INTO samples_{suffix}
                        SELECT time_bucket({width}, x.ts), x.series_id, {values}
                        FROM {smp} x JOIN series s USING (series_id)
                        WHERE x.ts >= ? AND x.ts < ? {kinds} GROUP BY ALL""",
            [start, until],
        )
        if suffix == "1h":
            con.execute(
                """INSERT INTO expert_load_1h
                           SELECT time_bucket(INTERVAL 1 HOUR, ts), target, layer, expert, sum(tokens), count(*)
                           FROM expert_load WHERE ts >= ? AND ts < ? GROUP BY ALL""",
                [start, until],
            )
            roll_requests_1h(con, start, until)

    def apply_retention(self, con: duckdb.DuckDBPyConnection, now: datetime) -> dict[str, int]:
        """Delete what is past its retention and already rolled up; returns rows deleted per table."""
        r, through = self.retention, self._through
        plan = [
            ("samples", now - timedelta(days=r.raw_days), through.get("1m")),
            ("increments", now - timedelta(days=r.raw_days), through.get("1m")),
            ("samples_1m", now - timedelta(days=r.minute_days), through.get("1h")),
            ("increments_1m", now - timedelta(days=r.minute_days), through.get("1m")),
            ("pool_histograms_1m", now - timedelta(days=r.minute_days), through.get("1m")),
            # with the minutes, at the same cutoff: where minutes were dropped (increments_1m_from)
            # the read layer takes the hours, as it would for six-minute rows
            ("increments_6m", now - timedelta(days=r.minute_days), through.get("1m")),
            ("pool_histograms_6m", now - timedelta(days=r.minute_days), through.get("1m")),
            ("expert_load", now - timedelta(days=r.raw_days), through.get("1h")),
            ("expert_load_1h", now - timedelta(days=r.hour_days), None),
            ("requests", now - timedelta(days=r.raw_days), through.get("1h")),
            ("requests_1h", now - timedelta(days=r.hour_days), None),
            ("requests_itl_1h", now - timedelta(days=r.hour_days), None),
            ("requests_slo_1h", now - timedelta(days=r.hour_days), None),
            ("requests_slo_1m", now - timedelta(days=r.raw_days), None),
            ("samples_1h", now - timedelta(days=r.hour_days), None),
            ("increments_1h", now - timedelta(days=r.hour_days), None),
            ("pool_histograms_1h", now - timedelta(days=r.hour_days), None),
        ]
        deleted = {}
        for table, cutoff, rolled in plan:
            if rolled is not None:
                cutoff = min(cutoff, rolled)
            col = "ingested_at" if table == "requests" else "ts"
            n = con.execute(f"DELETE FROM {table} WHERE {col} < ?", [cutoff]).fetchall()[0][0]
            deleted[table] = int(n)
            if table in KEPT_FROM:  # the read layer serves a window's edges before it from a coarser table
                con.execute(
                    """INSERT INTO rollup_state VALUES (?, ?)
                               ON CONFLICT (name) DO UPDATE SET through = greatest(through, excluded.through)""",
                    [KEPT_FROM[table], cutoff],
                )
        return deleted
