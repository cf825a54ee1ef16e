"""The warehouse: the one process that writes the DuckDB file.

It holds the only read-write connection. Writes are jobs on one queue, run in order by one
writer thread (datasette's per-database write thread); readers get their own cursor.
Numbered migrations in warehouse/migrations/ run at start-up and are recorded.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pandas as pd
import pyarrow as pa

from moemeter.contract.errors import MoemeterError

from . import readonly
from .limits import MB, MEMORY_FLOOR_MB, default_memory_limit, resident_bytes, size_bytes
from .sql import sql

JOIN_FILTER_KEYS = 1000
"""The most distinct keys of a join's smaller side that DuckDB hands to the larger side's scan to skip
row groups with (warehouse/sql/db_join_filters.sql)."""

log = logging.getLogger(__name__)
T = TypeVar("T")


def insert_arrow(
    con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, Any], statement: str = "db_insert_batch"
) -> None:
    """Append columns (pyarrow arrays, in the table's column order) to a table in one statement:
    warehouse/sql/<statement>.sql reads them as `_insert_batch` (db_insert_batch.sql appends them to
    `table`; ingest_targets.sql, an upsert, and requests_insert.sql name their table themselves)."""
    con.register("_insert_batch", pa.table(columns))
    try:
        con.execute(sql(statement, table=table))
    finally:
        con.unregister("_insert_batch")


def computed_columns(con: duckdb.DuckDBPyConnection, table: str, database: str | None = None) -> list[str]:
    """A table's generated columns, which are computed as they are read and never written (the
    request records' seconds, migration 024): a copy of its rows selects * EXCLUDE them. DuckDB
    names them only in the table's CREATE statement (read for this warehouse's own tables: names and
    types without commas). `database`: an attached one, not the file's own."""
    rows = con.execute(sql("db_table_ddl"), {"database": database, "table": table}).fetchall()
    return [n.strip('"') for n in re.findall(r'(\w+|"[^"]+") [\w ]+? GENERATED ALWAYS AS', rows[0][0])] if rows else []


REASON_CHARS = 500


def record_rejected(
    con: duckdb.DuckDBPyConnection, ts: datetime, target: str, kind: str, reasons: Counter[str]
) -> None:
    """Store what was refused or repaired (reason -> count) in `rejected`, inside the caller's
    transaction (the caller logs it)."""
    rows = [
        {"ts": ts, "target": target, "kind": kind, "reason": reason[:REASON_CHARS], "count": n}
        for reason, n in reasons.items()
        if n
    ]
    if rows:
        con.executemany(sql("db_rejected"), rows)


def reasons_text(reasons: Counter[str]) -> str:
    """What was refused, as a log line says it: "3 points after this host's clock: refused; ..."."""
    return "; ".join(f"{n:,} {reason}" for reason, n in reasons.items())


class WarehouseError(MoemeterError, RuntimeError):
    """The database cannot be opened or written."""


def storage_problem(exc: BaseException) -> str | None:
    """'disk full' or 'read-only' when a write failed for want of storage, else None (a bad batch)."""
    text = str(exc)
    if "No space left on device" in text or "Disk quota exceeded" in text:
        return "disk full"
    if "Read-only file system" in text or "Permission denied" in text or "read-only" in text.lower():
        return "read-only"
    return None


def written_by_newer_duckdb(path: str, exc: BaseException) -> str | None:
    """What to do with a file a newer DuckDB wrote (DuckDB reads no newer storage version), else None."""
    if "newer version of DuckDB" not in str(exc):
        return None
    return (
        f"{path} was written by a newer DuckDB than this one ({duckdb.__version__}, pinned for the lake's "
        "extensions, README): with that DuckDB, EXPORT DATABASE it to a directory, then IMPORT DATABASE "
        "that directory into a new file here; or start a new file with --db"
    )


def invalidated(exc: BaseException) -> bool:
    """DuckDB's fatal errors leave the database instance unusable until it is opened again."""
    return isinstance(exc, duckdb.FatalException) or "database has been invalidated" in str(exc)


@dataclass
class WriterHealth:
    """What the writer thread knows of its last writes (GET /health on the query API)."""

    ok: bool = True
    problem: str = ""  # "disk full", "read-only", or "" while writes succeed
    error: str = ""  # the database's own message for the first failure
    since: str = ""  # ISO time of the first failure in the current run of failures
    failed_writes: int = 0  # in the current run of failures; each is one lost round
    last_write: str = ""  # ISO time of the last committed write

    def as_json(self) -> dict[str, object]:
        return dict(self.__dict__)


REMIND_SECONDS = 60.0
SLOW_WRITE_SECONDS = 60.0  # `write_stored` warns each time this passes while its write is still queued or running


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every numbered migration, in order."""
    out = []
    for entry in resources.files("warehouse.migrations").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            out.append((int(name[:3]), name, entry.read_text()))
    return sorted(out)


def pending_migrations(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Migrations a database has not had (read-only: without creating anything)."""
    try:
        done = {row[0] for row in con.execute(sql("db_migrations_done")).fetchall()}
    except duckdb.CatalogException:
        done = set()
    return [name for version, name, _ in migrations() if version not in done]


