"""The warehouse: the one process that writes the DuckDB file.

It holds the only read-write connection. Writes are jobs on one queue, run in order by one
writer thread (datasette's per-database write thread); readers get their own cursor.
Numbered migrations in warehouse/migrations/ run at start-up and are recorded.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pandas as pd
import pyarrow as pa

log = logging.getLogger(__name__)
T = TypeVar("T")


def insert_arrow(con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, Any]) -> None:
    """Append columns (pyarrow arrays, in the table's column order) to a table in one statement."""
    con.register("_insert_batch", pa.table(columns))
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM _insert_batch")
    finally:
        con.unregister("_insert_batch")


class WarehouseError(RuntimeError):
    """The database cannot be opened or written."""


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every numbered migration, in order."""
    out = []
    for entry in resources.files("warehouse.migrations").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            out.append((int(name[:3]), name, entry.read_text()))
    return sorted(out)


def apply_migrations(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Apply the migrations not yet recorded; returns the names applied. Idempotent."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)"
    )
    done = {row[0] for row in con.execute("SELECT version FROM schema_migrations").fetchall()}
    applied = []
    for version, name, sql in migrations():
        if version in done:
            continue
        con.execute("BEGIN")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [version, name])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied


class Warehouse:
    """Owns the DuckDB file. `submit` queues a write; `cursor` gives a reader its own connection."""

    def __init__(self, path: str | Path, *, lock_down: bool = True) -> None:
        self.path = str(path)
        try:
            self._con = duckdb.connect(self.path)
        except duckdb.Error as exc:
            raise WarehouseError(f"cannot open {self.path}: {exc}") from exc
        applied = apply_migrations(self._con)
        if applied:
            log.info("warehouse %s: applied migrations %s", self.path, applied)
        if lock_down:
            # Readers share this database instance: no file or network access from SQL.
            self._con.execute("SET enable_external_access = false")
            self._con.execute("SET lock_configuration = true")
        self._jobs: queue.Queue[tuple[Callable[[duckdb.DuckDBPyConnection], Any], Future[Any]] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._run_writer, name="warehouse-writer", daemon=True)
        self._writer.start()

    def _run_writer(self) -> None:
        con = self._con.cursor()
        while True:
            item = self._jobs.get()
            if item is None:
                break
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                con.execute("BEGIN")
                result = job(con)
                con.execute("COMMIT")
                fut.set_result(result)
            except BaseException as exc:  # the writer must outlive a bad batch
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                log.error("warehouse write failed: %s", exc)
                fut.set_exception(exc)
        con.close()

    def submit(self, job: Callable[[duckdb.DuckDBPyConnection], T]) -> Future[T]:
        """Queue a write; it runs in its own transaction on the writer thread."""
        fut: Future[T] = Future()
        self._jobs.put((job, fut))
        return fut

    def write(self, job: Callable[[duckdb.DuckDBPyConnection], T], timeout: float | None = 60) -> T:
        return self.submit(job).result(timeout)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of the reader's own (one per thread)."""
        return self._con.cursor()

    def query_df(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        with self.cursor() as cur:
            return cur.execute(sql, params or []).df()

    def close(self) -> None:
        self._jobs.put(None)
        self._writer.join(timeout=30)
        self._con.close()
