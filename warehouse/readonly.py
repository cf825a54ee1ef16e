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
   `setseed`, `sleep_ms`, ...); every catalog view, table function or scalar function in
   `EXPOSING` that shows settings, file paths, secrets or logs (`pg_settings`,
   `current_setting()`, `duckdb_databases()`'s `path`, ...).

Bounded: a statement is refused before planning past `Limits.max_sql_chars`, its tree past
`max_tree_nodes` nodes, `max_relations` table references or `max_selects` SELECTs (planning
memory is outside DuckDB's buffer pool: 8,000 `UNION ALL`s took 1.9 GB); the query is
interrupted on the server at `timeout_seconds`, or as soon as `gone()` says its client left;
its result is read in batches (`open_read`: at most `VALUES_PER_BATCH` values each, however wide
the result) and refused past `max_result_rows`; `run_read` also refuses it past `max_result_bytes`
of Arrow, and the query API past that many bytes of its answer, as it is written. A column of a
type the Arrow export cannot carry, or carries only as DuckDB's internal bytes (`UNSENDABLE`), is
refused by name before any row is read.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import pyarrow as pa

from moemeter.contract.errors import MoemeterError

from .limits import Limits
from .sql import sql

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
# Catalog views, table functions and scalar functions that show the warehouse's settings (the
# database file's directory in temp_directory, extension and secret directories), attached
# databases' file paths (duckdb_databases' `path`), secrets or logs: refused wherever named.
EXPOSING = frozenset(
    {
        "pg_settings",
        "duckdb_settings",
        "current_setting",
        "duckdb_databases",
        "pragma_database_list",
        "duckdb_secrets",
        "which_secret",
        "duckdb_extensions",
        "duckdb_temporary_files",
        "duckdb_logs",
        "duckdb_log_contexts",
        "duckdb_logs_parsed",
        "duckdb_variables",
        "duckdb_external_file_cache",
        "duckdb_profiling_settings",
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
VALUES_PER_BATCH = 1 << 20  # a wide result is read in fewer rows a batch: 100 columns, 10,485 rows
# DuckDB types the Arrow export refuses (VARIANT), or sends as DuckDB's internal bytes, which no
# client can read ('0101'::BIT arrives as the bytes 04 f5): refused, with the column named.
UNSENDABLE = {
    "variant": "DuckDB cannot export it as Arrow",
    "bit": "it would arrive as DuckDB's internal bytes",
    "bignum": "it would arrive as DuckDB's internal bytes",
}
# Settings turned off for every connection readers use (warehouse/sql/readonly_lock_down.sql): no
# file or network access from SQL, no Python variable read as a table; and no SQL can change a
# setting afterwards (readonly_lock_configuration.sql).
LOCKED_DOWN = ("enable_external_access", "python_enable_replacements")
Params = list[Any] | dict[str, Any]
"""A statement's parameters: a list for `?` placeholders, an object for `$name` ones."""


def lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Turn off LOCKED_DOWN on a database instance and lock its configuration."""
    for setting in LOCKED_DOWN:
        con.execute(sql("readonly_lock_down", setting=setting))
    con.execute(sql("readonly_lock_configuration"))


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


def _parse_tree(statement: str) -> dict[str, Any]:
    """DuckDB's own parse tree of `statement`, from a private in-memory connection."""
    global _parser, _refused_scalars
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect(":memory:")
            volatile = _parser.execute(sql("readonly_volatile_functions")).fetchall()
            _refused_scalars = frozenset(name for (name,) in volatile) - HARMLESS_VOLATILE
        text = _parser.execute(sql("readonly_parse"), {"sql": statement}).fetchone()
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
            if kind == "BASE_TABLE":
                _refuse_exposing(str(item.get("table_name", "")))
            relations += kind not in ("JOIN", "EMPTY")
            if relations > limits.max_relations:
                raise QueryTooLarge(
                    f"the statement reads over {limits.max_relations} tables, views or table "
                    "functions; join fewer at once"
                )
            if kind == "TABLE_FUNCTION":
                name = str((item.get("function") or {}).get("function_name", "")).lower()
                _refuse_exposing(name, "()")
                if name not in TABLE_FUNCTIONS:
                    raise QueryRefused(
                        f"table function {name}() is not allowed: readers may call {', '.join(sorted(TABLE_FUNCTIONS))}"
                    )
        elif item.get("class") == "FUNCTION":
            name = str(item.get("function_name", "")).lower()
            _refuse_exposing(name, "()")
            if name in _refused_scalars:
                raise QueryRefused(f"function {name}() is not allowed: it changes state or waits")
        stack.extend(v for v in item.values() if isinstance(v, (dict, list)))


def _refuse_exposing(name: str, suffix: str = "") -> None:
    if name.lower() in EXPOSING:
        raise QueryRefused(
            f"{name}{suffix} is not allowed: it shows the warehouse's settings, file paths, secrets or "
            "logs, which readers may not see; the tables, views and duckdb_tables() are open"
        )


class ResultStream:
    """A statement's result as it is read: its `schema`, then its record batches (iterate once),
    each counted against the row limit. `check()` raises once the time limit passed or the
    client left, for a caller that works between batches (serialising them)."""

    def __init__(
        self, reader: pa.RecordBatchReader, limits: Limits, deadline: float, why: list[str], columns: str
    ) -> None:
        self.schema: pa.Schema = reader.schema
        self.deadline = deadline  # time.monotonic() by which the statement and its answer are done
        self._reader, self._limits, self._why, self._columns = reader, limits, why, columns

    def check(self) -> None:
        if self._why == ["gone"]:
            raise ClientGone("the client left; its query was stopped")
        if self._why or time.monotonic() >= self.deadline:
            raise QueryTimeout(f"the query ran past the {self._limits.timeout_seconds:g} s limit and was stopped")

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        rows = 0
        while True:
            self.check()
            try:
                batch = self._reader.read_next_batch()
            except StopIteration:
                return
            except (OSError, NotImplementedError, pa.ArrowException) as exc:
                # DuckDB's errors while the result streams arrive through Arrow's C stream as OSError
                self.check()  # interrupted at the time limit or for a client that left
                raise _streaming_error(exc, self._columns) from exc
            rows += batch.num_rows
            if rows > self._limits.max_result_rows:
                raise QueryTooLarge(
                    f"the result is over {self._limits.max_result_rows:,} rows; add a LIMIT, a filter or an aggregate"
                )
            yield batch


def _streaming_error(exc: BaseException, columns: str) -> QueryError:
    text = str(exc)
    if text.startswith("Out of Memory Error"):
        return QueryTooLarge(f"the query needs more memory than the warehouse may use: {text}")
    if text.startswith("Not implemented Error") or isinstance(exc, NotImplementedError):
        return QueryRefused(f"the result cannot be sent ({text}); cast the column of that type to VARCHAR ({columns})")
    return QueryRefused(f"query failed: {text}")


def mib(n: int) -> str:
    """Bytes as MiB for a message: 4 MiB, 0.0625 MiB."""
    return f"{n / 2**20:,.4g} MiB"


def run_read(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: Params | None = None,
    limits: Limits | None = None,
    gone: Callable[[], bool] | None = None,
) -> pa.Table:
    """Check `sql`, then run it on `con` (a cursor of the caller's own) in a read-only
    transaction that is always rolled back, within `limits`; `gone()` is asked every 0.1 s
    whether the client left. The whole result as one table, refused past `max_result_bytes`
    of Arrow. Raises a QueryError subclass for every refusal."""
    limits = limits or Limits()
    check_read_only(sql, limits)
    return _run_guarded(con, sql, params, limits, gone)


@contextmanager
def open_read(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    params: Params | None = None,
    limits: Limits | None = None,
    gone: Callable[[], bool] | None = None,
    deadline: float | None = None,
) -> Iterator[ResultStream]:
    """`run_read` for a caller that turns the result into something else batch by batch (the
    query API's answer), holding no more than one batch of it: the statement stays open, within
    its time limit (or `deadline`, a time.monotonic()), for as long as the block runs."""
    limits = limits or Limits()
    check_read_only(sql, limits)
    with _guarded(con, sql, params, limits, gone, deadline) as stream:
        yield stream


def _run_guarded(
    con: duckdb.DuckDBPyConnection, sql: str, params: Params | None, limits: Limits, gone: Callable[[], bool] | None
) -> pa.Table:
    """Guard 1 alone: the read-only, rolled-back transaction and the limits (tests call it
    without guard 2 to show it holds by itself)."""
    with _guarded(con, sql, params, limits, gone) as stream:
        batches, size = [], 0
        for batch in stream:
            size += batch.nbytes
            if size > limits.max_result_bytes:
                raise QueryTooLarge(
                    f"the result is over {mib(limits.max_result_bytes)}; add a LIMIT, a filter or an aggregate"
                )
            batches.append(batch)
        return pa.Table.from_batches(batches, schema=stream.schema)


def _type_ids(t: Any) -> Iterator[str]:
    """The ids of a DuckDB type and of every type nested in it (list, struct, map, union, array)."""
    yield t.id
    if t.id in ("list", "struct", "map", "union", "array"):
        for _, child in t.children:
            if isinstance(child, duckdb.sqltypes.DuckDBPyType):
                yield from _type_ids(child)


def _refuse_unsendable(description: list[Any]) -> None:
    for column, t, *_ in description:
        why = next((UNSENDABLE[i] for i in _type_ids(t) if i in UNSENDABLE), None)
        if why:
            raise QueryRefused(
                f"column {column!r} is {t}, which cannot be sent ({why}); cast it to VARCHAR or to a "
                f"plain type in the SELECT (CAST({column} AS VARCHAR))"
            )


@contextmanager
def _guarded(
    con: duckdb.DuckDBPyConnection,
    statement: str,
    params: Params | None,
    limits: Limits,
    gone: Callable[[], bool] | None,
    deadline: float | None = None,
) -> Iterator[ResultStream]:
    lock, running, why = threading.Lock(), threading.Event(), []
    finished = threading.Event()
    end = time.monotonic() + limits.timeout_seconds if deadline is None else deadline

    def watch() -> None:
        while not finished.wait(max(0.0, min(0.1, end - time.monotonic()))):
            reason = "timeout" if time.monotonic() >= end else "gone" if gone is not None and gone() else None
            if reason:
                with lock:  # interrupt only while the statement runs, never a later one
                    if running.is_set():
                        why.append(reason)
                        con.interrupt()
                return

    con.execute(sql("readonly_begin"))  # the connection API's begin() has no read-only form
    reader: pa.RecordBatchReader | None = None
    watcher = threading.Thread(target=watch, name="query-watch", daemon=True)
    running.set()
    watcher.start()
    try:
        # execute, not con.sql: given parameters, con.sql runs the statement at once into a result
        # it then scans again to stream it (a day's 310k rows of rank tokens: 0.34 s, then 0.6 s more)
        con.execute(statement, params or None)
        description = con.description or []
        _refuse_unsendable(description)
        columns = ", ".join(f"{c!r} {t}" for c, t, *_ in description)[:500]
        try:
            reader = con.to_arrow_reader(min(ROWS_PER_BATCH, max(2_048, VALUES_PER_BATCH // max(1, len(description)))))
        except (OSError, NotImplementedError) as exc:  # e.g. a type DuckDB cannot export, not in UNSENDABLE yet
            raise _streaming_error(exc, columns) from exc
        yield ResultStream(reader, limits, end, why, columns)
    except duckdb.InterruptException as exc:
        if why == ["gone"]:
            raise ClientGone("the client left; its query was stopped") from exc
        raise QueryTimeout(f"the query ran past the {limits.timeout_seconds:g} s limit and was stopped") from exc
    except duckdb.OutOfMemoryException as exc:
        raise QueryTooLarge(f"the query needs more memory than the warehouse may use: {exc}") from exc
    except duckdb.Error as exc:
        raise QueryRefused(f"query failed: {exc}") from exc
    finally:
        with lock:
            running.clear()
        finished.set()
        watcher.join()
        if reader is not None:  # a result left unread (refused past a limit) is released here
            reader.close()
        try:
            con.rollback()
        except duckdb.Error:  # nothing to roll back
            pass
