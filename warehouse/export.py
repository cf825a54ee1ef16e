"""Parquet export, partitioned by day (and by rack): the scale-out path (DuckDB or any Parquet
engine reads it).

Rows are read through the same SELECT-only contract the dashboard uses (a local read-only
connection or the query API), one day at a time, and written with pyarrow as
`<out>/<table>/day=YYYY-MM-DD/part-0.parquet`, or `<out>/<table>/rack=NAME/day=.../` when a
rack is named, so several racks' warehouses export into one dataset (join on rack and
series_id). Dimension tables (series, targets) are written whole. Outside the file, a series is
named by its key (named_by_key), so what one file exported joins what it exports after its series
were renumbered, and what another file of the same rack exports.
Re-exporting a day replaces that day's file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from moemeter.contract.errors import MoemeterError

from .read import Query
from .sql import sql

FACT_TABLES = (
    "samples",
    "increments",
    "scrapes",
    "increments_1m",
    "samples_1m",
    "increments_1h",
    "samples_1h",
    "expert_load",
    "expert_load_1h",
    "eplb_rebalances",
    "requests",
    "requests_1h",
    "requests_itl_1h",
    "requests_slo_1h",
    "requests_slo_1m",
)
TIME_COLUMN = {"requests": "finished_at"}  # the others partition by `ts`
SOURCE = {"requests": "request_records"}  # a record's own columns, not how migration 024 stores them
BY_SERIES = ("samples", "increments", "samples_1m", "increments_1m", "samples_1h", "increments_1h")
"""Tables whose rows name a series by its `series_id`."""
RACK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A rack's name: it becomes a Parquet folder, a lake partition, a Prometheus label value and FOCUS
account and resource ids."""


class RackNameError(MoemeterError, ValueError):
    """A rack name outside RACK_NAME."""


def check_rack(name: str) -> str:
    if not RACK_NAME.fullmatch(name or ""):
        raise RackNameError(
            f"rack name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def host_rack(given: str | None = None) -> str:
    """The rack given, else this host's name as a rack name: the rack a command or page names when
    it is given none."""
    import socket

    if given:
        return given
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).lstrip("._-")[:64] or "rack"


DIMENSION_TABLES = (
    "series",
    "targets",
    "expert_placement",
    "gpu_prices",
    "token_prices",
    "slo_classes",
    "slo_assignments",
    "request_feeds",
)


def named_by_key(table: str, where: str = "TRUE") -> str:
    """The statement that reads the rows of `table` that `where` keeps (a condition from a file of
    warehouse/sql, over the table's own columns: the lake's window edges), every series named by
    its key: `series_id` is a number of this file (migration 015), the key (a hash of target, name
    and labels) is the series' identity wherever its rows go, the lake and exports."""
    if table == "series":
        statement = sql("export_series")
    elif table in BY_SERIES:
        statement = sql("export_by_key", table=table)
    else:
        statement = sql("export_rows", table=table)
    return statement.replace("/*where*/", where)


class ExportError(MoemeterError, ValueError):
    """The export cannot be done as asked."""


@dataclass(frozen=True)
class Exported:
    table: str
    day: date | None
    rows: int
    path: Path


def _days(start: datetime, end: datetime) -> list[date]:
    first, last = start.date(), (end - timedelta(microseconds=1)).date()
    return [first + timedelta(days=i) for i in range((last - first).days + 1)]


def export_parquet(
    q: Query,
    out: Path,
    start: datetime,
    end: datetime,
    tables: tuple[str, ...] = FACT_TABLES + DIMENSION_TABLES,
    chunk: timedelta = timedelta(minutes=10),
    rack: str | None = None,
) -> list[Exported]:
    """Write [start, end) of every fact table by day (read `chunk` at a time, so memory stays
    bounded), and the dimension tables whole; under `rack=NAME/` when a rack is named."""
    if rack is not None:
        check_rack(rack)
    unknown = sorted(set(tables) - set(FACT_TABLES) - set(DIMENSION_TABLES))
    if unknown:
        raise ExportError(f"unknown tables {unknown}; known: {sorted(FACT_TABLES + DIMENSION_TABLES)}")
    if end <= start:
        raise ExportError(f"empty window: --to {end.isoformat()} is not after --from {start.isoformat()}")
    done: list[Exported] = []
    for table in tables:
        base = out / table / f"rack={rack}" if rack else out / table
        if table in DIMENSION_TABLES:
            tbl = pa.Table.from_pandas(q(named_by_key(table), None), preserve_index=False)
            done.append(_write([tbl], base / "all.parquet", table, None))
            continue
        for day in _days(start, end):
            lo = max(start, datetime.combine(day, datetime.min.time()))
            hi = min(end, datetime.combine(day + timedelta(days=1), datetime.min.time()))
            parts = []
            t = lo
            while t < hi:
                t_next = min(hi, t + chunk)
                window = {"from": t, "until": t_next}
                if table in BY_SERIES:
                    df = q(sql("export_chunk_by_key", table=table), window)
                else:
                    source, time = SOURCE.get(table, table), TIME_COLUMN.get(table, "ts")
                    df = q(sql("export_chunk", table=source, time=time), window)
                if len(df):
                    parts.append(pa.Table.from_pandas(df, preserve_index=False))
                t = t_next
            if parts:
                done.append(_write(parts, base / f"day={day.isoformat()}" / "part-0.parquet", table, day))
    return done


def _write(parts: list[pa.Table], path: Path, table: str, day: date | None) -> Exported:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    with pq.ParquetWriter(tmp, parts[0].schema, compression="zstd") as writer:
        for part in parts:
            writer.write_table(part.cast(parts[0].schema))
    tmp.replace(path)  # a reader never sees half a file
    return Exported(table, day, sum(p.num_rows for p in parts), path)
