"""The SQL the warehouse runs lives in warehouse/sql/*.sql: each file parses, and no page carries SQL of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import duckdb
import pytest

from warehouse.db import apply_migrations
from warehouse.export import BY_SERIES, DIMENSION_TABLES, FACT_TABLES, TIME_COLUMN
from warehouse.lake import _statement
from warehouse.read import EXPERT_LOAD, SAMPLES, Holdings, statement
from warehouse.requests import _COLUMNS as RECORD_COLUMNS
from warehouse.sql import sql, text

ROOT = Path(__file__).parents[2]
FILES = sorted(p.stem for p in (ROOT / "warehouse" / "sql").glob("*.sql"))
INCLUDE_ONLY = {
    "increase",
    "requests_hourly",
    "requests_hour_where",
    "request_slo",
    "request_slo_judged",
    "requests_slo_minutes",
    "requests_slo_counts",
    "requests_slo_rolled",
    "requests_slo_add",
    *("read_members", "read_raw_samples", "read_per_pool", "read_per_pool_raw", "read_pool_rollup", "read_no_rows"),
}  # CTE lists that only make sense inside a statement, and read.py's pieces of one (bound in it below)
NOT_PREPARED = {  # PREPARE takes no DDL, SET or BEGIN: each of these parses as one statement
    "db_schema_migrations": "CREATE TABLE IF NOT EXISTS, before the migrations",
    "db_memory_limit": "SET (its value bound)",
    "db_threads": "SET (its value bound)",
    "db_join_filters": "SET (its value bound)",
    "db_checkpoint_threshold": "SET (its value bound)",
    "readonly_lock_down": "SET",
    "readonly_lock_configuration": "SET",
    "readonly_begin": "BEGIN TRANSACTION READ ONLY",
    "rollup_rename_rolled": "ALTER TABLE of a roll's temp table",
    "rollup_drop": "DROP TABLE of a roll's temp table",
}
_ROLLUPS = ("increments_1m", "increments_6m", "increments_1h")
_POOLS = ("pool_histograms_1m", "pool_histograms_6m", "pool_histograms_1h")
_KEPT = ("samples", "increments", "samples_1m", "samples_1h", "expert_load", "expert_load_1h", "requests_1h")
BATCH_COLUMNS = {"requests": ", ".join(("gateway", "seq", "ingested_at", *RECORD_COLUMNS))}
"""A batch's columns where they are not the table's (requests_insert.sql gives the durations in seconds)."""
FILLED = {  # each `{{key}}` a statement has, given each identifier the code gives it
    "db_insert_batch": [{"table": t} for t in ("scrapes", "samples", "increments", "series", "expert_load")],
    "rollup_compact_series": [{"table": t} for t in _ROLLUPS],
    "rollup_compact_pools": [{"table": t} for t in _POOLS],
    "rollup_compact_delete": [{"table": t} for t in _ROLLUPS + _POOLS],
    "rollup_compact_insert": [{"table": t} for t in _ROLLUPS],
    "rollup_store": [{"table": t} for t in _ROLLUPS],
    "rollup_store_pools": [{"table": t} for t in _POOLS],
    "rollup_retention": [{"table": t} for t in _ROLLUPS + _POOLS + _KEPT + ("requests_itl_1h", "requests_slo_1m")],
    "export_by_key": [{"table": t} for t in BY_SERIES],
    "export_chunk_by_key": [{"table": t} for t in BY_SERIES],
    "export_rows": [{"table": t} for t in FACT_TABLES + DIMENSION_TABLES if t not in BY_SERIES],
    "export_chunk": [{"table": t, "time": TIME_COLUMN.get(t, "ts")} for t in FACT_TABLES if t not in BY_SERIES],
}
PREPARE_CREATED = re.compile(r"CREATE (OR REPLACE )?TEMP TABLE \w+ AS\s")  # a temp table: its query is prepared
SQL_WORDS = re.compile(
    r"\b(SELECT|INSERT|DELETE|UPDATE)\b[\s\S]*\b(FROM|INTO|SET)\b"  # a query or a write
    r"|\b(CREATE|ALTER|DROP)(\s+OR\s+REPLACE)?(\s+TEMP|\s+TEMPORARY)?\s+(TABLE|VIEW|INDEX|SEQUENCE|MACRO|SCHEMA)\b"
    r"|\b(ATTACH|DETACH)\s+(DATABASE\s+)?(IF\s+(NOT\s+)?EXISTS\s+)?['\"\w{$]"
    r"|^\s*(SELECT|WITH|SET|RESET|CHECKPOINT|BEGIN|COMMIT|ROLLBACK|PRAGMA|INSTALL|LOAD|COPY|VACUUM|USE)\b",
    re.MULTILINE,
)
SQL_ALLOWED = {
    "warehouse/sql/__init__.py",  # the loader itself
}


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect()
    apply_migrations(c)
    c.execute("CREATE TEMP TABLE rolled AS SELECT * FROM increments_1m LIMIT 0")  # what a roll adds (rollup.py)
    c.execute("CREATE TEMP TABLE rolled_minutes AS SELECT * FROM rolled")  # a roll's minutes (rollup.py)
    c.execute("CREATE TEMP TABLE compacted AS SELECT * FROM rolled")  # a compaction's rows (rollup.py)
    return c


def composed(t: str) -> str:
    """A line `/*name*/` that names another file stands for it (warehouse/sql INCLUDES); export.named_by_key's
    `/*where*/` for its condition, none given."""
    return re.sub(r"/\*(\w+)\*/", lambda m: sql(m[1]) if m[1] in FILES else m[0], t).replace("/*where*/", "TRUE")


LAKE = [n for n in FILES if n.startswith("lake_")]  # run on an attached lake or its PostgreSQL catalog: parsed below
LAKE_PARTS = {"lake_edges", "lake_pg_owner_only"}  # a condition and a PL/pgSQL branch, written into statements


@pytest.mark.parametrize("name", [n for n in FILES if n not in INCLUDE_ONLY and n not in LAKE])
def test_every_statement_binds_against_the_schema(con, name):
    """Prepared with every include and table marker in place, against the migrated schema: a typo in a
    column or a table name fails here, not on a page. A counter statement binds over each of the
    sources the read layer may give it (a pooled one: the pool rollups, or the per-series ones). A
    statement PREPARE takes no form of (NOT_PREPARED) only parses."""
    if name in NOT_PREPARED:
        assert len(con.extract_statements(re.sub(r"\{\{\w+\}\}", "x", text(name)))) == 1
        return
    texts = [composed(sql(name, **identifiers)) for identifiers in FILLED.get(name, [{}])]
    if "increase*/" in text(name):
        texts = [statement(name, Holdings(pooled=pooled)) for pooled in (True, False)]
    for t in texts:
        t = PREPARE_CREATED.sub(
            "", t.replace("/*samples*/", SAMPLES[None]).replace("/*expert_load*/", EXPERT_LOAD[None])
        )
        if "_insert_batch" in t:  # a batch insert reads an Arrow table shaped as the table it fills (db.insert_arrow)
            into = re.search(r"INSERT (?:OR \w+ )?INTO (\w+)", t)
            assert into, name
            columns = BATCH_COLUMNS.get(into[1], "*")
            con.execute(f"CREATE OR REPLACE TEMP VIEW _insert_batch AS SELECT {columns} FROM {into[1]} LIMIT 0")
        con.execute("PREPARE s AS " + t)
        con.execute("DEALLOCATE s")


@pytest.mark.parametrize("name", [n for n in LAKE if n not in LAKE_PARTS])
def test_every_lake_statement_parses(name):
    """The lake's statements run against an attached lake or its PostgreSQL catalog (lake_pg_*), not
    against this schema: each says what it does on its first line and has each of its slots filled
    (warehouse/lake.py _statement), and a DuckDB one parses as one statement. The PostgreSQL ones run
    in tests/warehouse/test_lake.py and tests/hostile/test_lake.py."""
    written = text(name)
    assert written.startswith("-- "), name
    identifiers = {key: "series" for key in re.findall(r"\{\{(\w+)\}\}", written)}
    quoted = {key: "INTEGER" if form == ":" else "x" for form, key in re.findall(r"\{\{(['\":])(\w+)", written)}
    filled = _statement(name, quoted=quoted, **identifiers)
    assert "{{" not in filled and "/*lake_" not in filled, name
    if not name.startswith("lake_pg_"):
        assert len(duckdb.connect().extract_statements(filled)) == 1, name


def test_every_file_not_prepared_or_filled_exists():
    assert sorted((set(NOT_PREPARED) | set(FILLED)) - set(FILES)) == []


def sql_in(path: Path) -> list[str]:
    """Where a string literal or f-string (its values as `{}`) of a Python file holds SQL."""
    tree = ast.parse(path.read_text())
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            literal = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            literal = node.value
        else:
            continue
        if SQL_WORDS.search(literal):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_sql_under_dashboard():
    """dashboard/ calls warehouse/read.py and never names a table (ast: SQL in any string literal)."""
    assert [f for path in sorted((ROOT / "dashboard").rglob("*.py")) for f in sql_in(path)] == []


def test_no_sql_in_the_warehouse_or_the_collectors_code():
    """Every statement the warehouse and the collectors run, reads and writes, DDL, SET and
    transaction statements alike, is a file of warehouse/sql; none is written in Python (ast: SQL
    in any string literal or f-string, the SQL_ALLOWED files aside)."""
    paths = sorted([*(ROOT / "warehouse").rglob("*.py"), *(ROOT / "collectors").rglob("*.py")])
    assert [f for p in paths if str(p.relative_to(ROOT)) not in SQL_ALLOWED for f in sql_in(p)] == []
