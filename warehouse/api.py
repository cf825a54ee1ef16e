"""The warehouse's read-only query API on loopback, and its client.

POST /query {"sql": "...", "params": [...], "format": "arrow"|"json"}: exactly one SELECT
statement (DuckDB's own parser decides), run on a reader cursor. Anything else is refused
with 400 and the reason. GET /health answers {"ok": true, "writer": {...}}: whether writes
succeed, and if not since when, why (disk full, read-only) and how many rounds were lost.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import duckdb
import httpx
import pandas as pd
import pyarrow as pa

from .db import Warehouse

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 1 << 20
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class QueryRefused(ValueError):
    """The statement is not a single SELECT."""


def check_select(sql: str) -> None:
    """Pass exactly one SELECT statement; refuse everything else with the reason."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryRefused(f"cannot parse SQL: {exc}") from exc
    if len(statements) != 1:
        raise QueryRefused(f"exactly one statement is allowed, got {len(statements)}")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefused(f"only SELECT statements are allowed, got {kind.name}")


def run_select(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> pa.Table:
    check_select(sql)
    return con.sql(sql, params=params or None).to_arrow_table()


def _json_value(v: Any) -> Any:
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    return v


def table_to_json(tbl: pa.Table) -> dict[str, Any]:
    rows = [[_json_value(v) for v in row.values()] for row in tbl.to_pylist()]
    return {"columns": tbl.column_names, "types": [str(t) for t in tbl.schema.types], "rows": rows}


class _Handler(BaseHTTPRequestHandler):
    server: QueryServer

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._reply(status, json.dumps({"error": message}).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":  # queries answer even when the writer cannot write
            writer = self.server.warehouse.health.as_json()
            self._reply(200, json.dumps({"ok": True, "writer": writer}).encode(), "application/json")
        else:
            self._error(404, "GET /health or POST /query")

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/query":
            self._error(404, "POST /query")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_REQUEST_BYTES:
            self._error(400, f"request body must be 1..{MAX_REQUEST_BYTES} bytes of JSON")
            return
        try:
            req = json.loads(self.rfile.read(length))
            sql, params, fmt = req["sql"], req.get("params") or [], req.get("format", "arrow")
            if not isinstance(sql, str) or not isinstance(params, list) or fmt not in ("arrow", "json"):
                raise TypeError("sql must be a string, params a list, format arrow or json")
        except (ValueError, KeyError, TypeError) as exc:
            self._error(400, f"bad request: {exc}")
            return
        try:
            with self.server.warehouse.cursor() as cur:
                tbl = run_select(cur, sql, params)
        except QueryRefused as exc:
            self._error(400, str(exc))
            return
        except duckdb.Error as exc:
            self._error(400, f"query failed: {exc}")
            return
        if fmt == "json":
            self._reply(200, json.dumps(table_to_json(tbl)).encode(), "application/json")
            return
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, tbl.schema) as writer:
            writer.write_table(tbl)
        self._reply(200, sink.getvalue().to_pybytes(), ARROW_STREAM)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("query api: " + format, *args)


class QueryServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, warehouse: Warehouse, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.warehouse = warehouse

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="query-api", daemon=True)
        t.start()
        return t


@dataclass
class QueryClient:
    """What the dashboard and CLI use: SQL in, DataFrame out."""

    url: str
    timeout: float = 30.0

    def __call__(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        wire = [p.isoformat() if isinstance(p, (datetime, date)) else p for p in params or []]
        resp = httpx.post(f"{self.url}/query", json={"sql": sql, "params": wire}, timeout=self.timeout)
        if resp.status_code != 200:
            try:
                message = resp.json()["error"]
            except (ValueError, KeyError):
                message = resp.text[:200]
            raise QueryRefused(message) if resp.status_code == 400 else RuntimeError(message)
        with pa.ipc.open_stream(resp.content) as reader:
            return reader.read_all().to_pandas()


@dataclass
class LocalQuery:
    """The same contract as QueryClient over a connection in this process (CLI, tests)."""

    con: duckdb.DuckDBPyConnection

    def __call__(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        return run_select(self.con, sql, params).to_pandas()
