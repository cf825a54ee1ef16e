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

On a PostgreSQL catalog each rack publishes as a PostgreSQL role of its own, and the catalog itself
refuses a write of a rack's rows by any other role, whatever SQL it sends (GUARD_SQL: triggers on
DuckLake's tables, installed by the lake's owner, the role that owns them). docs/operations.md says
what that protects and what it does not (the data path).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import random
import re
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
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import duckdb
import pyarrow as pa

from moemeter.contract.errors import MoemeterError

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


SEARCH_PATH = "pg_catalog,pg_temp"
"""The search path of every session moemeter opens on a lake's PostgreSQL catalog. Publishers may create
objects in schema public (DuckLake asks CREATE there for its inlined deletions), and PostgreSQL resolves a
name by the session's search path, taking the best match of argument types wherever it lies: an operator
`public.=(varchar, varchar)` a publisher made would run in the lake's owner's sessions, as the owner
(CVE-2018-1058). DuckLake and moemeter name every table with its schema, so they need none."""
_CONNINFO_PAIR = re.compile(r"\s*(\w+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|((?:[^\s'\\]|\\.)*))")
"""A keyword = value pair of libpq's connection string (a value quoted, or not, with backslash escapes)."""


def pinned(conninfo: str) -> str:
    """A PostgreSQL connection string (libpq's `keyword=value ...` or a `postgresql://` URI) that pins
    the session's search path to SEARCH_PATH, after the options it gives (the last `-c` of a setting
    wins; libpq takes `options` from PGOPTIONS only when the string gives none)."""
    pin = f"-c search_path={SEARCH_PATH}"
    if re.match(r"postgres(ql)?://", conninfo):
        parts = urlsplit(conninfo)
        query = parse_qsl(parts.query, keep_blank_values=True)
        options = [v for k, v in query if k == "options"] or [os.environ.get("PGOPTIONS", "")]
        query = [(k, v) for k, v in query if k != "options"] + [("options", f"{options[-1]} {pin}".strip())]
        return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
    given, at, end = os.environ.get("PGOPTIONS", ""), 0, len(conninfo.rstrip())
    while at < end:
        pair = _CONNINFO_PAIR.match(conninfo, at)
        if pair is None or pair.end() == at:
            raise LakeError(f"cannot read the catalog's connection string from {conninfo[at:]!r}")
        if pair.group(1) == "options":
            given = re.sub(r"\\(.)", r"\1", pair.group(2) if pair.group(2) is not None else pair.group(3))
        at = pair.end()
    value = f"{given} {pin}".strip().replace("\\", "\\\\").replace("'", "\\'")
    return f"{conninfo.rstrip()} options='{value}'"


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
            catalog = catalog_uri(uri).removeprefix("ducklake:")
            if catalog.startswith("postgres:"):  # every session on it, DuckLake's and the lock's (SEARCH_PATH)
                catalog = "postgres:" + pinned(catalog.removeprefix("postgres:"))
            con.execute(
                f"ATTACH {_quoted('ducklake:' + catalog)} AS lake" + (f" ({', '.join(options)})" if options else "")
            )
            if not read_only and catalog.startswith("postgres:"):
                con.execute(f"ATTACH {_quoted(catalog.removeprefix('postgres:'))} AS {LOCK_DB} (TYPE postgres)")
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


def _missing(con: duckdb.DuckDBPyConnection, wanted: list[str]) -> list[str]:
    """The lake tables and columns this version publishes that the lake lacks."""
    out = []
    for name in wanted:
        have = dict(_columns(con, "lake", name))
        out += [name] if not have else [f"{name}.{c}" for c, _ in _columns(con, "memory", name) if c not in have]
    return out + ([STATE] if not _columns(con, "lake", STATE) else [])


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create the lake's tables (the warehouse's columns and `rack`, partitioned by rack) and add
    the columns a later migration gave the warehouse; one transaction, retried on a conflict with
    another rack doing the same. On a PostgreSQL catalog, the lake's owner then installs the guard
    (install_guard): a lake it has guarded changes its schema by its owner alone."""
    _templates(con)
    wanted = [t.name for t in TABLES] + list(SHEETS) + [SERIES]
    g = guard_of(con)
    if g is not None and g.installed and not g.is_owner and (missing := _missing(con, wanted)):
        raise LakeError(
            f"the lake lacks {', '.join(missing)}, which this version publishes: its owner, role {g.owner}, "
            "adds them (`moemeter lake setup`)"
        )

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
    if g is not None and g.is_owner:
        try:
            install_guard(con)
        except LakeError as exc:
            if g.installed:
                raise
            # a lake made before the guard, by a role that cannot install it: it publishes as it did
            log.warning("lake: left unguarded (any role that writes the lake may write any rack): %s", exc)


@contextmanager
def commit_lock(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Hold the lake's commit lock (COMMIT_LOCK) for the block: a lake on PostgreSQL only (a lake
    on a DuckDB file has one writer: DuckDB locks the file)."""
    if not _on_postgres(con):
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

    g = guard_of(con)
    if g is not None and g.installed and not g.is_owner:
        raise LakeError(f"tidying rewrites every rack's files: only the lake's owner, role {g.owner}, may")
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


