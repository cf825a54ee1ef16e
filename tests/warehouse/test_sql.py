"""The SQL the warehouse runs lives in warehouse/sql/*.sql: each file parses, and no page carries SQL of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import duckdb
import pytest

from warehouse.db import apply_migrations
from warehouse.read import EXPERT_LOAD, SAMPLES, Holdings, statement
from warehouse.sql import sql, text

ROOT = Path(__file__).parents[2]
FILES = sorted(p.stem for p in (ROOT / "warehouse" / "sql").glob("*.sql"))
INCLUDE_ONLY = {
    "increase",
    "requests_hourly",
    "requests_hour_where",
    "request_slo",
}  # CTE lists that only make sense inside a statement
SQL_WORDS = re.compile(r"\b(SELECT|INSERT|DELETE|UPDATE)\b[\s\S]*\b(FROM|INTO|SET)\b")


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect()
    apply_migrations(c)
    c.execute("CREATE TEMP TABLE rolled AS SELECT * FROM increments_1m LIMIT 0")  # what a roll adds (rollup.py)
    return c


@pytest.mark.parametrize("name", [n for n in FILES if n not in INCLUDE_ONLY])
def test_every_statement_binds_against_the_schema(con, name):
    """Prepared with every include and table marker in place, against the migrated schema: a typo in a
    column or a table name fails here, not on a page. A counter statement binds over each of the
    sources the read layer may give it (a pooled one: the pool rollups, or the per-series ones)."""
    texts = [sql(name)]
    if "increase*/" in text(name):
        texts = [statement(name, Holdings(pooled=pooled)) for pooled in (True, False)]
    for t in texts:
        con.execute(
            "PREPARE s AS " + t.replace("/*samples*/", SAMPLES[None]).replace("/*expert_load*/", EXPERT_LOAD[None])
        )
        con.execute("DEALLOCATE s")


def test_no_sql_under_dashboard():
    """dashboard/ calls warehouse/read.py and never names a table (ast: SQL in any string literal)."""
    found = []
    for path in sorted((ROOT / "dashboard").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_WORDS.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
