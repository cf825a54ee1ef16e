"""Bytes on disk per scraped sample: the warehouse against Prometheus's TSDB, on the same samples.

The twin fast-forwards MOEMETER_BENCH_STORAGE (default 15m) of the whole rack at `serve`'s 5 s
scrape interval into a DuckDB file. Each raw table (`samples`, `increments`) is copied alone, in
its order, into a file of its own and checkpointed: its used blocks per scraped sample. The same
samples, written out as OpenMetrics with their timestamps (the target as `instance`), go through
`promtool tsdb create-blocks-from openmetrics`: the block directory's bytes per sample, what a
Prometheus head compaction leaves for them. The gateway's request records of the same span are
copied alone as well: bytes per record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa

from moemeter.contract import DEFAULT_INTERVAL
from warehouse.db import computed_columns
from warehouse.sql import sql

ROOT = Path(__file__).parents[1]
RAW_TABLES = ("samples", "increments")


def used_bytes(con: duckdb.DuckDBPyConnection) -> int:
    """Bytes of the blocks a checkpointed DuckDB file uses (free blocks not counted)."""
    return int(con.execute("SELECT used_blocks * block_size FROM pragma_database_size()").fetchall()[0][0])


def table_bytes(db: Path, table: str, tmp: Path) -> int:
    """Bytes the table takes on its own: made as the warehouse makes it (columns it computes as they
    are read stay computed), its stored columns copied in their order into a fresh file, checkpointed."""
    alone = tmp / f"{table}.duckdb"
    alone.unlink(missing_ok=True)
    with duckdb.connect(str(alone)) as con:
        con.execute(f"ATTACH '{db}' AS src (READ_ONLY)")
        con.execute(con.execute(sql("db_table_ddl"), {"database": "src", "table": table}).fetchall()[0][0])
        con.execute(f"INSERT INTO {table} SELECT {stored(con, table, 'src')} FROM src.{table}")
        con.execute("DETACH src")
        con.execute("CHECKPOINT")
        size = used_bytes(con)
    alone.unlink()
    return size


def stored(con: duckdb.DuckDBPyConnection, table: str, database: str | None = None) -> str:
    """A select list of the table's stored columns: *, less those it computes as they are read."""
    computed = computed_columns(con, table, database)
    return f"* EXCLUDE ({', '.join(computed)})" if computed else "*"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


BLOCK_ORIGIN_MS = 1_796_400_000_000  # a multiple of Prometheus's 2 h block range


def openmetrics(db: Path, out: Path) -> int:
    """Every sample with a value, as OpenMetrics lines with its timestamp; returns how many. The
    timestamps are moved so the first is BLOCK_ORIGIN_MS: up to two hours of samples then make one
    block, as a head compaction would write them, wherever the 2 h boundaries fell on the clock."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT series_id, target, metric, labels, le FROM series").fetchall()
        heads = []
        for sid, target, metric, labels, le in rows:
            pairs = {"instance": target, **json.loads(labels)}
            if le is not None:
                pairs["le"] = "+Inf" if le == float("inf") else repr(le)
            heads.append((sid, metric + "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs.items()) + "}"))
        con.register("heads", pa.table({"series_id": [h[0] for h in heads], "head": [h[1] for h in heads]}))
        n, first = con.execute("SELECT count(value), epoch_ms(min(ts)) FROM readings").fetchall()[0]
        con.execute(
            f"""COPY (SELECT h.head || ' ' || CASE WHEN isnan(x.value) THEN 'NaN' WHEN x.value = 'inf'::DOUBLE THEN '+Inf'
                                               WHEN x.value = '-inf'::DOUBLE THEN '-Inf' ELSE x.value::VARCHAR END
                             || ' ' || ((epoch_ms(x.ts) - $first + $origin) / 1000)::VARCHAR AS line
                      FROM readings x JOIN heads h USING (series_id) WHERE x.value IS NOT NULL ORDER BY x.ts, x.series_id)
                TO '{out}' (FORMAT csv, HEADER false, QUOTE '', ESCAPE '', DELIMITER '\x01')""",
            {"first": first, "origin": BLOCK_ORIGIN_MS},
        )
    with out.open("a") as f:
        f.write("# EOF\n")
    return int(n)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_storage(tmp: Path) -> dict[str, object]:
    span = os.environ.get("MOEMETER_BENCH_STORAGE", "15m")
    db = tmp / "storage.duckdb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "moemeter",
            "twin",
            "--fast-forward",
            span,
            "--interval",
            f"{DEFAULT_INTERVAL:g}",
            "--db",
            str(db),
        ],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    with duckdb.connect(str(db)) as con:
        con.execute("CHECKPOINT")
        scraped = con.execute("SELECT count(*) FROM readings").fetchall()[0][0]
        file_bytes = used_bytes(con)
    out: dict[str, object] = {"span": span, "scrape_interval_seconds": DEFAULT_INTERVAL, "samples": scraped}
    raw = 0
    for table in RAW_TABLES:
        size = table_bytes(db, table, tmp)
        raw += size
        out[f"{table}_bytes_per_sample"] = round(size / scraped, 2)
    out["raw_bytes_per_sample"] = round(raw / scraped, 2)
    out["file_bytes_per_sample"] = round(file_bytes / scraped, 2)  # rollups and request records too
    with duckdb.connect(str(db), read_only=True) as con:
        records = con.execute("SELECT count(*) FROM requests").fetchall()[0][0]
    out["request_records"] = records
    out["request_bytes_per_record"] = round(table_bytes(db, "requests", tmp) / records, 1)
    promtool = shutil.which("promtool")
    if promtool is None:
        out["prometheus"] = "skipped: no promtool (Debian package prometheus)"
        return out
    text, blocks = tmp / "samples.om", tmp / "blocks"
    with_value = openmetrics(db, text)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "-q", str(text), str(blocks)], check=True)
    text.unlink()
    prom = dir_bytes(blocks) / with_value
    out["prometheus_samples"] = with_value
    out["prometheus_bytes_per_sample"] = round(prom, 2)
    out["raw_over_prometheus_bytes_per_sample"] = round(raw / scraped / prom, 2)
    return out