# -------------------------------------------------------------------------------------- the guard
GUARD_VERSION = 2
"""The version of the guard's functions (GUARD_SQL); a lake's owner installs a newer one on sight. 2: a
file lies in its rack's folder at a path no other file names; only publishers may call check_rack."""
PUBLISHERS = "moemeter_publisher"
"""The PostgreSQL group role of the racks' publishers, if the operator made one: the guard grants it
what a publisher writes (each table once it is guarded) and the claim of a rack (moemeter.check_rack).
Each rack logs in with a role of its own in it."""
READERS = "moemeter_reader"
"""The PostgreSQL group role whose members may read the lake, if the operator made one: the guard grants
it SELECT on each table of the catalog, and nothing else."""
GUARD_TRIGGER = "moemeter_guard"
"""The name of the guard's trigger on each table of the catalog (the commit's check adds `_commit`)."""
GUARD_LOCK = COMMIT_LOCK + 1
"""The advisory lock an install of the guard takes: two owners' publishers starting at once install it
one after the other."""
DUCKLAKE_CATALOG = "1.0"
"""The DuckLake catalog version the guard knows: it names DuckLake's tables and what each row means."""
GUARD_SQL = r"""
-- moemeter's guard on a DuckLake 1.0 catalog in PostgreSQL (warehouse/lake.py): each rack's rows are
-- written by the role that owns the rack, checked here, whatever SQL a publisher sends.
CREATE SCHEMA IF NOT EXISTS moemeter;
GRANT USAGE ON SCHEMA moemeter TO PUBLIC;
CREATE TABLE IF NOT EXISTS moemeter.rack_owners (
    rack varchar PRIMARY KEY,
    owner name NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON moemeter.rack_owners FROM PUBLIC;
GRANT SELECT ON moemeter.rack_owners TO PUBLIC;
CREATE INDEX IF NOT EXISTS moemeter_guard_snapshot_id ON public.ducklake_snapshot (snapshot_id);
CREATE INDEX IF NOT EXISTS moemeter_guard_file_id ON public.ducklake_data_file (data_file_id);
CREATE INDEX IF NOT EXISTS moemeter_guard_partition_file ON public.ducklake_file_partition_value (data_file_id);
CREATE INDEX IF NOT EXISTS moemeter_guard_stats_file ON public.ducklake_file_column_stats (data_file_id);

-- the lake's owner: the role that owns DuckLake's tables (it made the lake), and its members
CREATE OR REPLACE FUNCTION moemeter.owner() RETURNS name
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = 'public.ducklake_metadata'::regclass
$$;

CREATE OR REPLACE FUNCTION moemeter.is_owner() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_has_role(session_user, moemeter.owner(), 'MEMBER')
$$;

CREATE OR REPLACE FUNCTION moemeter.refuse(what text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'lake guard: %', what USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE OR REPLACE FUNCTION moemeter.owner_only(what text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT moemeter.is_owner() THEN
        PERFORM moemeter.refuse(format('role %s may not %s: only the lake''s owner, role %s, may', session_user,
            what, moemeter.owner()));
    END IF;
END $$;

-- the rack's owner, claimed by the session's role when nobody owns it yet
CREATE OR REPLACE FUNCTION moemeter.claim_rack(r varchar) RETURNS name
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE o name;
BEGIN
    SELECT owner INTO o FROM moemeter.rack_owners WHERE rack = r;
    IF NOT FOUND THEN
        INSERT INTO moemeter.rack_owners (rack, owner) VALUES (r, session_user) ON CONFLICT (rack) DO NOTHING;
        SELECT owner INTO o FROM moemeter.rack_owners WHERE rack = r;
    END IF;
    RETURN o;
END $$;

-- refuses unless the session's role owns rack r (or is the lake's owner); `what` says what was tried
CREATE OR REPLACE FUNCTION moemeter.check_rack(r varchar, what text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE o name;
BEGIN
    IF r IS NOT NULL THEN
        o := moemeter.claim_rack(r);
    END IF;
    IF moemeter.is_owner() THEN
        RETURN;
    END IF;
    IF r IS NULL THEN
        PERFORM moemeter.refuse(format('role %s may not %s rows that name no rack', session_user, what));
    END IF;
    IF r !~ '^{rack_name}$' THEN  -- the folder of its files is rack=<r>/: one name, no path
        PERFORM moemeter.refuse(format('role %s may not %s rows of rack %L: a rack is named by 1-64 letters, '
            'digits, ''.'', ''_'' or ''-'', starting with a letter or digit', session_user, what, r));
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = o) AND pg_has_role(session_user, o, 'MEMBER') THEN
        RETURN;
    END IF;
    PERFORM moemeter.refuse(format('rack %L belongs to role %s; role %s may not %s its rows', r, o,
        session_user, what));
END $$;

-- the rack an inlined row names (DuckLake 1.0 keeps a VARCHAR inline as bytea)
CREATE OR REPLACE FUNCTION moemeter.row_rack(j jsonb, kind text) RETURNS varchar
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE kind WHEN 'bytea' THEN convert_from(decode(substr(j->>'rack', 3), 'hex'), 'UTF8')
                     WHEN 'text' THEN j->>'rack' END
$$;

-- the racks a data file's partition names (one, for a file a rack wrote)
CREATE OR REPLACE FUNCTION moemeter.file_racks(fid bigint) RETURNS varchar[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(pv.partition_value), '{}')
    FROM public.ducklake_data_file f
    JOIN public.ducklake_partition_column pc
      ON pc.partition_id = f.partition_id AND pc.table_id = f.table_id AND pc.transform = 'identity'
    JOIN public.ducklake_file_partition_value pv
      ON pv.data_file_id = f.data_file_id AND pv.partition_key_index = pc.partition_key_index
    WHERE f.data_file_id = fid
      AND EXISTS (SELECT 1 FROM public.ducklake_column c
                  WHERE c.table_id = f.table_id AND c.column_id = pc.column_id AND c.column_name = 'rack')
$$;

CREATE OR REPLACE FUNCTION moemeter.file_rack(fid bigint) RETURNS varchar
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN cardinality(r) = 1 THEN r[1] END FROM (SELECT moemeter.file_racks(fid) AS r) x
$$;

-- a new data file: one rack in its partition, the writer's; its statistics say so; lake_state stays inline
CREATE OR REPLACE FUNCTION moemeter.check_file(fid bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    copies bigint; tid bigint; tname varchar; racks varchar[]; seen bigint; bad bigint; f record;
BEGIN
    SELECT count(*), min(table_id) INTO copies, tid FROM public.ducklake_data_file WHERE data_file_id = fid;
    IF copies = 0 OR moemeter.is_owner() THEN
        RETURN;  -- gone again in the same transaction (a merge's intermediate file), or the owner's
    END IF;
    SELECT table_name INTO tname FROM public.ducklake_table WHERE table_id = tid ORDER BY begin_snapshot DESC LIMIT 1;
    IF copies > 1 THEN
        PERFORM moemeter.refuse(format('data file id %s of table %s is used twice', fid, tname));
    END IF;
    IF tname = 'lake_state' THEN
        PERFORM moemeter.refuse(format('role %s may not write lake_state in a data file: a rack''s watermarks '
            'are a few rows, written inline where each is checked', session_user));
    END IF;
    racks := moemeter.file_racks(fid);
    IF cardinality(racks) <> 1 THEN
        PERFORM moemeter.refuse(format('role %s may not write a data file of table %s that names %s racks '
            'in its partition (one, its own)', session_user, tname, cardinality(racks)));
    END IF;
    PERFORM moemeter.check_rack(racks[1], 'write');
    SELECT count(*), count(*) FILTER (WHERE s.min_value IS DISTINCT FROM racks[1] OR s.max_value IS DISTINCT FROM racks[1]
                                        OR s.null_count IS DISTINCT FROM 0)
      INTO seen, bad
      FROM public.ducklake_file_column_stats s
     WHERE s.data_file_id = fid
       AND s.column_id IN (SELECT column_id FROM public.ducklake_column WHERE table_id = tid AND column_name = 'rack');
    IF seen = 0 OR bad > 0 THEN
        PERFORM moemeter.refuse(format('the statistics of a data file of table %s must say that its rack column '
            'holds %L alone', tname, racks[1]));
    END IF;
    SELECT path, path_is_relative INTO f FROM public.ducklake_data_file WHERE data_file_id = fid;
    PERFORM moemeter.check_path('data', tid, racks[1], f.path, f.path_is_relative, 1);
END $$;

-- a <= b, as values of the DuckLake type typ (statistics are kept as text)
CREATE OR REPLACE FUNCTION moemeter.stat_le(a varchar, b varchar, typ varchar) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF a = b THEN
        RETURN true;
    ELSIF typ ~ '^u?int(8|16|32|64|128)$' OR typ LIKE 'decimal%' THEN
        RETURN a::numeric <= b::numeric;
    ELSIF typ IN ('float32', 'float64') THEN
        RETURN a::float8 <= b::float8;
    ELSIF typ LIKE 'timestamptz%' THEN
        RETURN a::timestamptz <= b::timestamptz;
    ELSIF typ LIKE 'timestamp%' OR typ = 'date' THEN
        RETURN a::timestamp <= b::timestamp;
    ELSIF typ = 'boolean' THEN
        RETURN a::boolean <= b::boolean;
    ELSIF typ IN ('varchar', 'blob', 'uuid') THEN
        RETURN a COLLATE "C" <= b COLLATE "C";  -- DuckDB orders strings by their bytes
    END IF;
    RETURN false;  -- a type not ordered here: its statistics may only stay as they are
EXCEPTION WHEN others THEN
    RETURN false;
END $$;

-- ---------------------------------------------------------------------------------------- triggers
-- an inlined row (ducklake_inlined_data_*): written, and ended, by its rack's owner; removed by the lake's
CREATE OR REPLACE FUNCTION moemeter.guard_inlined() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM moemeter.owner_only(format('remove rows of %s', TG_TABLE_NAME));
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF OLD.end_snapshot IS NOT NULL OR NEW.end_snapshot IS NULL
           OR (to_jsonb(NEW) - 'end_snapshot') IS DISTINCT FROM (to_jsonb(OLD) - 'end_snapshot') THEN
            PERFORM moemeter.owner_only(format('change rows of %s other than by ending them', TG_TABLE_NAME));
            RETURN NEW;
        END IF;
        PERFORM moemeter.check_rack(moemeter.row_rack(to_jsonb(OLD), TG_ARGV[0]), 'delete');
        RETURN NEW;
    END IF;
    PERFORM moemeter.check_rack(moemeter.row_rack(to_jsonb(NEW), TG_ARGV[0]), 'write');
    RETURN NEW;
END $$;

-- ducklake_data_file, ducklake_delete_file: a rack's owner may end or remove a file of its rack (DuckLake
-- removes a delete file that a larger one replaces); the rest is the lake's owner's
CREATE OR REPLACE FUNCTION moemeter.guard_file_rows() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RETURN NEW;  -- checked at commit, with its partition and statistics
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM moemeter.check_rack(moemeter.file_rack(OLD.data_file_id), 'remove');
        RETURN OLD;
    END IF;
    IF OLD.end_snapshot IS NOT NULL OR NEW.end_snapshot IS NULL
       OR (to_jsonb(NEW) - 'end_snapshot') IS DISTINCT FROM (to_jsonb(OLD) - 'end_snapshot') THEN
        PERFORM moemeter.owner_only(format('change rows of %s other than by ending a live file', TG_TABLE_NAME));
        RETURN NEW;
    END IF;
    PERFORM moemeter.check_rack(moemeter.file_rack(OLD.data_file_id), 'delete');
    RETURN NEW;
END $$;

-- what is said of a data file (partition, statistics) and inlined deletions: added (checked at commit),
-- and removed with the file or by its rack's owner
CREATE OR REPLACE FUNCTION moemeter.guard_file_facts() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE fid bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        RETURN NEW;
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM moemeter.owner_only(format('change rows of %s', TG_TABLE_NAME));
        RETURN NEW;
    END IF;
    fid := coalesce(to_jsonb(OLD)->>'data_file_id', to_jsonb(OLD)->>'file_id')::bigint;
    IF EXISTS (SELECT 1 FROM public.ducklake_data_file WHERE data_file_id = fid) THEN
        PERFORM moemeter.check_rack(moemeter.file_rack(fid), 'remove');
    END IF;
    RETURN OLD;
END $$;

-- a file scheduled for deletion: the lake's owner's cleanup deletes it from the data path. A rack's
-- writer may schedule a file no longer in the catalog (one its commit removed), under the data path
CREATE OR REPLACE FUNCTION moemeter.file_name(path varchar) RETURNS varchar
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT substring(path from '[^/]*$')
$$;
CREATE INDEX IF NOT EXISTS moemeter_guard_data_file_name ON public.ducklake_data_file (moemeter.file_name(path));
CREATE INDEX IF NOT EXISTS moemeter_guard_delete_file_name ON public.ducklake_delete_file (moemeter.file_name(path));

-- a file a rack's writer adds: relative, in rack=<r>/ under its table's folder (a delete file also in the table's
-- folder itself, where DuckLake writes them), named as no other data or delete file of the catalog (`own`: the
-- rows that are this file, 1 or 0 once removed again). The owner's cleanup deletes the path of each file ended
-- and expired: a file at the path of another rack's, ended by its writer, would delete that one
CREATE OR REPLACE FUNCTION moemeter.check_path(kind text, tid bigint, r varchar, fpath varchar, frelative boolean,
                                               own bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    folder varchar := 'rack=' || r || '/';
    fname varchar := CASE WHEN starts_with(fpath, folder) THEN substr(fpath, length(folder) + 1)
                          WHEN kind = 'delete' THEN fpath END;
    tname varchar;
BEGIN
    SELECT table_name INTO tname FROM public.ducklake_table WHERE table_id = tid ORDER BY begin_snapshot DESC LIMIT 1;
    IF frelative IS NOT TRUE OR fname IS NULL OR fname !~ '^[A-Za-z0-9][A-Za-z0-9._-]*\.parquet$' THEN
        PERFORM moemeter.refuse(format('role %s may not add a %s file of table %s at %s%L: a file of rack %L is a '
            'Parquet file in %s', session_user, kind, tname, CASE WHEN frelative THEN '' ELSE 'the absolute path ' END,
            fpath, r, CASE kind WHEN 'delete' THEN format('its table''s folder or in %s under it', folder)
                                ELSE format('%s under its table''s folder', folder) END));
    END IF;
    IF (SELECT count(*) FROM public.ducklake_data_file WHERE moemeter.file_name(path) = fname)
       + (SELECT count(*) FROM public.ducklake_delete_file WHERE moemeter.file_name(path) = fname) > own THEN
        PERFORM moemeter.refuse(format('role %s may not add a %s file of table %s at %L: the catalog names a file %L '
            'already, which the lake''s cleanup would delete with it', session_user, kind, tname, fpath, fname));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION moemeter.guard_scheduled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM moemeter.owner_only(format('change or remove rows of %s', TG_TABLE_NAME));
    ELSIF NOT moemeter.is_owner() AND (NOT NEW.path_is_relative OR NEW.path LIKE '/%' OR NEW.path ~ '(^|/)\.\.(/|$)') THEN
        PERFORM moemeter.refuse(format('role %s may not schedule %s for deletion: a path outside the data path',
            session_user, NEW.path));
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION moemeter.commit_scheduled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT moemeter.is_owner()
       AND (EXISTS (SELECT 1 FROM public.ducklake_data_file WHERE moemeter.file_name(path) = moemeter.file_name(NEW.path))
            OR EXISTS (SELECT 1 FROM public.ducklake_delete_file
                       WHERE moemeter.file_name(path) = moemeter.file_name(NEW.path))) THEN
        PERFORM moemeter.refuse(format('role %s may not schedule %s for deletion: the catalog still names it',
            session_user, NEW.path));
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION moemeter.commit_file() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM moemeter.check_file(NEW.data_file_id);
    RETURN NULL;
END $$;

-- a delete file or inlined deletion: of rows of the writer's rack; a delete file where check_path says
CREATE OR REPLACE FUNCTION moemeter.commit_deletes() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rec jsonb := to_jsonb(NEW);
    fid bigint := coalesce(rec->>'data_file_id', rec->>'file_id')::bigint;
    r varchar := moemeter.file_rack(fid);
BEGIN
    PERFORM moemeter.check_rack(r, 'delete');
    IF TG_TABLE_NAME = 'ducklake_delete_file' AND NOT moemeter.is_owner() THEN
        PERFORM moemeter.check_path('delete', (rec->>'table_id')::bigint, r, rec->>'path',
            (rec->>'path_is_relative')::boolean,
            (SELECT count(*) FROM public.ducklake_delete_file WHERE delete_file_id = (rec->>'delete_file_id')::bigint));
    END IF;
    RETURN NULL;
END $$;

-- a snapshot follows the last one, with the same schema; history is changed by the lake's owner
CREATE OR REPLACE FUNCTION moemeter.guard_snapshot() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE last record;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM moemeter.owner_only(format('change or remove rows of %s', TG_TABLE_NAME));
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    IF moemeter.is_owner() THEN
        RETURN NEW;
    END IF;
    SELECT * INTO last FROM public.ducklake_snapshot ORDER BY snapshot_id DESC LIMIT 1;
    IF NEW.snapshot_id <= last.snapshot_id OR NEW.schema_version IS DISTINCT FROM last.schema_version
       OR NEW.next_catalog_id IS DISTINCT FROM last.next_catalog_id OR NEW.next_file_id < last.next_file_id THEN
        PERFORM moemeter.refuse(format('role %s may not add snapshot %s after snapshot %s: a rack''s commit '
            'follows the last one and changes no schema', session_user, NEW.snapshot_id, last.snapshot_id));
    END IF;
    RETURN NEW;
END $$;

-- at commit: every table of the catalog is the owner's (a table a publisher made would be unguarded)
CREATE OR REPLACE FUNCTION moemeter.commit_catalog() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE t record;
BEGIN
    IF moemeter.is_owner() THEN
        RETURN NULL;
    END IF;
    SELECT c.relname, pg_get_userbyid(c.relowner) AS owner INTO t
      FROM pg_class c
     WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
       AND c.relname LIKE 'ducklake%'
       AND pg_get_userbyid(c.relowner) <> moemeter.owner()
     LIMIT 1;
    IF FOUND THEN
        PERFORM moemeter.refuse(format('table %s of the catalog belongs to role %s, not to the lake''s owner: '
            'nothing commits until it is dropped', t.relname, t.owner));
    END IF;
    RETURN NULL;
END $$;

-- who committed: the session's role, whatever the writer says
CREATE OR REPLACE FUNCTION moemeter.guard_author() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        PERFORM moemeter.owner_only(format('change or remove rows of %s', TG_TABLE_NAME));
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    NEW.author := session_user;
    RETURN NEW;
END $$;

-- a table's counts: row ids never go back (a reused id would end another rack's rows with the writer's)
CREATE OR REPLACE FUNCTION moemeter.guard_table_stats() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM moemeter.owner_only(format('remove rows of %s', TG_TABLE_NAME));
        RETURN OLD;
    ELSIF moemeter.is_owner() THEN
        RETURN NEW;
    ELSIF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM public.ducklake_table_stats WHERE table_id = NEW.table_id) THEN
            PERFORM moemeter.refuse(format('table %s has its counts already', NEW.table_id));
        END IF;
    ELSIF NEW.table_id <> OLD.table_id OR NEW.next_row_id < OLD.next_row_id THEN
        PERFORM moemeter.refuse(format('role %s may not move table %s''s next row id back', session_user,
            OLD.table_id));
    END IF;
    RETURN NEW;
END $$;

-- a table's column statistics only widen (narrowed, a reader would skip rows that are there)
CREATE OR REPLACE FUNCTION moemeter.guard_column_stats() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE typ varchar;
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM moemeter.owner_only(format('remove rows of %s', TG_TABLE_NAME));
        RETURN OLD;
    ELSIF moemeter.is_owner() THEN
        RETURN NEW;
    ELSIF TG_OP = 'INSERT' THEN
        IF EXISTS (SELECT 1 FROM public.ducklake_table_column_stats
                   WHERE table_id = NEW.table_id AND column_id = NEW.column_id) THEN
            PERFORM moemeter.refuse(format('column %s of table %s has its statistics already', NEW.column_id,
                NEW.table_id));
        END IF;
    ELSE
        SELECT column_type INTO typ FROM public.ducklake_column
         WHERE table_id = OLD.table_id AND column_id = OLD.column_id ORDER BY begin_snapshot DESC LIMIT 1;
        IF NEW.table_id <> OLD.table_id OR NEW.column_id <> OLD.column_id
           OR (OLD.contains_null AND NOT coalesce(NEW.contains_null, false))
           OR (OLD.contains_nan AND NOT coalesce(NEW.contains_nan, false))
           OR (OLD.min_value IS NOT NULL AND (NEW.min_value IS NULL
                                              OR NOT moemeter.stat_le(NEW.min_value, OLD.min_value, typ)))
           OR (OLD.max_value IS NOT NULL AND (NEW.max_value IS NULL
                                              OR NOT moemeter.stat_le(OLD.max_value, NEW.max_value, typ))) THEN
            PERFORM moemeter.refuse(format('role %s may not narrow the statistics of column %s of table %s',
                session_user, OLD.column_id, OLD.table_id));
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- the catalog's structure (schemas, tables, columns, partitions, options): the lake's owner's
CREATE OR REPLACE FUNCTION moemeter.guard_structure() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM moemeter.owner_only(format('write %s', TG_TABLE_NAME));
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

-- the owner's: guards (and grants) every table of the catalog not guarded yet, and makes the inlined
-- deletion table of each lake table before a publisher would (DuckLake makes it on the first one)
CREATE OR REPLACE FUNCTION moemeter.guard_tables() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t record; kind text; fn text; rack_type text; guarded integer := 0;
    publishers boolean := EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{publishers}');
    readers boolean := EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{readers}');
BEGIN
    FOR t IN SELECT DISTINCT table_id FROM public.ducklake_table WHERE end_snapshot IS NULL LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS public.%I (file_id BIGINT, row_id BIGINT, begin_snapshot BIGINT)',
                       'ducklake_inlined_delete_' || t.table_id);
    END LOOP;
    FOR t IN SELECT c.oid, c.relname FROM pg_class c
              WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'r' AND c.relname LIKE 'ducklake%'
              ORDER BY c.relname LOOP
        kind := CASE
            WHEN t.relname ~ '^ducklake_inlined_data_[0-9]+_[0-9]+$' THEN 'inlined'
            WHEN t.relname ~ '^ducklake_inlined_delete_[0-9]+$' THEN 'facts'
            WHEN t.relname IN ('ducklake_data_file', 'ducklake_delete_file') THEN 'file_rows'
            WHEN t.relname IN ('ducklake_file_partition_value', 'ducklake_file_column_stats',
                               'ducklake_file_variant_stats') THEN 'facts'
            WHEN t.relname = 'ducklake_snapshot' THEN 'snapshot'
            WHEN t.relname = 'ducklake_snapshot_changes' THEN 'author'
            WHEN t.relname = 'ducklake_table_stats' THEN 'table_stats'
            WHEN t.relname = 'ducklake_table_column_stats' THEN 'column_stats'
            WHEN t.relname IN ('ducklake_metadata', 'ducklake_schema', 'ducklake_table', 'ducklake_view',
                               'ducklake_column', 'ducklake_column_tag', 'ducklake_tag', 'ducklake_partition_info',
                               'ducklake_partition_column', 'ducklake_macro', 'ducklake_macro_impl',
                               'ducklake_macro_parameters', 'ducklake_sort_info', 'ducklake_sort_expression',
                               'ducklake_column_mapping', 'ducklake_name_mapping', 'ducklake_inlined_data_tables',
                               'ducklake_schema_versions') THEN 'structure'
            WHEN t.relname = 'ducklake_files_scheduled_for_deletion' THEN 'scheduled'
            ELSE NULL END;  -- a table of a later DuckLake: read-only to publishers until the guard knows it
        IF kind IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = t.oid AND tgname = '{trigger}') THEN
            IF kind = 'inlined' THEN
                SELECT CASE format_type(a.atttypid, a.atttypmod) WHEN 'bytea' THEN 'bytea' ELSE 'text' END
                  INTO rack_type FROM pg_attribute a WHERE a.attrelid = t.oid AND a.attname = 'rack' AND NOT a.attisdropped;
                EXECUTE format('CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE OR DELETE ON public.%I FOR EACH ROW '
                               'EXECUTE FUNCTION moemeter.guard_inlined(%L)', t.relname, coalesce(rack_type, 'none'));
            ELSE
                fn := CASE kind WHEN 'file_rows' THEN 'guard_file_rows' WHEN 'facts' THEN 'guard_file_facts'
                                WHEN 'snapshot' THEN 'guard_snapshot' WHEN 'author' THEN 'guard_author'
                                WHEN 'table_stats' THEN 'guard_table_stats'
                                WHEN 'column_stats' THEN 'guard_column_stats' WHEN 'scheduled' THEN 'guard_scheduled'
                                ELSE 'guard_structure' END;
                EXECUTE format('CREATE TRIGGER {trigger} BEFORE INSERT OR UPDATE OR DELETE ON public.%I '
                               'FOR EACH ROW EXECUTE FUNCTION moemeter.%I()', t.relname, fn);
            END IF;
            fn := CASE WHEN t.relname IN ('ducklake_data_file', 'ducklake_file_partition_value', 'ducklake_file_column_stats',
                                          'ducklake_file_variant_stats') THEN 'commit_file'
                       WHEN t.relname = 'ducklake_delete_file' OR t.relname ~ '^ducklake_inlined_delete_[0-9]+$'
                           THEN 'commit_deletes'
                       WHEN t.relname = 'ducklake_snapshot' THEN 'commit_catalog'
                       WHEN t.relname = 'ducklake_files_scheduled_for_deletion' THEN 'commit_scheduled' END;
            IF fn IS NOT NULL THEN
                EXECUTE format('CREATE CONSTRAINT TRIGGER moemeter_guard_commit AFTER INSERT ON public.%I '
                               'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION moemeter.%I()', t.relname, fn);
            END IF;
            guarded := guarded + 1;
        END IF;
        IF publishers THEN
            IF kind IS NULL THEN
                EXECUTE format('GRANT SELECT ON public.%I TO {publishers}', t.relname);
            ELSIF NOT has_table_privilege('{publishers}', t.oid, 'INSERT') THEN
                EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON public.%I TO {publishers}', t.relname);
            END IF;
        END IF;
        IF readers AND NOT has_table_privilege('{readers}', t.oid, 'SELECT') THEN
            EXECUTE format('GRANT SELECT ON public.%I TO {readers}', t.relname);
        END IF;
    END LOOP;
    IF publishers THEN  -- DuckLake says CREATE TABLE IF NOT EXISTS for inlined deletions: PostgreSQL asks CREATE
        GRANT USAGE, CREATE ON SCHEMA public TO {publishers};
        GRANT EXECUTE ON FUNCTION moemeter.check_rack(varchar, text) TO {publishers};  -- a publisher's first check
    END IF;
    IF readers THEN
        GRANT USAGE ON SCHEMA public TO {readers};
    END IF;
    RETURN guarded;
END $$;
-- a function of the guard is called by its triggers (as the owner) and by no one else: the claim of a rack too
-- (check_rack, claim_rack) is granted to the publishers alone (guard_tables). An index on DuckLake's file tables
-- computes file_name as the writer of a row.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA moemeter FROM PUBLIC;
GRANT EXECUTE ON FUNCTION moemeter.file_name(varchar) TO PUBLIC;
COMMENT ON SCHEMA moemeter IS 'moemeter lake guard {version}';
"""


