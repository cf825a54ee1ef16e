"""The one read layer: every SQL text a user sends reaches the warehouse only through `run_read`.

The query API, `moemeter query`, `report --api`, `export` and any later reader (a fleet or
lake reader) call it; none runs user SQL another way. Two guards, each enough alone:

1. The connection cannot write: the statement runs inside `BEGIN TRANSACTION READ ONLY`, and
   that transaction is rolled back whatever happens. DuckDB refuses any write in a read-only
   transaction (a DELETE inside a CTE, `nextval`, ...), and a rollback undoes anything else.
2. The parsed tree holds nothing but reads: DuckDB's own parser (`json_serialize_sql`) turns
   the text into a tree, and it is walked whole, through CTEs, subqueries, set operations and
   joins. Refused: any statement but one SELECT; any query node but SELECT, set operations and
   CTEs (so `WITH x AS (DELETE ... RETURNING *)`); any table function not in
   `TABLE_FUNCTIONS` (no `query()`, `read_blob()`, `checkpoint()`, file or network readers);
   the scalar functions DuckDB marks VOLATILE that change state or wait (`nextval`,
   `setseed`, `sleep_ms`, ...).

Bounded: a statement is refused before planning past `Limits.max_sql_chars`, its tree past
`max_tree_nodes` nodes, `max_relations` table references or `max_selects` SELECTs (planning
memory is outside DuckDB's buffer pool: 8,000 `UNION ALL`s took 1.9 GB); the query is
interrupted on the server at `timeout_seconds`, or as soon as `gone()` says its client left;
its result is read in batches and refused past `max_result_rows` or `max_result_bytes`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb
import pyarrow as pa

from moemeter.errors import MoemeterError

from .limits import Limits

# Table functions a reader may call: row generators and catalog introspection, none reads a
# file, the network, or runs SQL of its own.
TABLE_FUNCTIONS = frozenset(
    {
        "range",
        "generate_series",
        "unnest",
        "repeat",
        "repeat_row",
        "json_each",
        "json_tree",
        "duckdb_columns",
        "duckdb_constraints",
        "duckdb_databases",
        "duckdb_functions",
        "duckdb_indexes",
        "duckdb_keywords",
        "duckdb_schemas",
        "duckdb_tables",
        "duckdb_types",
        "duckdb_views",
        "pragma_table_info",
        "pragma_version",
        "pragma_database_size",
    }
)
# VOLATILE functions that only read or compute: every other VOLATILE one is refused.
HARMLESS_VOLATILE = frozenset(
    {
        "random",
        "uuid",
        "uuidv4",
        "uuidv7",
        "gen_random_uuid",
        "error",
        "currval",
        "current_query",
        "current_query_id",
        "current_connection_id",
        "current_transaction_id",
    }
)
QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})
TABLE_REFS = frozenset(
    {"BASE_TABLE", "SUBQUERY", "JOIN", "TABLE_FUNCTION", "EXPRESSION_LIST", "EMPTY", "PIVOT", "SHOW_REF"}
)
ROWS_PER_BATCH = 65_536
# Settings for every connection readers use: no file or network access from SQL, no Python
# variable read as a table, and no SQL can change a setting afterwards.
LOCKED_DOWN = {"enable_external_access": False, "python_enable_replacements": False}
Params = list[Any] | dict[str, Any]
"""A statement's parameters: a list for `?` placeholders, an object for `$name` ones."""


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Apply LOCKED_DOWN to a database instance and lock its configuration."""
    for name, value in LOCKED_DOWN.items():
        con.execute(f"SET {name} = {str(value).lower()}")
    con.execute("SET lock_configuration = true")


class QueryError(MoemeterError, RuntimeError):
    """A query the warehouse would not or could not answer; the message says why and what to do."""

    status = 500


class QueryRefused(QueryError):
    """The statement is not a plain read, or cannot be parsed: the message names the construct."""

    status = 400


class QueryTooLarge(QueryError):
    """The statement or its result is over a limit."""

    status = 413


class QueryTimeout(QueryError):
    """The statement ran past the wall-time limit and was stopped."""

    status = 504


class QueryBusy(QueryError):
    """Too many statements are running; retry after a moment."""

    status = 503


class ClientGone(QueryError):
    """The client left while its statement ran; it was stopped and nobody is told."""

    status = 499


_parser_lock = threading.Lock()
_parser: duckdb.DuckDBPyConnection | None = None
_refused_scalars: frozenset[str] = frozenset()


def _parse_tree(sql: str) -> dict[str, Any]:
    """DuckDB's own parse tree of `sql`, from a private in-memory connection."""
    global _parser, _refused_scalars
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:")
            volatile = _parser.execute(
                "SELECT DISTINCT function_name FROM duckdb_functions() WHERE stability = 'VOLATILE'"
            ).fetchall()
            _refused_scalars = frozenset(name for (name,) in volatile) - HARMLESS_VOLATILE
        text = _parser.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()
    assert text is not None
    try:
        tree: dict[str, Any] = json.loads(text[0])
    except RecursionError:
        raise QueryRefused("the statement is nested too deeply to check; flatten its subqueries") from None
    if tree.get("error"):
        raise QueryRefused(f"cannot check the statement: {tree.get('error_message')}")
    return tree


