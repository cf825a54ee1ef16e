"""An empty, migrated warehouse for each example of a property test, without migrating one per
example (0.1 s each): every example writes on a cursor of one migrated in-memory database inside
a transaction that is rolled back after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import duckdb

from warehouse.db import apply_migrations, migrations


@cache
def _migrated() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    apply_migrations(con)
    return con


@contextmanager
def fresh_schema() -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor on the empty, migrated warehouse; what it writes is rolled back when it closes."""
    cur = _migrated().cursor()
    cur.begin()
    try:
        yield cur
    finally:
        cur.rollback()
        cur.close()


def migrate_through(con: duckdb.DuckDBPyConnection, last: int) -> None:
    """Apply the migrations up to `last` that `con` has not had, recorded as apply_migrations does."""
    con.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)"
    )
    done = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
    for version, name, statements in migrations():
        if version <= last and version not in done:
            con.execute(statements)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [version, name])