def guard_sql() -> str:
    """GUARD_SQL with its version, the roles' names (PUBLISHERS, READERS) and the rule of a rack's name."""
    for name in (PUBLISHERS, READERS):
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), name  # an identifier as it stands, and a literal
    return (
        GUARD_SQL.replace("{version}", str(GUARD_VERSION))
        .replace("{publishers}", PUBLISHERS)
        .replace("{readers}", READERS)
        .replace("{trigger}", GUARD_TRIGGER)
        .replace("{rack_name}", RACK_NAME.pattern)
    )


def _on_postgres(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this writer's connection has the lake's PostgreSQL catalog attached plainly (LOCK_DB)."""
    return bool(
        con.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = ?", [LOCK_DB]).fetchall()[0][0]
    )


def _pg_rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    return con.execute("SELECT * FROM postgres_query(?, ?)", [LOCK_DB, sql]).fetchall()


def _pg_execute(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    con.execute(f"CALL postgres_execute({_quoted(LOCK_DB)}, {_quoted(sql)})")


def refusal(exc: BaseException) -> str | None:
    """The guard's refusal in an error from the catalog (PostgreSQL's message alone, not the SQL that
    DuckLake sent), or None."""
    found = re.search(r"lake guard: ([^\n]*)", str(exc))
    return found.group(1) if found else None


@dataclass(frozen=True)
class Guard:
    """A writer's connection as the lake's guard sees it (guard_of)."""

    role: str  # the PostgreSQL role the connection logged in as
    owner: str  # the lake's owner: the role that owns DuckLake's tables
    version: int  # the guard installed on the catalog (GUARD_VERSION; 0: none)
    is_owner: bool  # the role is the owner or a member of it
    publishers: bool  # the group role PUBLISHERS exists (the guard grants it what a publisher writes)

    @property
    def installed(self) -> bool:
        return self.version > 0


def guard_of(con: duckdb.DuckDBPyConnection) -> Guard | None:
    """Who this writer's connection is to the guard; None for a lake whose catalog is not PostgreSQL."""
    if not _on_postgres(con):
        return None
    rows = _pg_rows(
        con,
        f"""SELECT session_user::text AS role, coalesce(pg_get_userbyid(d.relowner)::text, '') AS owner,
                  coalesce(substring(obj_description(s.oid, 'pg_namespace') from 'moemeter lake guard ([0-9]+)')::int, 0)
                      AS version,
                  coalesce(pg_has_role(session_user, d.relowner, 'MEMBER'), false) AS is_owner,
                  EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_quoted(PUBLISHERS)}) AS publishers
           FROM (SELECT 1) one
           LEFT JOIN pg_class d ON d.oid = to_regclass('public.ducklake_metadata')
           LEFT JOIN pg_namespace s ON s.nspname = 'moemeter'""",
    )
    role, owner, version, is_owner, publishers = rows[0]
    return Guard(str(role), str(owner), int(version), bool(is_owner), bool(publishers))


