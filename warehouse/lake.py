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
from collections.abc import Callable, Iterator, Mapping, Sequence
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
from .export import RACK_NAME, check_rack, named_by_key
from .limits import default_memory_limit
from .read import HOUR, MINUTE, floor
from .readonly import lock_down
from .requests import ITL_BIN_SCALE
from .rollup import compacted
from .slo import slo_params
from .sql import bind, sql

log = logging.getLogger(__name__)

CHUNK = timedelta(hours=1)
"""The most a step publishes past the last one (a rack's first step over a month of rollups takes
a month's worth of steps, each a bounded transaction)."""
PUBLISH_EVERY = 60.0
"""Seconds between a serving rack's publishes (`serve --publish-every`)."""
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
    watermark's: the open hour is published once, when it has closed);
    `pending`: the statement (warehouse/sql) that gives the window's rows as a reader of the file
    sums them: the table's rows and the same sums of the records stored since the table's roll-up,
    up to the step's minute watermark. A request that finished in an hour's last seconds is stored
    after the hour's roll-up (the next round's); the file's readers add it from the records, which
    the lake does not hold, so the lake takes it with the hour's rows (its window reaches back to
    it: `_since`), not an hour later with the next roll-up."""

    name: str
    clock: str
    reach: str | None = None
    period: timedelta = MINUTE
    whole: bool = False
    pending: str | None = None

    def edges(self, since: datetime | None, end: datetime | None) -> dict[str, datetime | None]:
        """The parameters of lake_edges.sql, the condition for the rows of [since, end) of this table
        (None: unbounded on that side)."""
        return {"since": since, "end": floor(end, self.period) if self.whole and end is not None else end}

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
    Table("requests_1h", "1h", "requests", HOUR, pending="lake_requests_1h"),
    Table("requests_itl_1h", "1h", "requests", HOUR, pending="lake_requests_itl_1h"),
    Table("requests_slo_1h", "1h", "requests", HOUR, pending="requests_slo"),
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
    """Load the ducklake and postgres extensions from their wheels (never from the network)."""
    con.execute(sql("lake_no_autoinstall"))
    con.execute(sql("lake_no_autoload"))
    # DuckDB binds no parameter in LOAD: the extension's path is written as a literal (_quoted)
    con.execute(_statement("lake_load", quoted={"extension": str(_postgres_scanner())}))
    con.execute(_statement("lake_load", quoted={"extension": str(_extension("duckdb_extension_ducklake"))}))


def catalog_uri(uri: str) -> str:
    """`ducklake:<catalog>` for a catalog connection string: `postgres:dbname=lake host=...`, or
    a DuckDB file for a lake on one machine."""
    uri = uri.strip()
    if not uri:
        raise LakeError("--lake needs a catalog, e.g. 'postgres:dbname=lake host=/run/postgresql'")
    return uri if uri.startswith("ducklake:") else f"ducklake:{uri}"


def _quoted(text: str) -> str:
    """`text` as a DuckDB string literal: each quote doubled (DuckDB reads no backslash escape in one)."""
    return "'" + text.replace("'", "''") + "'"


def _pg_quoted(text: str) -> str:
    """`text` as a PostgreSQL string literal, as PostgreSQL's quote_literal writes it: each quote doubled,
    and where it holds a backslash, an E'' string with each backslash doubled (the same value whatever
    the server's standard_conforming_strings)."""
    body = text.replace("'", "''")
    return "E'" + body.replace("\\", "\\\\") + "'" if "\\" in text else "'" + body + "'"


def _names(names: str | Sequence[str]) -> str:
    """A name, or names separated by commas, each a DuckDB identifier in double quotes (each double quote
    in it doubled)."""
    return ", ".join('"' + n.replace('"', '""') + '"' for n in ([names] if isinstance(names, str) else names))


_UNBOUND = re.compile(r"""\{\{(?:'(\w+)'|"(\w+)"|:(\w+))\}\}""")
"""A slot of a lake statement for what its engine binds no parameter in (ATTACH's path, LOAD, a view, DDL,
or PostgreSQL SQL sent whole through postgres_execute and postgres_query): `{{'key'}}` a value written as a
string literal, `{{"key"}}` a name (or names) written as identifiers, `{{:key}}` a column's type."""
_COLUMN_TYPE = re.compile(r"[A-Z][A-Z0-9_ ,()\[\]]*")
"""A column's type as duckdb_columns() writes it (`TIMESTAMP WITH TIME ZONE`, `MAP(VARCHAR, VARCHAR)`,
`VARCHAR[]`): no quote, semicolon or comment can end the statement it is written into."""


def _statement(name: str, quoted: Mapping[str, str | Sequence[str]], **identifiers: str) -> str:
    """warehouse/sql/<name>.sql as `sql` gives it (its includes in place, each
    `{{key}}` by one of warehouse/sql's IDENTIFIERS), with each slot of _UNBOUND filled from `quoted`:
    a value as a string literal by the rules of the statement's engine (PostgreSQL's for lake_pg_*.sql,
    _pg_quoted; DuckDB's otherwise, _quoted), a name as identifiers (_names), a type as DuckDB wrote it.
    Only for what the engine cannot bind: every other value is a named parameter."""
    used: set[str] = set()

    def fill(m: re.Match[str]) -> str:
        key = m[1] or m[2] or m[3]
        value = quoted.get(key)
        if value is None:
            raise KeyError(f"warehouse/sql/{name}.sql needs a value for its slot {m[0]}")
        used.add(key)
        if m[2]:
            return _names(value)
        if not isinstance(value, str):
            raise TypeError(f"warehouse/sql/{name}.sql takes one value for its slot {m[0]}, not {value!r}")
        if m[3]:
            if not _COLUMN_TYPE.fullmatch(value):
                raise LakeError(f"cannot add a column of type {value!r} to the lake")
            return value
        return _pg_quoted(value) if name.startswith("lake_pg_") else _quoted(value)

    out = _UNBOUND.sub(fill, sql(name, **identifiers))
    if unused := sorted(set(quoted) - used):
        raise KeyError(f"warehouse/sql/{name}.sql has no slot for {', '.join(unused)}")
    return out


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
    params: dict[str, Any] = {"read_only": read_only}
    if data_path:
        params["data_path"] = str(data_path)
    for attempt in range(1, CONFLICT_TRIES + 1):
        con = duckdb.connect(config={"memory_limit": default_memory_limit("command")})
        try:
            _load_extensions(con)
            catalog = catalog_uri(uri).removeprefix("ducklake:")
            if catalog.startswith("postgres:"):  # every session on it, DuckLake's and the lock's (SEARCH_PATH)
                catalog = "postgres:" + pinned(catalog.removeprefix("postgres:"))
            # DuckDB binds no parameter in ATTACH's path (its options it binds): the catalog is a literal
            attach = "lake_attach_data" if data_path else "lake_attach"
            con.execute(_statement(attach, quoted={"catalog": "ducklake:" + catalog}), params)
            if not read_only and catalog.startswith("postgres:"):
                plain = {"catalog": catalog.removeprefix("postgres:")}
                con.execute(_statement("lake_attach_commits", quoted=plain, lock_db=LOCK_DB))
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
    row = con.execute(sql("lake_data_path")).fetchone()
    if row is None:
        raise LakeError("the lake does not say where its data files are")
    return str(row[0])


# ---------------------------------------------------------------------------------------- schema
def _columns(con: duckdb.DuckDBPyConnection, database: str, table: str) -> list[tuple[str, str]]:
    return [
        (str(n), str(t)) for n, t in con.execute(sql("lake_columns"), {"database": database, "table": table}).fetchall()
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
                con.execute(sql("lake_create_table", table=name))
                con.execute(sql("lake_partition", table=name))
                continue
            for c, t in cols:
                if c not in have:  # DuckDB binds no parameter in DDL: the name an identifier, the type as it wrote it
                    con.execute(_statement("lake_add_column", quoted={"column": c, "type": t}, table=name))
        if not _columns(con, "lake", STATE):
            con.execute(sql("lake_create_state", state=STATE))

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
        lock.begin()
        try:  # PostgreSQL binds no parameter in SET, nor in SQL sent whole: the wait and the lock are literals
            _pg_execute(lock, _statement("lake_pg_commit_lock", quoted={"wait": LOCK_WAIT, "lock": str(COMMIT_LOCK)}))
        except duckdb.Error as exc:
            raise LakeError(f"waited {LOCK_WAIT} for the lake's commit lock, held by another writer: {exc}") from exc
        yield
    finally:
        try:
            lock.rollback()  # ends the lock's transaction: PostgreSQL releases it
        finally:
            lock.close()


def _transaction(con: duckdb.DuckDBPyConnection, job: Callable[[], Any]) -> Any:
    """job() in one transaction of `con`: committed if it returns, rolled back if it raises."""
    con.begin()
    try:
        out = job()
        con.commit()
    except BaseException:
        try:
            con.rollback()
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

    def count(statement: str, **params: int) -> int:
        # its own transaction: left to autocommit while the lock's transaction was open on another
        # cursor, a rewrite and a merge reported their files and committed none (DuckLake 1.5.5)
        row = _transaction(con, lambda: con.execute(sql(statement), params).fetchone())
        return int(row[0]) if row else 0

    g = guard_of(con)
    if g is not None and g.installed and not g.is_owner:
        raise LakeError(f"tidying rewrites every rack's files: only the lake's owner, role {g.owner}, may")
    keep = int(KEEP_SNAPSHOTS.total_seconds())
    with commit_lock(con):
        rewritten = count("lake_tidy_rewrite")
        merged = count("lake_tidy_merge", bytes=MERGED_FILE_BYTES)
        expired = count("lake_tidy_expire", keep=keep)
    removed = count("lake_tidy_cleanup", keep=keep)  # deletes files: no lock needed
    # files no commit names (a writer killed mid-step), as old: a step in flight commits long before
    removed += count("lake_tidy_orphans", keep=keep)
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
        row = con.execute(sql("lake_table_files"), {"table": name}).fetchone()
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
GUARD_SQL = "lake_pg_guard"
"""The guard: warehouse/sql/lake_pg_guard.sql, one script its triggers' owner-only branch is written into
(lake_pg_owner_only.sql), sent whole by the lake's owner (guard_sql, install_guard)."""


def guard_sql() -> str:
    """GUARD_SQL with the install's lock (GUARD_LOCK), its version, the roles' names (PUBLISHERS, READERS),
    the trigger's and the rule of a rack's name."""
    for name in (PUBLISHERS, READERS, GUARD_TRIGGER):
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), name  # an identifier as it stands, inside format()'s text too
    # PostgreSQL binds no parameter in a script sent whole, nor in a function's body or a COMMENT: literals
    literals = {
        "lock": str(GUARD_LOCK),
        "rack_name": f"^{RACK_NAME.pattern}$",
        "comment": f"moemeter lake guard {GUARD_VERSION}",
        "publishers": PUBLISHERS,
        "readers": READERS,
        "trigger": GUARD_TRIGGER,
    }
    names = {"publishers": PUBLISHERS, "readers": READERS, "trigger": GUARD_TRIGGER}
    return _statement(GUARD_SQL, quoted=literals, **names)


def _on_postgres(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this writer's connection has the lake's PostgreSQL catalog attached plainly (LOCK_DB)."""
    return bool(con.execute(sql("lake_on_postgres"), {"database": LOCK_DB}).fetchall()[0][0])


def _pg_rows(con: duckdb.DuckDBPyConnection, statement: str) -> list[tuple[Any, ...]]:
    """The rows of a query (a lake_pg_*.sql) on the lake's PostgreSQL catalog."""
    return con.execute(sql("lake_catalog_query"), {"database": LOCK_DB, "statement": statement}).fetchall()


def _pg_execute(con: duckdb.DuckDBPyConnection, statement: str) -> None:
    """Run a statement or script (a lake_pg_*.sql) on the lake's PostgreSQL catalog."""
    con.execute(sql("lake_catalog_execute"), {"database": LOCK_DB, "statement": statement})


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
    # postgres_query sends its query whole, with no parameter: the group role's name is a literal
    rows = _pg_rows(con, _statement("lake_pg_who", quoted={"publishers": PUBLISHERS}))
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
    version = _pg_rows(con, sql("lake_pg_catalog_version"))
    if not version or version[0][0] != DUCKLAKE_CATALOG:
        found = version[0][0] if version else "none"
        raise LakeError(
            f"the guard knows DuckLake's catalog {DUCKLAKE_CATALOG}, this lake's is {found}: left unguarded"
        )
    strangers = _pg_rows(con, sql("lake_pg_strangers"))
    if strangers:
        names = ", ".join(f"{name} (role {who})" for name, who in strangers)
        raise LakeError(f"the catalog holds objects the lake's owner, role {g.owner}, does not own: {names}; drop them")
    try:  # each sent whole (postgres_execute), where PostgreSQL binds no parameter: the lock and a rack are literals
        if g.version < GUARD_VERSION:
            _pg_execute(con, guard_sql())
        _pg_execute(con, _statement("lake_pg_guard_tables", quoted={"lock": str(GUARD_LOCK)}))
        for rack in racks(con):
            _pg_execute(con, _statement("lake_pg_claim_rack", quoted={"rack": rack}))
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
        # sent whole (postgres_execute), where PostgreSQL binds no parameter: the rack is a literal
        _pg_execute(con, _statement("lake_pg_check_rack", quoted={"rack": check_rack(rack)}))
    except duckdb.Error as exc:
        raise LakeError(refusal(exc) or str(exc)) from exc
    return g


def rack_owners(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str, datetime]]:
    """(rack, owner role, claimed at) for each rack the guard knows, by rack."""
    g = guard_of(con)
    if g is None or not g.installed:
        raise LakeError("this lake has no guard: its owner installs it with `moemeter lake setup`")
    rows = _pg_rows(con, sql("lake_pg_rack_owners"))
    return [(str(r), str(o), t) for r, o, t in rows]


def assign_rack(con: duckdb.DuckDBPyConnection, rack: str, role: str) -> None:
    """Give `rack` to `role` (claimed or not): the lake's owner's alone."""
    g = guard_of(con)
    if g is None or not g.installed:
        raise LakeError("this lake has no guard: its owner installs it with `moemeter lake setup`")
    if not g.is_owner:
        raise LakeError(f"only the lake's owner, role {g.owner}, assigns racks: this connection is role {g.role}")
    # sent whole (postgres_query, postgres_execute), where PostgreSQL binds no parameter: the role a user
    # names and the rack are literals, quoted by PostgreSQL's rules (_pg_quoted)
    if not _pg_rows(con, _statement("lake_pg_role_exists", quoted={"role": role})):
        raise LakeError(f"there is no PostgreSQL role {role!r}")
    _pg_execute(con, _statement("lake_pg_assign_rack", quoted={"rack": check_rack(rack), "role": role}))


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
    rows = con.execute(sql("lake_published", state=STATE), {"rack": rack}).fetchall()
    return {str(n): t for n, t in rows}


def _local_state(local: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    return {str(n): t for n, t in local.execute(sql("lake_local_state")).fetchall()}


def _earliest(local: duckdb.DuckDBPyConnection) -> datetime | None:
    """The oldest row of any published table: where a rack's first step starts."""
    oldest = [row[0] for t in TABLES for row in local.execute(sql("lake_oldest", table=t.name)).fetchall()]
    return min((ts for ts in oldest if ts is not None), default=None)


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


def _stored(local: duckdb.DuckDBPyConnection, through: dict[str, datetime]) -> datetime:
    """The records a step's `pending` windows hold are those stored before this: the hourly tables
    hold those stored before the hourly roll-up's watermark, and the step adds those stored since,
    up to its minute watermark (a step catching up ends before the roll-up's)."""
    rolled = _local_state(local).get("1h")
    return through["1m"] if rolled is None else max(rolled, through["1m"])


def _since(
    local: duckdb.DuckDBPyConnection,
    table: Table,
    before: dict[str, datetime],
    end: datetime,
    stored: datetime | None = None,
    first: bool = False,
) -> datetime | None:
    """Where this step's window of `table`, ending at `end`, starts (None: from its first row).
    `stored` and `first`: for a `pending` table, the records this step holds are those stored before
    `stored`, and whether this publisher has committed nothing yet."""
    start = before.get(table.clock)
    if start is None:
        return None
    hours = compacted(start, end).get(table.name)
    if hours is not None:  # the writer compacted rows published before (rollup.compact_hours, compact_minutes)
        start = hours[0]
    if table.name == EVENTS:
        return start - EVENT_LATENESS
    if table.reach == "increments":  # the rows rolled since: raw increments closed in [start, ...)
        row = local.execute(sql("lake_increments_reach"), {"start": start}).fetchone()
    elif table.pending is not None:  # the records stored since the last step, which add to the hour they
        # finished in (the last step held those stored before its minute watermark, or before the hourly
        # roll-up's if later: a step catching up). A publisher's first step reaches back from the hourly
        # watermark: a version before `pending` left out the records stored after the hour's roll-up.
        since = before.get("1h" if first else "1m", start)
        row = local.execute(sql("lake_requests_reach"), {"start": since, "end": stored or end}).fetchone()
    elif table.reach == "requests":  # the records rolled since, which add to the period they finished in
        row = local.execute(sql("lake_requests_reach"), {"start": start, "end": end}).fetchone()
    else:
        return floor(start, table.period)
    reached = row[0] if row and row[0] is not None else start
    return floor(min(start, reached), table.period)


def _window(
    local: duckdb.DuckDBPyConnection,
    table: Table,
    since: datetime | None,
    through: datetime,
    stored: datetime | None = None,
) -> pa.Table:
    if table.pending is not None:  # the table's rows and the sums of the records stored since its roll-up
        hours = {"finished_from": since or datetime.min, "finished_until": through}
        records = {"ingested_from": None, "ingested_until": stored, "bin_scale": ITL_BIN_SCALE}
        params = {**hours, **records, **slo_params(None, None)}  # no edges: whole hours only
        return local.execute(*bind(sql(table.pending), params)).to_arrow_table()
    return local.execute(named_by_key(table.name, sql("lake_edges")), table.edges(since, through)).to_arrow_table()


def _event_list(batch: pa.Table) -> list[tuple[Any, ...]]:
    return list(zip(*(batch.column(c).to_pylist() for c in ("target", "ts", "layer"))))


def _row_set(table: pa.Table) -> set[tuple[Any, ...]]:
    return set(zip(*(table.column(c).to_pylist() for c in table.column_names)))


def _rows(con: duckdb.DuckDBPyConnection, table: str, rack: str, columns: list[str]) -> set[tuple[Any, ...]]:
    """A rack's rows of a lake table, of these columns in this order (the lake's may have more, in
    another order)."""
    cur = con.execute(sql("lake_sheet_rows", table=table), {"rack": rack, "columns": columns})
    order = [[d[0] for d in cur.description].index(c) for c in columns]
    return {tuple(r[i] for i in order) for r in cur.fetchall()}


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
        local.begin()
        try:
            before = published(self.lake, self.rack)
            through = _targets(local, before, self.chunk)
            if through is None:
                return None
            batches: dict[str, tuple[datetime | None, datetime, pa.Table]] = {}
            stored = _stored(local, through)
            first = self._sheets is None  # set once this publisher has committed
            for t in TABLES:
                end = through.get(t.clock)
                if end is None:
                    continue
                since = _since(local, t, before, end, stored, first)
                batches[t.name] = (since, end, _window(local, t, since, end, stored))
            sheets = {name: local.execute(sql("lake_sheet", table=name)).to_arrow_table() for name in SHEETS}
            sheet_rows = {name: _row_set(table) for name, table in sheets.items()}
            series = local.execute(named_by_key(SERIES)).to_arrow_table()
            kept_minutes = _local_state(local).get("increments_1m_from")
        finally:
            local.commit()
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
                edges = t.edges(since, None if first else end)
                lake.execute(sql("lake_delete_window", table=t.name), {"rack": rack, **edges})
            rows[t.name] = self._insert(t.name, batch)
        for name, table in sheets.items():
            here = sheet_rows[name]
            if self._sheets is not None:  # as the last commit left them
                there = self._sheets[name]
            else:
                there = _rows(lake, name, rack, table.column_names)
            if here != there:
                lake.execute(sql("lake_delete_rack", table=name), {"rack": rack})
                rows[name] = self._insert(name, table)
        if self._series is None:
            self._series = {
                int(r[0]) for r in lake.execute(sql("lake_series_ids", series=SERIES), {"rack": rack}).fetchall()
            }
        ids = series.column("series_id").to_pylist()
        new = [i for i, v in enumerate(ids) if v not in self._series]
        if new:
            rows[SERIES] = self._insert(SERIES, series.take(pa.array(new, pa.int64())))
        state = dict(through)
        if before.get("increments_1m_from") is not None or kept_minutes is not None:
            # the oldest minute rows the lake holds were the local ones at the first step
            state["increments_1m_from"] = before.get("increments_1m_from") or kept_minutes  # type: ignore[assignment]
        lake.execute(sql("lake_delete_rack", table=STATE), {"rack": rack})
        lake.executemany(
            sql("lake_insert_state", state=STATE),
            [{"rack": rack, "name": name, "through": t} for name, t in sorted(state.items())],
        )
        return Step(rack, through, rows)

    def _unpublished_events(self, table: Table, since: datetime | None, batch: pa.Table) -> pa.Table:
        """The events of the batch (those of its window, from `since`) the lake does not hold."""
        if self._events is None:
            statement = sql("lake_held_events", events=EVENTS)
            params = {"rack": self.rack, **table.edges(since, None)}
            self._events = {tuple(r) for r in self.lake.execute(statement, params).fetchall()}
        held = self._events
        new = [i for i, k in enumerate(_event_list(batch)) if k not in held]
        return batch.take(pa.array(new, pa.int64()))

    def _insert(self, name: str, batch: pa.Table) -> int:
        if batch.num_rows == 0:
            return 0
        self.lake.register("_publish_batch", batch)
        try:
            self.lake.execute(sql("lake_insert_batch", table=name), {"rack": self.rack})
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
    return [str(r[0]) for r in con.execute(sql("lake_racks", state=STATE)).fetchall()]


def watermarks(con: duckdb.DuckDBPyConnection) -> dict[str, datetime]:
    """Each rack's minute watermark: what it has published is before it."""
    if not _columns(con, "lake", STATE):
        return {}
    rows = con.execute(sql("lake_watermarks", state=STATE)).fetchall()
    return {str(r): t for r, t in rows}


def rack_view(con: duckdb.DuckDBPyConnection, rack: str) -> None:
    """Make this connection's own tables one rack's view of the lake (see the module docstring)."""
    check_rack(rack)
    _templates(con)
    # DuckDB binds no parameter in a view: its columns are written as identifiers, the rack as a literal
    for name in [t.name for t in TABLES] + list(SHEETS) + [SERIES]:
        cols = [c for c, _ in _columns(con, "memory", name)]
        con.execute(sql("lake_drop_table", table=name))
        view = "lake_view_series" if "series_key" in cols else "lake_view"  # the series' key is its id
        con.execute(_statement(view, quoted={"columns": cols, "rack": rack}, table=name))
    con.execute(sql("lake_drop_table", table="rollup_state"))
    con.execute(_statement("lake_view_rollup_state", quoted={"rack": rack}, state=STATE))
    con.execute(sql("lake_view_series_targets"))


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
            con.execute(sql("lake_allowed_directories"), {"folder": os.path.abspath(folder)})
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
        every: float = PUBLISH_EVERY,
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
                        local.rollback()
                    except duckdb.Error:
                        pass
                if self._stop.wait(self.every):
                    return
        finally:
            local.close()
            if lake is not None:
                lake.close()
