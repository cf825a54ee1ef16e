"""The fleet's DuckLake: every rack publishes what has closed; one reader sees any rack through the
warehouse's own table names.

A DuckLake keeps its catalog in a database (PostgreSQL for a fleet) and its rows as Parquet files
under a data path (a shared directory or an object store). Each rack's `serve --lake` (or
`moemeter publish`) copies the rows of its rollups, request sums, rebalances, scrapes and sheets
into lake tables of the same names with a `rack` column, in one lake transaction per step that also
moves the rack's watermarks (`lake_state`): a step that is killed before it commits leaves the lake
as it was, and the next one starts where the last commit left off.

What a step copies is the window `[since, through)` of each table, replacing the rack's rows there:
`through` is the local rollup watermark (at most `chunk` past the last step), `since` the last
published watermark, moved back to the earliest period that the rows rolled since then reach into
(a raw increment covering a long interval adds to minutes already published; a request finished an
hour ago adds to that hour). Replacing, not appending, makes a step idempotent: publishing the same
minute twice leaves one copy. Rebalance events, which never change, are appended instead: those of
the window the lake does not hold yet. Each publisher also tidies the lake's files (tidy).

Readers (`moemeter query|report|export --lake`, the Fleet page) attach the lake read-only in an
in-memory DuckDB that holds the warehouse's schema (its migrations), and turn each published table
into a view of one rack's rows: the read layer (warehouse/read.py) and every statement in
warehouse/sql then run on a rack of the lake as on its own file. Tables not published (raw samples
and increments, request records) read empty there, and `rollup_state` says the raw rows before the
published watermark were dropped, so every window is served by the rollups.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from moemeter.errors import MoemeterError

from .db import apply_migrations
from .export import RACK_NAME, named_by_key
from .read import HOUR, MINUTE, floor
from .readonly import lock_down
from .rollup import compacted

log = logging.getLogger(__name__)

CHUNK = timedelta(hours=1)
"""The most a step publishes past the last one (a rack's first step over a month of rollups takes
a month's worth of steps, each a bounded transaction)."""
EVENT_LATENESS = timedelta(hours=1)
"""How far before the published watermark a rebalance event may still arrive (it carries the
exporter's clock): each step looks this far back for events the lake does not hold yet."""
EVENTS = "eplb_rebalances"
"""Appended, never replaced: the warehouse keeps the first copy of each event (INSERT OR IGNORE),
so a step inserts the events of its window the lake does not hold, keyed (target, ts, layer)."""
CONFLICT_TRIES = 10
"""A commit that conflicts with another writer's (DuckLake refuses a commit that deletes from a
table another commit inserted into meanwhile, whatever the partition) is tried again, then left to
the next round."""
LOCK_DB = "lake_commits"
"""The catalog's PostgreSQL database attached once more, plainly, for the commit lock."""
COMMIT_LOCK = 0x6D6F656D
"""The PostgreSQL advisory lock every writer of a lake commits under: racks that delete and insert
at once conflict on nearly every step (two racks catching up in lockstep failed ten tries in a
row), so their transactions take turns. Held by a transaction of its own until the lake's commits,
released by PostgreSQL when a killed writer's session ends."""
LOCK_WAIT = "120s"
"""How long a writer waits for the commit lock before the step fails (and the next round tries)."""
TIDY_EVERY = timedelta(minutes=10)
"""How often a writer tidies the lake's files (tidy): each step writes a Parquet file per table
and deletes rows of the last ones (a week of 60-min steps left 8,056 files and 3,996 delete files
for four racks, and a rack's Fleet line took twice as long to read)."""
MERGED_FILE_BYTES = 64 * 2**20
"""Files this large or larger are left as they are when files are merged (each tidy rewrites only
what is small, so a year of history is not rewritten every ten minutes)."""
KEEP_SNAPSHOTS = timedelta(hours=1)
"""How long a snapshot that a tidy replaced stays readable, and its files on disk: a read that
started on it (a Fleet page, a report) finishes on it."""


class LakeError(MoemeterError, RuntimeError):
    """The lake cannot be opened, read or written as asked."""


@dataclass(frozen=True)
class Table:
    """A published table: its window's edges, named by the watermark they follow.

    `clock`: the local watermark a window ends at ('1m', '1h' or 'requests_slo_1m');
    `reach`: what moves the window's start back (None: nothing, rows arrive in time order;
    'increments' or 'requests': the earliest period the newly rolled rows add to);
    `period`: the rollup period its `ts` is stamped with (the start's floor; a request's rows are
    stamped with the period it finished in, which the gateway's clock may put past the rollup's
    watermark: those are published when the watermark has passed them);
    `whole`: the window ends at its last whole period (the writer adds to the open hour of
    increments_1h each minute, and readers take hour rows only for hours before the minute
    watermark's: the open hour is published once, when it has closed)."""

    name: str
    clock: str
    reach: str | None = None
    period: timedelta = MINUTE
    whole: bool = False
    column: str = "ts"

    def edges(self, since: datetime | None, end: datetime | None) -> tuple[str, list[Any]]:
        """The SQL condition (and its parameters) for the rows of [since, end) of this table (None:
        unbounded on that side)."""
        where, params = ["TRUE"], []
        if end is not None:
            where.append(f"{self.column} < ?")
            params.append(floor(end, self.period) if self.whole else end)
        if since is not None:
            where.append(f"{self.column} >= ?")
            params.append(since)
        return " AND ".join(where), params

    def overlaps(self, since: datetime | None, published: datetime | None) -> bool:
        """Whether the lake may hold rows of a window from `since` already: a rack's rows of this
        table end where its watermark `published` ends them (at its last whole period for
        `whole`)."""
        if since is None or published is None:
            return True
        return since < (floor(published, self.period) if self.whole else published)


TABLES = (
    Table("increments_1m", "1m", "increments"),
    Table("increments_1h", "1m", "increments", HOUR, whole=True),  # split into hours as minutes close
    Table("samples_1m", "1m"),
    Table("samples_1h", "1h", period=HOUR),
    Table("scrapes", "1m"),
    Table("expert_placement", "1m"),
    Table(EVENTS, "1m"),
    Table("expert_load_1h", "1h", period=HOUR),
    Table("requests_1h", "1h", "requests", HOUR),
    Table("requests_itl_1h", "1h", "requests", HOUR),
    Table("requests_slo_1h", "1h", "requests", HOUR),
    Table("requests_slo_1m", "requests_slo_1m", "requests"),
)
SHEETS = ("targets", "gpu_prices", "token_prices", "slo_classes", "slo_assignments")
"""Small tables published whole whenever they differ from the lake's copy."""
SERIES = "series"
"""Appended: a series id names the same series for ever (its rows are never changed). In the lake a
series' id is its key (export.named_by_key), as a rack's file numbered series before migration 015;
rows published before that have no `series_key`, and a rack's view takes the id for it."""
STATE = "lake_state"
CLOCKS = ("1m", "1h", "requests_slo_1m")


def check_rack(name: str) -> str:
    if not RACK_NAME.fullmatch(name or ""):
        raise LakeError(
            f"rack name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


# ------------------------------------------------------------------------------------- connecting
def _extension(module: str) -> Path:
    """The extension file a PyPI wheel (duckdb-extension-<name>) ships for this DuckDB."""
    try:
        mod = __import__(module)
    except ImportError as exc:
        raise LakeError(f"the lake needs the {module.replace('_', '-')} wheel (pip install -e .)") from exc
    folder = Path(mod.__file__ or ".").parent / "extensions" / f"v{duckdb.__version__}"
    found = sorted(folder.glob("*.duckdb_extension"))
    if not found:
        raise LakeError(
            f"{module.replace('_', '-')} has no extension for DuckDB {duckdb.__version__} ({folder}): "
            "install the wheel of the same version as duckdb"
        )
    return found[0]


@functools.cache
def _postgres_scanner() -> Path:
    """The postgres extension under the file name DuckDB takes its entry point from
    (postgres_scanner), copied once per process and removed at exit. A copy per connection was a
    new library to the loader each time: a process crashed (segmentation fault) at its 199th or
    200th lake connection (tests/warehouse/test_lake.py)."""
    folder = Path(tempfile.mkdtemp(prefix="moemeter-ext-"))
    atexit.register(shutil.rmtree, folder, True)
    scanner = folder / "postgres_scanner.duckdb_extension"
    shutil.copyfile(_extension("duckdb_extension_postgres"), scanner)
    return scanner


def _load_extensions(con: duckdb.DuckDBPyConnection) -> None:
    """LOAD ducklake and postgres from their wheels (never from the network)."""
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute(f"LOAD '{_postgres_scanner()}'")
    con.execute(f"LOAD '{_extension('duckdb_extension_ducklake')}'")


def catalog_uri(uri: str) -> str:
    """`ducklake:<catalog>` for a catalog connection string: `postgres:dbname=lake host=...`, or
    a DuckDB file for a lake on one machine."""
    uri = uri.strip()
    if not uri:
        raise LakeError("--lake needs a catalog, e.g. 'postgres:dbname=lake host=/run/postgresql'")
    return uri if uri.startswith("ducklake:") else f"ducklake:{uri}"


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def connect(uri: str, data_path: str | None = None, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the lake attached as `lake` (created on the first write when the
    catalog is empty; its data path then defaults to `<catalog dir>/lake.files` for a file catalog
    and must be given for PostgreSQL)."""
    options = []
    if data_path:
        options.append(f"DATA_PATH {_quoted(str(data_path))}")
    if read_only:
        options.append("READ_ONLY")
    for attempt in range(1, CONFLICT_TRIES + 1):
        con = duckdb.connect()
        try:
            _load_extensions(con)
            con.execute(f"ATTACH {_quoted(catalog_uri(uri))} AS lake" + (f" ({', '.join(options)})" if options else ""))
            postgres = catalog_uri(uri).removeprefix("ducklake:")
            if not read_only and postgres.startswith("postgres:"):
                con.execute(f"ATTACH {_quoted(postgres.removeprefix('postgres:'))} AS {LOCK_DB} (TYPE postgres)")
            return con
        except duckdb.Error as exc:
            con.close()
            if "Failed to initialize DuckLake" in str(exc) and attempt < CONFLICT_TRIES:
                # two racks creating a new lake's catalog at once: the other one's is there next time
                time.sleep(random.uniform(0.1, 0.3) * attempt)
                continue
            hint = "" if data_path else " (a new lake needs --lake-data: where its Parquet files go)"
            raise LakeError(f"cannot attach the lake {uri!r}: {exc}{hint}") from exc
    raise AssertionError("unreachable")


def data_path_of(con: duckdb.DuckDBPyConnection) -> str:
    """Where the attached lake keeps its files (readers may read there and nowhere else)."""
    row = con.execute("SELECT value FROM ducklake_options('lake') WHERE option_name = 'data_path'").fetchone()
    if row is None:
        raise LakeError("the lake does not say where its data files are")
    return str(row[0])


# ---------------------------------------------------------------------------------------- schema
def _columns(con: duckdb.DuckDBPyConnection, database: str, table: str) -> list[tuple[str, str]]:
    return [
        (str(n), str(t))
        for n, t in con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? AND table_name = ? "
            "AND schema_name = 'main' ORDER BY column_index",
            [database, table],
        ).fetchall()
    ]


def _templates(con: duckdb.DuckDBPyConnection) -> None:
    """The warehouse's tables, empty, in this connection's own database (its migrations)."""
    apply_migrations(con)


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the lake's tables (the warehouse's columns and `rack`, partitioned by rack) and add
    the columns a later migration gave the warehouse; one transaction, retried on a conflict with
    another rack doing the same."""
    _templates(con)
    wanted = [t.name for t in TABLES] + list(SHEETS) + [SERIES]

    def create() -> None:
        for name in wanted:
            have = dict(_columns(con, "lake", name))
            cols = _columns(con, "memory", name)
            if not have:
                body = ", ".join(f'"{c}" {t}' for c, t in [("rack", "VARCHAR"), *cols])
                con.execute(f"CREATE TABLE lake.{name} ({body})")
                con.execute(f"ALTER TABLE lake.{name} SET PARTITIONED BY (rack)")
                continue
            for c, t in cols:
                if c not in have:
                    con.execute(f'ALTER TABLE lake.{name} ADD COLUMN "{c}" {t}')
        if not _columns(con, "lake", STATE):
            con.execute(
                f"CREATE TABLE lake.{STATE} (rack VARCHAR, name VARCHAR, through TIMESTAMP, published_at TIMESTAMP)"
            )

    retry_conflicts(con, create)


@contextmanager
def commit_lock(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Hold the lake's commit lock (COMMIT_LOCK) for the block: a lake on PostgreSQL only (a lake
    on a DuckDB file has one writer: DuckDB locks the file)."""
    if not con.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = ?", [LOCK_DB]).fetchall()[0][0]:
        yield
        return
    lock = con.cursor()
    try:
        lock.execute("BEGIN TRANSACTION")
        try:
            lock.execute(
                f"CALL postgres_execute('{LOCK_DB}', "
                f"'SET LOCAL lock_timeout = ''{LOCK_WAIT}''; SELECT pg_advisory_xact_lock({COMMIT_LOCK})')"
            )
        except duckdb.Error as exc:
            raise LakeError(f"waited {LOCK_WAIT} for the lake's commit lock, held by another writer: {exc}") from exc
        yield
    finally:
        try:
            lock.execute("ROLLBACK")  # ends the lock's transaction: PostgreSQL releases it
        finally:
            lock.close()


def _transaction(con: duckdb.DuckDBPyConnection, job: Callable[[], Any]) -> Any:
    """job() in one transaction of `con`: committed if it returns, rolled back if it raises."""
    con.execute("BEGIN TRANSACTION")
    try:
        out = job()
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    return out


def retry_conflicts(con: duckdb.DuckDBPyConnection, job: Callable[[], Any]) -> Any:
    """Run job in a lake transaction under the commit lock; on a commit conflict with another
    writer (one that does not take the lock: DuckLake's own maintenance), roll back and run it
    again (it reads the lake afresh), up to CONFLICT_TRIES times."""
    for attempt in range(1, CONFLICT_TRIES + 1):
        try:
            with commit_lock(con):
                return _transaction(con, job)
        except duckdb.Error as exc:
            if "conflict" not in str(exc).lower() or attempt == CONFLICT_TRIES:
                raise
            log.info("lake: a commit conflicted with another writer (%s); trying again", exc)
            time.sleep(random.uniform(0.05, 0.2) * attempt)  # apart from the rack it met
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Tidied:
    """What one tidy did: data files rewritten without their deleted rows, files merged into
    larger ones, snapshots expired, and files removed from disk (replaced or orphaned)."""

    rewritten: int
    merged: int
    expired: int
    removed: int


def tidy(con: duckdb.DuckDBPyConnection) -> Tidied:
    """DuckLake's maintenance, for every rack's files (its partitions keep racks apart): rewrite the
    files that have deleted rows, merge small files of a table and rack (up to MERGED_FILE_BYTES),
    expire the snapshots older than KEEP_SNAPSHOTS and remove the files no snapshot reads any more
    and those no commit ever named (once they too are that old). Under the commit lock; the rows
    any snapshot reads are unchanged."""

    def count(call: str) -> int:
        # its own transaction: left to autocommit while the lock's transaction was open on another
        # cursor, a rewrite and a merge reported their files and committed none (DuckLake 1.5.5)
        row = _transaction(con, lambda: con.execute(f"SELECT count(*) FROM {call}").fetchone())
        return int(row[0]) if row else 0

    keep = f"now() - INTERVAL {int(KEEP_SNAPSHOTS.total_seconds())} SECOND"
    with commit_lock(con):
        rewritten = count("ducklake_rewrite_data_files('lake', delete_threshold => 0)")
        merged = count(f"ducklake_merge_adjacent_files('lake', max_file_size => {MERGED_FILE_BYTES})")
        expired = count(f"ducklake_expire_snapshots('lake', older_than => {keep})")
    removed = count(f"ducklake_cleanup_old_files('lake', older_than => {keep})")  # deletes files: no lock needed
    # files no commit names (a writer killed mid-step), as old: a step in flight commits long before
    removed += count(f"ducklake_delete_orphaned_files('lake', older_than => {keep})")
    return Tidied(rewritten, merged, expired, removed)


@dataclass(frozen=True)
class Files:
    """A lake table's files in the current snapshot: data files, delete files, their bytes."""

    data: int
    deletes: int
    bytes: int


def table_files(con: duckdb.DuckDBPyConnection) -> dict[str, Files]:
    """Each lake table's files in the current snapshot (a few rows are inlined in the catalog, in no
    file; files a replaced snapshot still reads wait KEEP_SNAPSHOTS on disk, not counted here)."""
    out = {}
    for name in [t.name for t in TABLES] + [*SHEETS, SERIES]:
        row = con.execute(
            "SELECT count(*), count(delete_file), "
            "coalesce(sum(data_file_size_bytes + coalesce(delete_file_size_bytes, 0)), 0) "
            "FROM ducklake_list_files('lake', ?)",
            [name],
        ).fetchone()
        out[name] = Files(*(int(v) for v in row)) if row else Files(0, 0, 0)
    return out


# -------------------------------------------------------------------------------------- publishing
@dataclass(frozen=True)
class Step:
    """What one publishing step committed: the watermarks it moved to and the rows it wrote."""

    rack: str
    through: dict[str, datetime]
    rows: dict[str, int]

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


def published(con: duckdb.DuckDBPyConnection, rack: str) -> dict[str, datetime]:
    """The rack's watermarks in the lake (name -> through); empty before its first step."""
    rows = con.execute(f"SELECT name, through FROM lake.{STATE} WHERE rack = ?", [rack]).fetchall()
    return {str(n): t for n, t in rows}


def _local_state(local: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    return {str(n): t for n, t in local.execute("SELECT name, through FROM rollup_state").fetchall()}


def _earliest(local: duckdb.DuckDBPyConnection) -> datetime | None:
    """The oldest row of any published table: where a rack's first step starts."""
    oldest = ", ".join(f"(SELECT min({t.column}) FROM {t.name})" for t in TABLES)
    row = local.execute(f"SELECT least({oldest})").fetchone()
    return row[0] if row else None


def _targets(
    local: duckdb.DuckDBPyConnection, before: dict[str, datetime], chunk: timedelta
) -> dict[str, datetime] | None:
    """Where this step's windows end, per clock: the local watermarks, at most `chunk` past the last
    step's 1m (None: nothing new has closed)."""
    state = _local_state(local)
    if state.get("1m") is None:
        return None
    start = before.get("1m")
    if start is None:
        first = _earliest(local)
        if first is None:
            return None
        start = floor(first, HOUR)
    end = min(state["1m"], start + chunk)
    if end <= start:
        return None
    out = {"1m": end}
    if state.get("1h") is not None:
        out["1h"] = min(state["1h"], floor(end, HOUR))
    if state.get("requests_slo_1m") is not None:
        out["requests_slo_1m"] = min(state["requests_slo_1m"], end)
    return out


def _since(
    local: duckdb.DuckDBPyConnection, table: Table, before: dict[str, datetime], end: datetime
) -> datetime | None:
    """Where this step's window of `table`, ending at `end`, starts (None: from its first row)."""
    start = before.get(table.clock)
    if start is None:
        return None
    hours = compacted(start, end).get(table.name)
    if hours is not None:  # the writer compacted rows published before (rollup.compact_hours, compact_minutes)
        start = hours[0]
    if table.name == EVENTS:
        return start - EVENT_LATENESS
    if table.reach == "increments":  # the rows rolled since: raw increments closed in [start, ...)
        row = local.execute(
            "SELECT min(ts - to_microseconds(round(seconds * 1e6)::BIGINT)) FROM increments WHERE ts >= ?", [start]
        ).fetchone()
    elif table.reach == "requests":  # the records rolled since, which add to the period they finished in
        row = local.execute(
            "SELECT min(finished_at) FROM requests WHERE ingested_at >= ? AND ingested_at < ?", [start, end]
        ).fetchone()
    else:
        return floor(start, table.period)
    reached = row[0] if row and row[0] is not None else start
    return floor(min(start, reached), table.period)


def _window(local: duckdb.DuckDBPyConnection, table: Table, since: datetime | None, through: datetime) -> pa.Table:
    where, params = table.edges(since, through)
    return local.execute(named_by_key(table.name, where), params).to_arrow_table()


def _event_list(batch: pa.Table) -> list[tuple[Any, ...]]:
    return list(zip(*(batch.column(c).to_pylist() for c in ("target", "ts", "layer"))))


def _row_set(table: pa.Table) -> set[tuple[Any, ...]]:
    return set(zip(*(table.column(c).to_pylist() for c in table.column_names)))


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> set[tuple[Any, ...]]:
    return set(con.execute(sql, params).fetchall())


class Publisher:
    """Publishes one rack's closed rows from a local warehouse connection into the lake."""

    def __init__(self, lake: duckdb.DuckDBPyConnection, rack: str, chunk: timedelta = CHUNK) -> None:
        if chunk < MINUTE:
            raise LakeError(f"a publishing step spans at least a minute, not {chunk}")
        self.lake, self.rack, self.chunk = lake, check_rack(rack), chunk
        ensure_schema(lake)
        self._series: set[int] | None = None
        self._sheets: dict[str, set[tuple[Any, ...]]] | None = None  # each sheet's rows, as last committed
        self._tidied: float | None = None  # time.monotonic() of the last tidy
        self._events: set[tuple[Any, ...]] | None = None  # the (target, ts, layer) the lake holds, lately

    def step(self, local: duckdb.DuckDBPyConnection) -> Step | None:
        """Publish the next window (at most `chunk`); None when nothing new has closed. `local` is a
        connection of the caller's own to the warehouse: it is read in one transaction, so the
        rows and the watermarks are one snapshot."""
        local.execute("BEGIN TRANSACTION")
        try:
            before = published(self.lake, self.rack)
            through = _targets(local, before, self.chunk)
            if through is None:
                return None
            batches: dict[str, tuple[datetime | None, datetime, pa.Table]] = {}
            for t in TABLES:
                end = through.get(t.clock)
                if end is None:
                    continue
                since = _since(local, t, before, end)
                batches[t.name] = (since, end, _window(local, t, since, end))
            sheets = {name: local.execute(f"SELECT * FROM {name}").to_arrow_table() for name in SHEETS}
            sheet_rows = {name: _row_set(table) for name, table in sheets.items()}
            series = local.execute(named_by_key(SERIES)).to_arrow_table()
            kept_minutes = _local_state(local).get("increments_1m_from")
        finally:
            local.execute("COMMIT")
        done = retry_conflicts(
            self.lake, lambda: self._commit(before, through, batches, sheets, sheet_rows, series, kept_minutes)
        )
        # only once committed: an attempt that conflicted and was rolled back published nothing
        assert self._series is not None
        self._series.update(series.column("series_id").to_pylist())
        self._sheets = sheet_rows
        if EVENTS in batches and self._events is not None:  # the events of this window and on
            since, _, events = batches[EVENTS]
            self._events = {k for k in self._events | set(_event_list(events)) if since is None or k[1] >= since}
        return done

    def _commit(
        self,
        before: dict[str, datetime],
        through: dict[str, datetime],
        batches: dict[str, tuple[datetime | None, datetime, pa.Table]],
        sheets: dict[str, pa.Table],
        sheet_rows: dict[str, set[tuple[Any, ...]]],
        series: pa.Table,
        kept_minutes: datetime | None,
    ) -> Step:
        lake, rack = self.lake, self.rack
        rows: dict[str, int] = {}
        for t in TABLES:
            if t.name not in batches:
                continue
            since, end, batch = batches[t.name]
            if t.name == EVENTS:
                rows[t.name] = self._insert(t.name, self._unpublished_events(t, since, batch))
                continue
            # a delete costs a look at the rack's files. A publisher's first commit replaces its
            # windows whatever the watermarks say, and removes any row past them: request sums an
            # older version published before their period had rolled up would be counted twice.
            first = self._sheets is None  # set once this publisher has committed
            if first or t.overlaps(since, before.get(t.clock)):
                where, params = t.edges(since, None if first else end)
                lake.execute(f"DELETE FROM lake.{t.name} WHERE rack = ? AND {where}", [rack, *params])
            rows[t.name] = self._insert(t.name, batch)
        for name, table in sheets.items():
            here = sheet_rows[name]
            if self._sheets is not None:  # as the last commit left them
                there = self._sheets[name]
            else:
                cols = ", ".join(f'"{c}"' for c in table.column_names)
                there = _rows(lake, f"SELECT {cols} FROM lake.{name} WHERE rack = ?", [rack])
            if here != there:
                lake.execute(f"DELETE FROM lake.{name} WHERE rack = ?", [rack])
                rows[name] = self._insert(name, table)
        if self._series is None:
            self._series = {
                int(r[0])
                for r in lake.execute(f"SELECT series_id FROM lake.{SERIES} WHERE rack = ?", [rack]).fetchall()
            }
        ids = series.column("series_id").to_pylist()
        new = [i for i, v in enumerate(ids) if v not in self._series]
        if new:
            rows[SERIES] = self._insert(SERIES, series.take(pa.array(new, pa.int64())))
        state = dict(through)
        if before.get("increments_1m_from") is not None or kept_minutes is not None:
            # the oldest minute rows the lake holds were the local ones at the first step
            state["increments_1m_from"] = before.get("increments_1m_from") or kept_minutes  # type: ignore[assignment]
        lake.execute(f"DELETE FROM lake.{STATE} WHERE rack = ?", [rack])
        lake.executemany(
            f"INSERT INTO lake.{STATE} VALUES (?, ?, ?, now()::TIMESTAMP)",
            [[rack, name, t] for name, t in sorted(state.items())],
        )
        return Step(rack, through, rows)

    def _unpublished_events(self, table: Table, since: datetime | None, batch: pa.Table) -> pa.Table:
        """The events of the batch (those of its window, from `since`) the lake does not hold."""
        if self._events is None:
            where, params = table.edges(since, None)
            self._events = {
                tuple(r)
                for r in self.lake.execute(
                    f"SELECT target, ts, layer FROM lake.{EVENTS} WHERE rack = ? AND {where}", [self.rack, *params]
                ).fetchall()
            }
        held = self._events
        new = [i for i, k in enumerate(_event_list(batch)) if k not in held]
        return batch.take(pa.array(new, pa.int64()))

    def _insert(self, name: str, batch: pa.Table) -> int:
        if batch.num_rows == 0:
            return 0
        self.lake.register("_publish_batch", batch)
        try:
            self.lake.execute(f"INSERT INTO lake.{name} BY NAME SELECT ? AS rack, * FROM _publish_batch", [self.rack])
        finally:
            self.lake.unregister("_publish_batch")
        return batch.num_rows

    def catch_up(self, local: duckdb.DuckDBPyConnection, stop: Callable[[], bool] = lambda: False) -> list[Step]:
        """Steps until nothing new has closed (or `stop()`), tidying the lake after a step when the
        last tidy is TIDY_EVERY old."""
        done = []
        while not stop():
            s = self.step(local)
            if s is None:
                break
            done.append(s)
            if self._tidied is None or time.monotonic() - self._tidied >= TIDY_EVERY.total_seconds():
                self.tidy()
        return done

    def tidy(self) -> Tidied | None:
        """tidy(), logged; None when it failed (publishing goes on, the next one tries again)."""
        self._tidied = time.monotonic()
        try:
            done = tidy(self.lake)
        except (duckdb.Error, LakeError) as exc:
            log.warning("lake: tidying its files failed (publishing goes on): %s", exc)
            return None
        log.info("lake: tidied (%s)", done)
        return done


# ---------------------------------------------------------------------------------------- reading
def racks(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Racks that have published, by name."""
    if not _columns(con, "lake", STATE):
        return []
    return [str(r[0]) for r in con.execute(f"SELECT DISTINCT rack FROM lake.{STATE} ORDER BY rack").fetchall()]


def watermarks(con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    """Each rack's minute watermark: what it has published is before it."""
    if not _columns(con, "lake", STATE):
        return {}
    rows = con.execute(f"SELECT rack, through FROM lake.{STATE} WHERE name = '1m' ORDER BY rack").fetchall()
    return {str(r): t for r, t in rows}


def rack_view(con: duckdb.DuckDBPyConnection, rack: str) -> None:
    """Make this connection's own tables one rack's view of the lake (see the module docstring)."""
    check_rack(rack)
    _templates(con)
    r = _quoted(rack)
    for name in [t.name for t in TABLES] + list(SHEETS) + [SERIES]:
        cols = [c for c, _ in _columns(con, "memory", name)]
        con.execute(f"DROP TABLE IF EXISTS main.{name}")
        body = ", ".join('"series_id" AS "series_key"' if c == "series_key" else f'"{c}"' for c in cols)
        con.execute(f"CREATE VIEW main.{name} AS SELECT {body} FROM lake.{name} WHERE rack = {r}")
    con.execute("DROP TABLE IF EXISTS main.rollup_state")
    con.execute(
        f"""CREATE VIEW main.rollup_state AS
            SELECT name, through FROM lake.{STATE} WHERE rack = {r}
            UNION ALL  -- no raw rows in the lake: those before the published minute were 'dropped'
            SELECT 'increments_from', through FROM lake.{STATE} WHERE rack = {r} AND name = '1m'"""
    )
    con.execute(
        "CREATE OR REPLACE VIEW series_targets AS "
        "SELECT s.*, t.role, t.gpus, t.hostname FROM series s JOIN targets t ON s.target = t.name"
    )


def open_reader(uri: str, rack: str | None = None, data_path: str | None = None) -> duckdb.DuckDBPyConnection:
    """A locked-down read-only connection to the lake: `lake.<table>` holds every rack's rows; with
    a rack, the warehouse's table names are that rack's (rack_view)."""
    con = connect(uri, data_path, read_only=True)
    try:
        if rack is not None:
            if rack not in racks(con):
                known = ", ".join(racks(con)) or "none yet"
                raise LakeError(f"rack {rack!r} has published nothing to this lake (racks: {known})")
            rack_view(con, rack)
        folder = data_path_of(con)
        if "://" not in folder:  # a local data path: readers may read its files and nothing else
            con.execute(f"SET allowed_directories = [{_quoted(os.path.abspath(folder))}]")
        lock_down(con)
    except BaseException:
        con.close()
        raise
    return con


# ------------------------------------------------------------------------------------- the loop
@dataclass
class PublishHealth:
    """What `serve --lake` knows of its publishing (GET /health, key `lake`)."""

    rack: str = ""
    through: str = ""  # the rack's minute watermark in the lake
    steps: int = 0  # steps committed since start
    rows: int = 0  # rows written by them
    error: str = ""  # the last failure's message while failing, else ""
    failing_since: str = ""

    def as_json(self) -> dict[str, object]:
        return dict(self.__dict__)


class PublishLoop:
    """`serve --lake`: a thread that publishes the rack's closed rows every `every` seconds from a
    reader cursor of the warehouse, reconnecting to the lake after a failure (nothing is lost: the
    next step starts at the lake's watermark)."""

    def __init__(
        self,
        cursor: Callable[[], duckdb.DuckDBPyConnection],
        uri: str,
        data_path: str | None,
        rack: str,
        every: float = 60.0,
        chunk: timedelta = CHUNK,
    ) -> None:
        if chunk < MINUTE or every <= 0:
            raise LakeError(
                f"publish every {every:g} s in steps of {chunk}: both must be positive, a step a minute or more"
            )
        self._cursor, self.uri, self.data_path = cursor, uri, data_path
        self.rack, self.every, self.chunk = check_rack(rack), every, chunk
        self.health = PublishHealth(rack)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lake-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        lake: duckdb.DuckDBPyConnection | None = None
        publisher: Publisher | None = None
        local = self._cursor()
        try:
            while True:
                try:
                    if publisher is None:
                        lake = connect(self.uri, self.data_path)
                        publisher = Publisher(lake, self.rack, self.chunk)
                    for s in publisher.catch_up(local, self._stop.is_set):
                        self.health.steps += 1
                        self.health.rows += s.total_rows
                        self.health.through = s.through["1m"].isoformat()
                    if self.health.error:
                        log.info("lake: publishing again (rack %s, through %s)", self.rack, self.health.through)
                    self.health.error = self.health.failing_since = ""
                except (duckdb.Error, LakeError) as exc:
                    if str(exc) != self.health.error:
                        log.error(
                            "lake: publishing rack %s failed: %s; trying again in %g s", self.rack, exc, self.every
                        )
                    if not self.health.failing_since:
                        self.health.failing_since = datetime.now().isoformat(timespec="seconds")
                    self.health.error = str(exc)
                    if lake is not None:
                        lake.close()
                    lake, publisher = None, None
                    try:
                        local.execute("ROLLBACK")
                    except duckdb.Error:
                        pass
                if self._stop.wait(self.every):
                    return
        finally:
            local.close()
            if lake is not None:
                lake.close()