def install_guard(con: duckdb.DuckDBPyConnection) -> Guard:
    """Install the guard on the lake's catalog (or bring it up to date), guard and grant each table not
    guarded yet, and give each rack that has published and has no owner to the lake's owner (`moemeter
    lake assign` gives a rack its own role). The lake's owner's alone: it owns DuckLake's tables."""
    g = guard_of(con)
    if g is None:
        raise LakeError("the guard is for a lake whose catalog is PostgreSQL (a DuckDB file has one writer)")
    if not g.is_owner:
        raise LakeError(
            f"only the lake's owner, role {g.owner}, may install its guard: this connection is role {g.role}"
        )
    version = _pg_rows(
        con, "SELECT value FROM public.ducklake_metadata WHERE key = 'version' ORDER BY scope NULLS FIRST"
    )
    if not version or version[0][0] != DUCKLAKE_CATALOG:
        found = version[0][0] if version else "none"
        raise LakeError(
            f"the guard knows DuckLake's catalog {DUCKLAKE_CATALOG}, this lake's is {found}: left unguarded"
        )
    strangers = _pg_rows(
        con,
        """SELECT n.nspname || '.' || c.relname, pg_get_userbyid(c.relowner)::text FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE (n.nspname = 'moemeter' OR (n.nspname = 'public' AND c.relname LIKE 'ducklake%'))
             AND c.relowner <> (SELECT relowner FROM pg_class WHERE oid = 'public.ducklake_metadata'::regclass)
           UNION ALL
           SELECT 'schema moemeter', pg_get_userbyid(nspowner)::text FROM pg_namespace
           WHERE nspname = 'moemeter'
             AND nspowner <> (SELECT relowner FROM pg_class WHERE oid = 'public.ducklake_metadata'::regclass)""",
    )
    if strangers:
        names = ", ".join(f"{name} (role {who})" for name, who in strangers)
        raise LakeError(f"the catalog holds objects the lake's owner, role {g.owner}, does not own: {names}; drop them")
    try:
        lock = f"SELECT pg_advisory_xact_lock({GUARD_LOCK});"
        if g.version < GUARD_VERSION:
            _pg_execute(con, lock + guard_sql())
        _pg_execute(con, lock + "SELECT moemeter.guard_tables()")
        for rack in racks(con):
            _pg_execute(con, f"SELECT moemeter.claim_rack({_quoted(rack)})")
    except duckdb.Error as exc:
        raise LakeError(f"installing the lake's guard failed: {exc}") from exc
    done = guard_of(con)
    assert done is not None
    return done


