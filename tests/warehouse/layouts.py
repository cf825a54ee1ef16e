"""Warehouse files as an older writer left them, for the tests of the migrations that convert them."""

from __future__ import annotations

import duckdb

from warehouse.db import migrations

DENSE_IDS = 15  # the migration since which series ids are numbers the writer gives, not hashes
COUNTERS_ONCE = 16  # since which `samples` keeps a counter's reading only where increments cannot give it


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
    name and labels); before COUNTERS_ONCE, `samples` held every reading (the `readings` view)."""
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
        else:
            rows = new.execute(f"SELECT {picked} FROM {source} x ORDER BY {order}")
        old.register("_rows", rows.to_arrow_table())
        old.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
        old.unregister("_rows")
    return old