def check_read_only(sql: str, limits: Limits | None = None) -> None:
    """Pass exactly one SELECT whose whole parsed tree only reads; refuse anything else with
    the construct that was found."""
    limits = limits or Limits()
    if not isinstance(sql, str) or not sql.strip():
        raise QueryRefused("no SQL given")
    if len(sql) > limits.max_sql_chars:
        raise QueryTooLarge(f"the statement is {len(sql):,} characters; the limit is {limits.max_sql_chars:,}")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(f"cannot parse SQL: {exc}") from exc
    if len(statements) != 1:
        raise QueryRefused(f"exactly one statement is allowed, got {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only SELECT statements are allowed, got {kind.name}")
    _check_tree(_parse_tree(sql), limits)


def _check_tree(tree: dict[str, Any], limits: Limits) -> None:
    nodes = relations = selects = 0
    stack: list[Any] = [tree.get("statements", [])]
    while stack:  # iterative: a deep tree must not exhaust Python's stack
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        nodes += 1
        if nodes > limits.max_tree_nodes:
            raise QueryTooLarge(f"the statement's parse tree has over {limits.max_tree_nodes:,} nodes; simplify it")
        kind = item.get("type")
        if "cte_map" in item and "modifiers" in item:  # a query node
            if kind not in QUERY_NODES:
                what = str(kind).removesuffix("_QUERY_NODE").removesuffix("_NODE").replace("_", " ")
                raise QueryRefused(f"{what} is not allowed inside a query: the query API only reads")
            selects += kind == "SELECT_NODE"
            if selects > limits.max_selects:
                raise QueryTooLarge(f"the statement has over {limits.max_selects} SELECTs (UNION branches count)")
        elif "sample" in item and "alias" in item and "class" not in item:  # a table reference
            if kind not in TABLE_REFS:
                raise QueryRefused(f"table reference of type {kind} is not allowed")
            relations += kind not in ("JOIN", "EMPTY")
            if relations > limits.max_relations:
                raise QueryTooLarge(
                    f"the statement reads over {limits.max_relations} tables, views or table "
                    "functions; join fewer at once"
                )
            if kind == "TABLE_FUNCTION":
                name = str((item.get("function") or {}).get("function_name", "")).lower()
                if name not in TABLE_FUNCTIONS:
                    raise QueryRefused(
                        f"table function {name}() is not allowed: readers may call {', '.join(sorted(TABLE_FUNCTIONS))}"
                    )
        elif item.get("class") == "FUNCTION":
            name = str(item.get("function_name", "")).lower()
            if name in _refused_scalars:
                raise QueryRefused(f"function {name}() is not allowed: it changes state or waits")
        stack.extend(v for v in item.values() if isinstance(v, (dict, list)))


def run_read(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: Params | None = None,
    limits: Limits | None = None,
    gone: Callable[[], bool] | None = None,
) -> pa.Table:
    """Check `sql`, then run it on `con` (a cursor of the caller's own) in a read-only
    transaction that is always rolled back, within `limits`; `gone()` is asked every 0.1 s
    whether the client left. Raises a QueryError subclass for every refusal."""
    limits = limits or Limits()
    check_read_only(sql, limits)
    return _run_guarded(con, sql, params, limits, gone)


def _run_guarded(
    con: duckdb.DuckDBPyConnection, sql: str, params: Params | None, limits: Limits, gone: Callable[[], bool] | None
) -> pa.Table:
    """Guard 1 alone: the read-only, rolled-back transaction and the limits (tests call it
    without guard 2 to show it holds by itself)."""
    lock, running, why = threading.Lock(), threading.Event(), []
    finished = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + limits.timeout_seconds
        while not finished.wait(max(0.0, min(0.1, deadline - time.monotonic()))):
            reason = "timeout" if time.monotonic() >= deadline else "gone" if gone is not None and gone() else None
            if reason:
                with lock:  # interrupt only while the statement runs, never a later one
                    if running.is_set():
                        why.append(reason)
                        con.interrupt()
                return

    con.execute("BEGIN TRANSACTION READ ONLY")
    watcher = threading.Thread(target=watch, name="query-watch", daemon=True)
    running.set()
    watcher.start()
    try:
        # execute, not con.sql: given parameters, con.sql runs the statement at once into a result
        # it then scans again to stream it (a day's 310k rows of rank tokens: 0.34 s, then 0.6 s more)
        reader = con.execute(sql, params or None).to_arrow_reader(ROWS_PER_BATCH)
        batches, rows, size = [], 0, 0
        for batch in reader:
            rows, size = rows + batch.num_rows, size + batch.nbytes
            if rows > limits.max_result_rows or size > limits.max_result_bytes:
                raise QueryTooLarge(
                    f"the result is over {limits.max_result_rows:,} rows or "
                    f"{limits.max_result_bytes / 2**20:,.0f} MiB; add a LIMIT, a filter or "
                    "an aggregate"
                )
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=reader.schema)
    except duckdb.InterruptException as exc:
        if why == ["timeout"]:
            raise QueryTimeout(f"the query ran past the {limits.timeout_seconds:g} s limit and was stopped") from exc
        raise ClientGone("the client left; its query was stopped") from exc
    except duckdb.OutOfMemoryException as exc:
        raise QueryTooLarge(f"the query needs more memory than the warehouse may use: {exc}") from exc
    except duckdb.Error as exc:
        raise QueryRefused(f"query failed: {exc}") from exc
    except pa.ArrowException as exc:
        raise QueryRefused(f"the result cannot be sent as Arrow: {exc}") from exc
    finally:
        with lock:
            running.clear()
        finished.set()
        watcher.join()
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:  # nothing to roll back
            pass
