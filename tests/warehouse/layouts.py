"""Warehouse files for the tests: rounds of two real pages as the writer stores them, and files as
an older writer left them, for the tests of the migrations that convert them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

import duckdb

from collectors.parse import parse_page
from moemeter.contract import TargetInfo
from warehouse.db import migrations
from warehouse.ingest import Ingestor, ScrapeBatch

DENSE_IDS = 15  # the migration since which series ids are numbers the writer gives, not hashes
COUNTERS_ONCE = 16  # since which `samples` keeps a counter's reading only where increments cannot give it
POOL_HISTOGRAMS = 17  # since which the writer keeps histogram buckets summed per pool (pool_histograms_1m, _1h)
COMPACT_MINUTES = 18  # since which the minute rows of a closed hour are one per series and minute, series by series
SIX_MINUTES = 19  # since which the writer keeps six-minute rollups (increments_6m, pool_histograms_6m)
MARKERS = {"pool_histograms": POOL_HISTOGRAMS, "increments_6m": SIX_MINUTES}
"""rollup_state rows that say the file keeps a kind of rollup, and the migration that brought it."""


def _tables(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main' AND NOT internal "
        "AND table_name IN (SELECT table_name FROM duckdb_tables()) ORDER BY table_name, column_index"
    ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def written_before(new: duckdb.DuckDBPyConnection, version: int, path: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A warehouse (in memory, or a new file at `path`) with only the migrations before `version`,
    holding the rows of `new` (a warehouse the current writer wrote) in the same order, as the
    writer of that time stored them: before DENSE_IDS, a series' id was its key (a hash of target,
    name and labels); before COUNTERS_ONCE, `samples` held every reading (the `readings` view); before
    POOL_HISTOGRAMS, no pool rollups; before SIX_MINUTES, no six-minute ones."""
    old = duckdb.connect(path)
    old.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
    for v, name, text in migrations():
        if v < version:
            old.execute(text)
            old.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [v, name])
    have = _tables(new)
    for table, columns in _tables(old).items():
        if table == "schema_migrations" or table not in have:
            continue
        picked = ", ".join(f'x."{c}"' for c in columns)
        every_reading = version <= COUNTERS_ONCE and table == "samples"
        source, order = ("readings", "x.ts, x.series_id") if every_reading else (table, "x.rowid")
        if version <= DENSE_IDS and "series_id" in columns:
            picked = picked.replace('x."series_id"', "s.series_key AS series_id")
            rows = new.execute(f"SELECT {picked} FROM {source} x JOIN series s USING (series_id) ORDER BY {order}")
        elif table == "rollup_state":  # no marker of the rollups the file does not keep yet
            later = [name for name, since in MARKERS.items() if version <= since]
            rows = new.execute(f"SELECT {picked} FROM {source} x WHERE name <> ALL(?) ORDER BY {order}", [later])
        else:
            rows = new.execute(f"SELECT {picked} FROM {source} x ORDER BY {order}")
        old.register("_rows", rows.to_arrow_table())
        verb = "INSERT OR REPLACE" if table == "rollup_state" else "INSERT"  # a migration may have put a row there
        old.execute(f"{verb} INTO {table} BY NAME SELECT * FROM _rows")
        old.unregister("_rows")
    return old


FIXTURES = Path(__file__).parents[1] / "fixtures"
DECODE = TargetInfo("decode-0", "http://d/metrics", "decode", 1, "test")
ROUTER = TargetInfo("router", "http://r/metrics", "router", 0, "test")
T0 = datetime(2026, 11, 30, 10, 0, 0)
LATE_SERIES = '# TYPE moemeter_test_late_total counter\nmoemeter_test_late_total{x="1"} 5\n'


def round_pages(k: int) -> list[tuple[TargetInfo, bytes]]:
    """Round k of two real pages, every value grown with k. The router's prefix-routing series stop
    after round 70; a counter first appears in round 90, at the top of the decode page."""

    def grown(text: str) -> str:
        return re.sub(r"^(\S+) (\S+)$", lambda m: f"{m[1]} {float(m[2]) * (k + 1)!r}", text, flags=re.MULTILINE)

    decode = (FIXTURES / "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").read_text()
    router = (FIXTURES / "vllm-router-0.1.17-pd.metrics.txt").read_text()
    if k > 70:
        router = "\n".join(line for line in router.splitlines() if "prefix_routing" not in line) + "\n"
    if k >= 90:
        decode = LATE_SERIES + decode
    return [(DECODE, grown(decode).encode()), (ROUTER, grown(router).encode())]


def write_rounds(
    con: duckdb.DuckDBPyConnection, rounds: range, ingestor: Ingestor | None = None, offset: float = 0.0
) -> None:
    """Round k of round_pages scraped at T0 + k minutes + `offset` seconds (off the minute, each
    interval adds to two minutes)."""
    ing = ingestor or Ingestor()
    for k in rounds:
        ts = T0 + timedelta(minutes=k, seconds=offset)
        ing.write_all(con, [ScrapeBatch(t, ts, True, 0.01, parse_page(body)) for t, body in round_pages(k)])