def check_publisher(con: duckdb.DuckDBPyConnection, rack: str) -> Guard | None:
    """Refuse, before any step, a publisher whose role may not write `rack` (the guard refuses its commits
    anyway); a rack nobody owns yet is claimed for the role. None: the lake has no guard."""
    g = guard_of(con)
    if g is None or not g.installed:
        return g
    try:
        _pg_execute(con, f"SELECT moemeter.check_rack({_quoted(check_rack(rack))}, 'write')")
    except duckdb.Error as exc:
        raise LakeError(refusal(exc) or str(exc)) from exc
    return g


def rack_owners(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, datetime]]:
    """(rack, owner role, claimed at) for each rack the guard knows, by rack."""
    g = guard_of(con)
    if g is None or not g.installed:
        raise LakeError("this lake has no guard: its owner installs it with `moemeter lake setup`")
    rows = _pg_rows(
        con, "SELECT rack::text, owner::text, claimed_at AT TIME ZONE 'UTC' FROM moemeter.rack_owners ORDER BY rack"
    )
    return [(str(r), str(o), t) for r, o, t in rows]


def assign_rack(con: duckdb.DuckDBPyConnection, rack: str, role: str) -> None:
    """Give `rack` to `role` (claimed or not): the lake's owner's alone."""
    g = guard_of(con)
    if g is None or not g.installed:
        raise LakeError("this lake has no guard: its owner installs it with `moemeter lake setup`")
    if not g.is_owner:
        raise LakeError(f"only the lake's owner, role {g.owner}, assigns racks: this connection is role {g.role}")
    if not _pg_rows(con, f"SELECT 1 FROM pg_roles WHERE rolname = {_quoted(role)}"):
        raise LakeError(f"there is no PostgreSQL role {role!r}")
    _pg_execute(
        con,
        f"INSERT INTO moemeter.rack_owners (rack, owner) VALUES ({_quoted(check_rack(rack))}, {_quoted(role)}) "
        "ON CONFLICT (rack) DO UPDATE SET owner = EXCLUDED.owner, claimed_at = now()",
    )


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
        self.guard = check_publisher(lake, self.rack)  # None: no guard on this lake
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
        try:
            done = retry_conflicts(
                self.lake, lambda: self._commit(before, through, batches, sheets, sheet_rows, series, kept_minutes)
            )
        except duckdb.Error as exc:  # the guard's refusal: the catalog rolled the whole commit back
            reason = refusal(exc)
            if reason is None:
                raise
            raise LakeError(reason) from exc
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
        """tidy(), logged; None when it failed (publishing goes on, the next one tries again) or when
        the lake's guard leaves tidying to the lake's owner."""
        first = self._tidied is None
        self._tidied = time.monotonic()
        if self.guard is not None and self.guard.installed and not self.guard.is_owner:
            if first:
                log.info(
                    "lake: tidying rewrites every rack's files: the lake's owner, role %s, does it", self.guard.owner
                )
            return None
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
