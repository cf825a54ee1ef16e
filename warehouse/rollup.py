"""Per-minute rollups, maintained by the writer as minutes close.

A minute is rolled up once the first batch of a later minute arrives; raw rows stay where
they are (retention is a separate step). Counters roll up as sums of increases, gauges as
mean and max.
"""

from __future__ import annotations

from datetime import datetime

import duckdb

NAME = "1m"


def minute_floor(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


class Rollups:
    def __init__(self) -> None:
        self._through: datetime | None = None
        self._loaded = False

    def _load(self, con: duckdb.DuckDBPyConnection) -> None:
        rows = con.execute("SELECT through FROM rollup_state WHERE name = ?", [NAME]).fetchall()
        if rows:
            self._through = rows[0][0]
        else:  # start at the oldest data, so a database from before rollups is covered too
            first = con.execute("SELECT min(ts) FROM samples").fetchall()[0][0]
            self._through = minute_floor(first) if first is not None else None
        self._loaded = True

    def advance(self, con: duckdb.DuckDBPyConnection, now: datetime) -> datetime | None:
        """Roll up every whole minute before `now`'s minute; returns the new `through`."""
        if not self._loaded:
            self._load(con)
        until = minute_floor(now)
        if self._through is None:
            self._through = until
        if until <= self._through:
            return self._through
        start = self._through
        con.execute(
            """INSERT INTO increments_1m
               SELECT time_bucket(INTERVAL 1 MINUTE, ts), series_id, sum(delta), sum(seconds), count(*) FILTER (WHERE reset)
               FROM increments WHERE ts >= ? AND ts < ? GROUP BY ALL""",
            [start, until],
        )
        con.execute(
            """INSERT INTO samples_1m
               SELECT time_bucket(INTERVAL 1 MINUTE, x.ts), x.series_id, avg(x.value), max(x.value), count(x.value)
               FROM samples x JOIN series s USING (series_id)
               WHERE x.ts >= ? AND x.ts < ? AND s.kind IN ('gauge', 'unknown', 'untyped', 'info', 'stateset')
               GROUP BY ALL""",
            [start, until],
        )
        con.execute(
            "INSERT INTO rollup_state VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET through = excluded.through",
            [NAME, until],
        )
        self._through = until
        return until
