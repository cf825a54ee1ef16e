"""The warehouse's read-only query API on loopback, and its client.

Bound beyond loopback it requires a token (MOEMETER_API_TOKEN, or a file) as
`Authorization: Bearer <token>` on every request; the client sends MOEMETER_API_TOKEN.

POST /query {"sql": "...", "params": [...], "format": "arrow"|"json"}: exactly one SELECT
statement (DuckDB's own parser decides), run on a reader cursor. Anything else is refused
with 400 and the reason. GET /health answers {"ok": true, "writer": {...}}: whether writes
succeed, and if not since when, why (disk full, read-only) and how many rounds were lost.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import math
import os
import threading
from dataclasses import dataclass, field
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
TOKEN_ENV = "MOEMETER_API_TOKEN"


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
    protocol_version = "HTTP/1.1"  # keep-alive: a page's queries share one connection
    disable_nagle_algorithm = True  # else headers and body in two writes wait ~40 ms for a delayed ACK
    timeout = 120  # seconds an idle kept-alive connection (and its thread) is held

    def _reply(self, status: int, body: bytes, content_type: str, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")  # the client then opens a new one for its next query
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        # A refused request's body may be unread: this connection is not reused.
        self._reply(status, json.dumps({"error": message}).encode(), "application/json", close=True)

    def _authorized(self) -> bool:
        """The token, when the server has one, compared in constant time; never logged."""
        want = self.server.token
        if not want:
            return True
        got = self.headers.get("Authorization", "")
        if hmac.compare_digest(got.encode(), f"Bearer {want}".encode()):
            return True
        self._error(401, "missing or wrong token (Authorization: Bearer ...)")
        return False

    def do_GET(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        if self.path == "/health":  # queries answer even when the writer cannot write
            writer = self.server.warehouse.health.as_json()
            self._reply(200, json.dumps({"ok": True, "writer": writer}).encode(), "application/json")
        else:
            self._error(404, "GET /health or POST /query")

    def do_POST(self) -> None:  # noqa: N802
        if not self._authorized():
            return
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


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class QueryServer(ThreadingHTTPServer):
    """The API on `host`. Off loopback it requires `token` (Authorization: Bearer), and refuses
    to start without one."""

    daemon_threads = True

    def __init__(self, warehouse: Warehouse, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        if not token and not is_loopback(host):
            raise QueryRefused(f"the query API on {host} (beyond loopback) needs a token: set {TOKEN_ENV} or "
                               "--api-token-file")  # fmt: skip
        super().__init__((host, port), _Handler)
        self.warehouse = warehouse
        self.token = token

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
    token: str | None = field(default_factory=lambda: os.environ.get(TOKEN_ENV) or None, repr=False)
    # One connection pool for all its queries: a new httpx client per query costs ~18 ms (TLS setup).
    _http: httpx.Client = field(default_factory=httpx.Client, init=False, repr=False, compare=False)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def __call__(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        wire = [p.isoformat() if isinstance(p, (datetime, date)) else p for p in params or []]
        body = {"sql": sql, "params": wire}
        try:
            resp = self._http.post(f"{self.url}/query", json=body, timeout=self.timeout, headers=self.headers())
        except (
            httpx.RemoteProtocolError
        ):  # a kept-alive connection the server closed meanwhile: a SELECT is safe to resend
            resp = self._http.post(f"{self.url}/query", json=body, timeout=self.timeout, headers=self.headers())
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
