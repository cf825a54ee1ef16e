"""A month of rack history from a day of it, for the pages at 30 days.

A month cannot be fast-forwarded in the bench's time (a day at 60 s takes about 17 minutes), so
this is the documented synthetic issue #51 allows. The file's whole hours (its partial first hour
is dropped, its partial last hour kept as it is) are copied back end to end, every time-stamped
table's rows moved by the same span, as far as retention keeps each table (warehouse.rollup.KEPT:
raw samples, increments, expert load and request records 2 days, minute and six-minute rollups
30, hourly rollups and the tables retention leaves alone the whole month); then retention runs
as the writer runs it when an hour closes. The file then holds what a month of this rack leaves
under the default retention, the day's hours over and over; series, targets, price and SLO
sheets are the day's, but each target was first seen at its first scrape.

`python -m benchmarks.month DB [DAYS]` extends a file you have, in place.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from datetime import timedelta
from pathlib import Path

import duckdb

from benchmarks.storage import stored
from warehouse.db import computed_columns
from warehouse.limits import default_memory_limit
from warehouse.read import HOUR, ceil, floor
from warehouse.rollup import Retention, Rollups

DAYS = 30
GROWTH = 8
"""A month's file over its day's, about (7.0 at the twin's day at 60 s: 4.2 GB -> 29.7 GB)."""
KEYS = ("ts", "ingested_at")
"""A table with one of these columns is history (the column its rollups and retention follow:
a request record's is when it was stored); the others are sheets and state."""


def _history(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, list[str]]]:
    """Each history table's key column and TIMESTAMP columns."""
    cols: dict[str, list[str]] = {}
    for table, column in con.execute(
        "SELECT table_name, column_name FROM information_schema.columns JOIN information_schema.tables "
        "USING (table_schema, table_name) WHERE table_schema = 'main' AND table_type = 'BASE TABLE' "
        "AND data_type = 'TIMESTAMP' ORDER BY table_name, ordinal_position"
    ).fetchall():
        cols.setdefault(table, []).append(column)
    keys = {t: [k for k in KEYS if k in c] for t, c in cols.items()}
    return {t: (keys[t][-1], c) for t, c in cols.items() if keys[t]}


def room(db: Path, days: int = DAYS) -> str | None:
    """Why the file's month would not fit on its disk, or None."""
    need, free = db.stat().st_size * GROWTH * days / DAYS, shutil.disk_usage(db.parent).free
    if need > free:
        return f"a month of {db} needs about {need / 1e9:,.0f} GB free in {db.parent}, which has {free / 1e9:,.0f} GB"
    return None


def extend(db: Path, days: int = DAYS) -> dict[str, int]:
    """Make the file `days` long as above; its rows per history table after."""
    if (short := room(db, days)) is not None:
        raise SystemExit(short)
    retention = Retention()
    with duckdb.connect(str(db), config={"memory_limit": default_memory_limit("fast-forward")}) as con:
        first, latest = con.execute("SELECT min(ts), max(ts) FROM scrapes").fetchall()[0]
        if latest is None:
            raise SystemExit(f"{db}: no scrapes in this file")
        start, end = ceil(first, HOUR), floor(latest, HOUR)
        if end <= start:
            raise SystemExit(f"{db}: its scrapes from {first} to {latest} hold no whole hour to copy")
        period = end - start
        history = _history(con)
        for table, (key, columns) in history.items():
            con.execute(f"DELETE FROM {table} WHERE {key} < $1", [start])
            kept = retention.days(table)
            reach = latest - timedelta(days=days if kept is None else min(days, kept))
            computed = computed_columns(con, table)  # a request's start: the finish less e2e
            moved = ", ".join(f"{c} - $shift AS {c}" for c in columns if c not in computed)
            for k in range(1, math.ceil((start - reach) / period) + 1):  # each copy from the day's own rows
                con.execute(
                    f"INSERT INTO {table} SELECT {stored(con, table)} REPLACE ({moved}) FROM {table} "
                    f"WHERE {key} >= $start AND {key} < $end",
                    {"shift": k * period, "start": start, "end": end},
                )
        con.execute(  # a target was first seen at its first scrape, now a month back
            "UPDATE targets SET first_seen = s.first FROM (SELECT target, min(ts) AS first FROM scrapes GROUP BY ALL) s "
            "WHERE targets.name = s.target AND s.first < targets.first_seen"
        )
        Rollups(retention).apply_retention(con, latest)
        con.execute("CHECKPOINT")
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in history}


def main() -> None:
    if len(sys.argv) not in (2, 3) or not Path(sys.argv[1]).is_file():
        raise SystemExit("usage: python -m benchmarks.month WAREHOUSE.duckdb [DAYS]")
    print(json.dumps(extend(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) == 3 else DAYS), indent=2))


if __name__ == "__main__":
    main()