def apply_migrations(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply the migrations not yet recorded; returns the names applied. Idempotent."""
    con.execute(sql("db_schema_migrations"))
    done = {row[0] for row in con.execute(sql("db_migrations_done")).fetchall()}
    applied = []
    for version, name, migration in migrations():
        if version in done:
            continue
        con.begin()
        try:
            con.execute(migration)
            con.execute(sql("db_migration_applied"), {"version": version, "name": name})
            con.commit()
        except Exception:
            con.rollback()
            raise
        applied.append(name)
    return applied


def _mb(size: int | None) -> float | None:
    return None if size is None else round(size / MB, 1)


class Warehouse:
    """Owns the DuckDB file. `submit` queues a write; `cursor` gives a reader its own connection."""

    def __init__(
        self,
        path: str | Path,
        *,
        lock_down: bool = True,
        read_only: str | None = None,
        memory_limit: str | None = None,
        checkpoint_threshold: str | None = None,
        threads: int | None = None,
    ) -> None:
        """`read_only`: open without writing, for a file that cannot be written (the reason why);
        every write then fails at once and /health says so. `memory_limit` (e.g. "4GB"): DuckDB's
        buffer pool for the writer and every reader together (default: serve's,
        `limits.default_memory_limit()`); past it, DuckDB evicts cached blocks and spills large
        queries to disk. `checkpoint_threshold` (a size): how large the write-ahead log grows
        before DuckDB checkpoints (its default 16 MB).
        `threads`: DuckDB's worker threads (its default: one per core)."""
        self.path = str(path)
        for what, size in (("memory limit", memory_limit), ("checkpoint threshold", checkpoint_threshold)):
            if size is not None and size_bytes(size) is None:
                raise WarehouseError(f"{what} {size!r}: give a size such as 512MB, 4GB or 2GiB")
        if memory_limit is not None and size_bytes(memory_limit) < MEMORY_FLOOR_MB * MB:  # type: ignore[operator]
            raise WarehouseError(f"memory limit {memory_limit!r}: give at least {MEMORY_FLOOR_MB}MB")
        self._memory_limit = memory_limit if memory_limit is not None else default_memory_limit()
        self.read_only, self._lock_down = read_only, lock_down
        if threads is not None and threads < 1:
            raise WarehouseError(f"threads {threads}: give at least 1")
        self._checkpoint_threshold, self._threads = checkpoint_threshold, threads
        try:
            self._con = self._connect(locked=False)
        except duckdb.Error as exc:
            raise WarehouseError(written_by_newer_duckdb(self.path, exc) or f"cannot open {self.path}: {exc}") from exc
        if read_only is None:
            applied = apply_migrations(self._con)
            if applied:
                log.info("warehouse %s: applied migrations %s", self.path, applied)
        elif pending := pending_migrations(self._con):
            log.warning(
                "warehouse %s: read-only with migrations %s not applied; pages that need them fail", self.path, pending
            )
        if lock_down:
            readonly.lock_down(self._con)  # readers share this database instance
        self.health = WriterHealth()
        if read_only is not None:
            self.health = WriterHealth(False, "read-only", read_only, datetime.now(UTC).isoformat(timespec="seconds"))
        self._reminded = 0.0
        self._jobs: queue.Queue[tuple[Callable[[duckdb.DuckDBPyConnection], Any], Future[Any]] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._run_writer, name="warehouse-writer", daemon=True)
        self._writer.start()

    def _connect(self, locked: bool = True) -> duckdb.DuckDBPyConnection:
        con = duckdb.connect(self.path, read_only=self.read_only is not None)
        con.execute(sql("db_memory_limit"), {"size": self._memory_limit.strip()})
        if self._threads is not None:
            con.execute(sql("db_threads"), {"count": int(self._threads)})
        con.execute(sql("db_join_filters"), {"count": JOIN_FILTER_KEYS})
        if self._checkpoint_threshold is not None:
            con.execute(sql("db_checkpoint_threshold"), {"size": self._checkpoint_threshold.strip()})
        if locked and self._lock_down:
            readonly.lock_down(con)
        return con

    def _reopen(self, old: duckdb.DuckDBPyConnection | None) -> duckdb.DuckDBPyConnection | None:
        """A fresh database instance after DuckDB invalidated this one (a failed checkpoint on a full
        disk is fatal to it: every statement fails, readers' too, until it is opened again). The
        writer's new cursor, or None when it cannot be opened yet (tried again at the next write)."""
        for con in (old, self._con):
            try:
                if con is not None:
                    con.close()
            except duckdb.Error:
                pass
        try:
            self._con = self._connect()
        except duckdb.Error as exc:
            log.error("warehouse %s: cannot reopen the database yet: %s", self.path, exc)
            return None
        log.warning("warehouse %s: reopened after DuckDB invalidated it; queries answer again", self.path)
        return self._con.cursor()

    def _run_writer(self) -> None:
        con: duckdb.DuckDBPyConnection | None = self._con.cursor()
        while True:
            item = self._jobs.get()
            if item is None:
                break
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            if self.read_only is not None:
                self.health.failed_writes += 1
                fut.set_exception(WarehouseError(f"{self.path} is open read-only: {self.read_only}"))
                continue
            if con is None and (con := self._reopen(None)) is None:
                self.health.failed_writes += 1
                fut.set_exception(WarehouseError(f"{self.path} cannot be reopened yet: {self.health.error}"))
                continue
            try:
                con.begin()
                result = job(con)
                con.commit()
            except BaseException as exc:  # the writer must outlive a bad batch and a full disk
                try:
                    con.rollback()
                except duckdb.Error:
                    pass
                self._failed(exc)
                if invalidated(exc):
                    con = self._reopen(con)
                fut.set_exception(exc)
                continue
            self._written()
            fut.set_result(result)
        if con is not None:
            con.close()

    def _failed(self, exc: BaseException) -> None:
        problem = storage_problem(exc)
        if problem is None:
            log.error("warehouse write failed: %s", exc)
            if not self.health.ok:  # while the disk fails, a write that fails otherwise is as lost
                self.health.failed_writes += 1
            return
        h, now = self.health, time.monotonic()
        if h.ok:
            self.health = h = WriterHealth(
                False, problem, str(exc), datetime.now(UTC).isoformat(timespec="seconds"), 0, h.last_write
            )
            log.error(
                "warehouse %s: cannot write (%s): %s. Queries still answer from what it holds; "
                "each round is retried and lost until writes succeed.",
                self.path,
                problem,
                exc,
            )
            self._reminded = now
        elif now - self._reminded >= REMIND_SECONDS:
            log.error(
                "warehouse %s: still cannot write (%s) since %s: %d rounds lost",
                self.path,
                problem,
                h.since,
                h.failed_writes + 1,
            )
            self._reminded = now
        h.failed_writes += 1

    def _written(self) -> None:
        h = self.health
        if not h.ok:
            log.warning(
                "warehouse %s: writes resumed after %d failed (%s since %s)",
                self.path,
                h.failed_writes,
                h.problem,
                h.since,
            )
            self.health = h = WriterHealth()
        h.last_write = datetime.now(UTC).isoformat(timespec="seconds")

    def submit(self, job: Callable[[duckdb.DuckDBPyConnection], T]) -> Future[T]:
        """Queue a write; it runs in its own transaction on the writer thread."""
        fut: Future[T] = Future()
        self._jobs.put((job, fut))
        return fut

    def write(self, job: Callable[[duckdb.DuckDBPyConnection], T], timeout: float | None = 60) -> T:
        return self.submit(job).result(timeout)

    def write_stored(self, job: Callable[[duckdb.DuckDBPyConnection], T], what: str) -> T:
        """Queue a write and wait until it has committed or failed, however long that takes, with
        a warning each SLOW_WRITE_SECONDS meanwhile: for a caller whose next step starts from what
        this write stores (the collector's next round). Giving up instead would leave the write
        queued, to commit after the caller had moved on believing it lost."""
        fut, started = self.submit(job), time.monotonic()
        while True:
            try:
                return fut.result(SLOW_WRITE_SECONDS)
            except TimeoutError:
                if fut.done():  # the job itself raised TimeoutError
                    raise
                log.warning(
                    "warehouse %s: %s not stored yet after %.0f s (the machine or its disk is stalled); waiting for it",
                    self.path,
                    what,
                    time.monotonic() - started,
                )

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of the reader's own (one per thread)."""
        return self._con.cursor()

    def memory(self) -> dict[str, float | None]:
        """In MB (10^6 bytes): the process's resident memory (None where the system does not say),
        DuckDB's part of it and its cap, and what DuckDB spilled to disk (GET /health). DuckDB's
        figures are None while the database cannot answer (invalidated by a full disk, until the
        writer reopens it): /health answers then too."""
        held: int | None = None
        spilled: int | None = None
        try:
            with self.cursor() as cur:
                held, spilled = cur.execute(sql("db_memory")).fetchone() or (None, None)
        except duckdb.Error:
            pass
        resident = resident_bytes()
        return {
            "resident_mb": _mb(resident),
            "duckdb_mb": _mb(held),
            "duckdb_cap_mb": _mb(size_bytes(self._memory_limit)),
            "duckdb_spilled_mb": _mb(spilled),
        }

    def query_df(self, sql: str, params: list[Any] | dict[str, Any] | None = None) -> pd.DataFrame:
        with self.cursor() as cur:
            return cur.execute(sql, params or []).df()

    def close(self) -> None:
        self._jobs.put(None)
        self._writer.join(timeout=30)
        self._con.close()
