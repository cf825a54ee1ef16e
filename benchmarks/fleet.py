"""`make bench`'s fleet section: twenty racks x seven days of minute rollups published to one
DuckLake (a real PostgreSQL catalog, Parquet files in a local data path), then the Fleet page read
over it.

1. A rack's week: the twin fast-forwards the bench rack (benchmarks/fleet-rack.toml) for 130 min
   at a 60 s scrape interval; the last hour it has wholly rolled up (minute and hour rollups,
   scrapes, placements, rebalances, request sums) is repeated back through the week, an hour
   earlier each time, into a rack file of rollups alone (its hours compacted as the writer does).
2. Publishing: `moemeter publish` of that file as each of the racks, two at a time (two cores),
   in day steps (a backlog caught up; 60-min steps would take the twenty racks' week two hours on
   two cores), each ending with the publisher's tidy: CPU per rack-minute, wall time. Then a day
   of the same rack in the default 60-min steps, and the source file in 1-min steps, as
   `serve --lake` does once caught up: CPU per rack-minute of each.
3. Bytes: the lake's Parquet files and its catalog database per rack-day, against the rack file's
   bytes per day.
4. The Fleet page: its data (dashboard/data/fleet.py, one read-only connection per rack as the
   page holds them) over the last hour, 24 h and 7 days, p50/p95 of repeated reads, and the time
   to open the racks' connections.

MOEMETER_BENCH_FLEET=RACKSxDAYSd (default 20x7d) sets the scale.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb

from dashboard.data.fleet import FleetWindow, fleet_lines
from moemeter.contract import windows
from tests.postgres import BIN, running_postgres
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.lake import SERIES, SHEETS, TABLES, connect, open_reader, table_files, watermarks
from warehouse.read import HOUR
from warehouse.rollup import compact_hours

from .pages import timed

ROOT = Path(__file__).parents[1]
PROFILE = Path(__file__).with_name("fleet-rack.toml")
SOURCE_SPAN = "130m"  # enough to hold one whole hour rolled up wherever the fast-forward starts
REPEATS = 10
BACKLOG_STEP_MINUTES = 24 * 60


def scale() -> tuple[int, int]:
    text = os.environ.get("MOEMETER_BENCH_FLEET", "20x7d")
    m = re.fullmatch(r"(\d+)x(\d+)d", text)
    if not m:
        sys.exit(f"MOEMETER_BENCH_FLEET={text!r}: give RACKSxDAYSd, e.g. 20x7d")
    return int(m.group(1)), int(m.group(2))


def repeated_hours(source: Path, out: Path, hours: int) -> datetime:
    """A rack file of `hours` of rollups: the source's last wholly rolled-up hour, repeated an hour
    earlier each time; returns where it ends (its rollup watermark)."""
    con = duckdb.connect(str(out))
    try:
        apply_migrations(con)
        con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        last = _one(con, "SELECT through FROM src.rollup_state WHERE name = '1h'")[0]
        end, first = last, last - timedelta(hours=hours)
        for name in (*SHEETS, SERIES):
            con.execute(f"INSERT INTO {name} SELECT * FROM src.{name}")
        con.execute("UPDATE targets SET first_seen = ?, last_seen = ?", [first, end])
        for t in TABLES:
            con.execute(
                f"""INSERT INTO {t.name} SELECT s.* REPLACE (s.ts - to_hours(r.k) AS ts)
                    FROM src.{t.name} s, range(?) r(k) WHERE s.ts >= ? AND s.ts < ?""",
                [hours, end - HOUR, end],
            )
        compact_hours(con, first, end)
        con.executemany(
            "INSERT INTO rollup_state VALUES (?, ?)",
            [
                ["1m", end],
                ["1h", end],
                ["requests_slo_1m", end],
                ["increments_from", end],
                ["increments_1m_from", first],
            ],
        )
        con.execute("CHECKPOINT")
    finally:
        con.close()
    return end


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    """The one row `sql` returns."""
    row = con.execute(sql).fetchone()
    assert row is not None, sql
    return row


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def publish(db: Path, uri: str, data: Path, rack: str, chunk_minutes: int = 60) -> int:
    """`moemeter publish` of `db` as `rack`; run again while it fails (a step that met other racks'
    commits ten times in a row), returns the runs it took."""
    argv = [sys.executable, "-m", "moemeter", "publish", "--db", str(db), "--lake", uri, "--lake-data", str(data)]
    for run in range(1, 6):
        done = subprocess.run(
            [*argv, "--rack", rack, "--chunk-minutes", str(chunk_minutes)], cwd=ROOT, capture_output=True, text=True
        )
        if done.returncode == 0:
            return run
        print(f"publish {rack}: run {run} failed: {done.stderr.strip()[-400:]}", file=sys.stderr, flush=True)
    raise RuntimeError(f"publish {rack} failed five times")


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def bench_fleet(tmp: Path) -> dict[str, object]:
    if BIN is None:
        return {"skipped": "needs Debian's postgresql package (make test installs it)"}
    n_racks, days = scale()
    source, week = tmp / "fleet-source.duckdb", tmp / "fleet-rack.duckdb"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "moemeter", "twin", "--profile", str(PROFILE), "--fast-forward", SOURCE_SPAN]
        + ["--interval", "60", "--db", str(source)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    end = repeated_hours(source, week, 24 * days)
    day = tmp / "fleet-rack-day.duckdb"
    repeated_hours(source, day, 24)
    built = time.perf_counter() - t0
    with duckdb.connect(str(week), read_only=True) as con:
        series = _one(con, f"SELECT count(*) FROM {SERIES}")[0]
        rows = {t.name: _one(con, f"SELECT count(*) FROM {t.name}")[0] for t in TABLES}
    rack_minutes = 24 * 60 * days
    racks = [f"rack-{i:02d}" for i in range(1, n_racks + 1)]
    result: dict[str, object] = {
        "racks": n_racks,
        "days": days,
        "rack_profile": PROFILE.name,
        "series_per_rack": series,
        "rows_per_rack_minute": round(sum(rows.values()) / rack_minutes),
        "rows_per_rack": rows,
        "rack_files_built_seconds": round(built, 1),
    }
    with running_postgres() as database:
        uri, data = database("fleet"), tmp / "lake-files"
        cpu0, wall0 = _cpu_children(), time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda r: publish(week, uri, data, r, BACKLOG_STEP_MINUTES), racks))
        cpu, wall = _cpu_children() - cpu0, time.perf_counter() - wall0
        result |= {
            "backlog_step_minutes": BACKLOG_STEP_MINUTES,
            "publish_wall_seconds": round(wall, 1),
            "publish_cpu_seconds": round(cpu, 1),
            "publish_cpu_seconds_per_rack_minute_backlog": round(cpu / (n_racks * rack_minutes), 5),
            "publish_reruns_after_conflicts": sum(runs) - len(runs),
        }
        cpu0 = _cpu_children()
        publish(day, uri, data, "hourly")  # the default step
        result["publish_cpu_seconds_per_rack_minute"] = round((_cpu_children() - cpu0) / (24 * 60), 5)
        # once caught up, `serve --lake` publishes a minute or so at a time
        cpu0 = _cpu_children()
        publish(source, uri, data, "steady", chunk_minutes=1)
        with duckdb.connect(str(source), read_only=True) as con:
            first, through = _one(
                con, "SELECT (SELECT min(ts) FROM scrapes), (SELECT through FROM rollup_state WHERE name = '1m')"
            )
        minutes = (through - first).total_seconds() / 60
        result["publish_cpu_seconds_per_rack_minute_1min_steps"] = round((_cpu_children() - cpu0) / minutes, 5)
        with open_reader(uri, data_path=str(data)) as con:
            lake_rows = _one(con, "SELECT count(*) FROM lake.increments_1m")[0]
        with connect(uri, str(data)) as con:  # the current snapshot's files (replaced ones wait KEEP_SNAPSHOTS)
            listed = table_files(con).values()
            files, lake_bytes = sum(f.data for f in listed), sum(f.bytes for f in listed)
        rack_days = n_racks * days + 1 + minutes / (24 * 60)
        per_day = {"lake": round(lake_bytes / rack_days), "rack_file": round(week.stat().st_size / days)}
        result |= {
            "lake_rows_increments_1m": lake_rows,
            "lake_files": files,
            "lake_megabytes": round(lake_bytes / 1e6, 1),
            "lake_data_path_megabytes_on_disk": round(_size(data) / 1e6, 1),
            "lake_bytes_per_rack_day": per_day["lake"],
            "rack_file_bytes_per_rack_day": per_day["rack_file"],
            "lake_over_rack_file_bytes": round(per_day["lake"] / per_day["rack_file"], 3),
        }
        result |= _fleet_page(uri, str(data), racks)
    result["ends_at"] = end.isoformat()
    return result


def _fleet_page(uri: str, data: str, racks: list[str]) -> dict[str, object]:
    """The Fleet page's data over each span, as the page reads it: one connection per rack."""
    t0 = time.perf_counter()
    with open_reader(uri, data_path=data) as con:
        marks = {r: t for r, t in watermarks(con).items() if r in racks}
    cons = {r: open_reader(uri, r, data) for r in racks}
    out: dict[str, object] = {"fleet_page_open_seconds": round(time.perf_counter() - t0, 2)}
    try:
        queries = {r: LocalQuery(c.cursor()) for r, c in cons.items()}
        for label in windows.FLEET:
            w = FleetWindow.ending(marks, windows.span(label))
            assert w is not None
            lines = fleet_lines(queries, w.start, w.end)
            p50, p95 = timed(lambda w=w: fleet_lines(queries, w.start, w.end), REPEATS)  # type: ignore[misc]
            out[f"fleet_page_{label}_p50_seconds"], out[f"fleet_page_{label}_p95_seconds"] = p50, p95
            out[f"fleet_page_{label}_cost_usd"] = round(float(lines["cost_usd"].sum()), 2)
    finally:
        for c in cons.values():
            c.close()
    return out


if __name__ == "__main__":
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(json.dumps(bench_fleet(Path(d)), indent=2, default=str))
