"""The warehouse's read-only query API on loopback, and its client.

Bound beyond loopback it requires a token (MOEMETER_API_TOKEN, or a file) as
`Authorization: Bearer <token>` on every request; the client sends MOEMETER_API_TOKEN.

POST /query {"sql": "...", "params": [...] or {...}, "format": "arrow"|"json"}: one read (params a
list for `?` placeholders, an object for `$name` ones), run through
warehouse.readonly (read-only transaction, parse-tree check, limits) on a reader cursor.
Answers: 200 with the result; 400 a refused or failed statement (the message names the
construct), or a column of a type that cannot be sent (the message names it); 408 a request body
not received in time; 411/413 a body without a length or over the limit, or a result over the
limit; 503 with Retry-After while `max_concurrent` statements run and the queue wait passed; 504 a
statement stopped at the time limit. Either format's answer is written batch by batch while the
statement holds its slot, counted against `max_result_bytes` as it grows (refused there, never
built whole first), then sent whole within the same time limit; the slot is released once it is
sent. So the answers in flight hold at most `max_concurrent` x `max_result_bytes` (4 x 256 MiB).
GET /health answers {"ok": ..., "writer": {...}, "memory": {...}, "collector": {...}, "lake": {...}}: whether writes
succeed, and if not since when, why (disk full, read-only) and how many rounds were lost; under
`serve --lake`, the rack's watermark in the lake and the publisher's last failure; how many rounds
the collector stored, failed, stored target by target, and how many inputs it refused; the
process's resident memory and DuckDB's part of it against its cap. `ok` is
false while writes or rounds fail; /health still answers 200 then (queries do), and never waits for
a query.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import json
import logging
import math
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from datetime import time as dtime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import duckdb
import httpx
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import limits as _limits
from .db import Warehouse
from .readonly import (
    ClientGone,
    Limits,
    Params,
    QueryBusy,
    QueryError,
    QueryRefused,
    QueryTimeout,
    QueryTooLarge,
    ResultStream,
    mib,
    open_read,
    run_read,
)

log = logging.getLogger(__name__)
MAX_REQUEST_BYTES = 1 << 20
BODY_SECONDS = 10.0  # a request body must arrive within this (a slow client holds a thread no longer)
ARROW_STREAM = "application/vnd.apache.arrow.stream"
TOKEN_ENV = "MOEMETER_API_TOKEN"
# A batch becomes JSON this many values at a time (fewer where its Arrow is over SLICE_BYTES): the
# Python objects of a JSON answer in the making never hold more (100 columns: 655 rows).
VALUES_PER_SLICE = 65_536
SLICE_BYTES = 1 << 20
MIN_TOKEN_CHARS = 16  # from the environment or a file alike
__all__ = [
    "QueryClient",
    "QueryServer",
    "LocalQuery",
    "QueryError",
    "QueryRefused",
    "ApiUnreachable",
    "table_to_json",
    "is_loopback",
    "TOKEN_ENV",
]


class ApiUnreachable(QueryError):
    """The query API did not answer (not running, wrong address, or the connection broke)."""


def _json_value(v: Any) -> Any:
    """One value of any DuckDB type as JSON: BLOB as base64, temporal values in ISO 8601,
    NaN as null and infinities as strings at any depth, lists and structs recursively."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"
    if isinstance(v, Decimal):
        return _json_value(float(v))
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, (datetime, date, dtime)):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, pa.MonthDayNano):  # INTERVAL
        return {"months": v.months, "days": v.days, "nanoseconds": v.nanoseconds}
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):  # lists, arrays, and a MAP's (key, value) pairs
        return [_json_value(x) for x in v]
    if isinstance(v, uuid.UUID):
        return str(v)
    return str(v)


def _textual(t: pa.DataType) -> pa.DataType:
    """`t` with every date, time and timestamp inside it as text."""
    if pa.types.is_temporal(t) and not pa.types.is_interval(t) and not pa.types.is_duration(t):
        return pa.string()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_textual(t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_textual(t.value_type), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_textual(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_textual(t.key_type), _textual(t.item_type))
    return t


def _column_values(name: str, col: pa.Array | pa.ChunkedArray) -> list[Any]:
    try:
        return [_json_value(v) for v in col.to_pylist()]
    except (OverflowError, ValueError, pa.ArrowException):  # e.g. 'infinity' or a year past 9999: as text
        pass
    try:
        return [_json_value(v) for v in pc.cast(col, _textual(col.type)).to_pylist()]
    except (OverflowError, ValueError, pa.ArrowException) as exc:
        raise QueryRefused(
            f"column {name!r} ({col.type}) cannot be sent as JSON ({exc}); ask for format arrow or cast it to VARCHAR"
        ) from exc


def _json_rows(names: list[str], columns: list[pa.Array] | list[pa.ChunkedArray]) -> list[list[Any]]:
    """Rows of JSON values, columns kept apart by position (two columns of one name both arrive)."""
    values = [_column_values(n, c) for n, c in zip(names, columns, strict=True)]
    return [list(r) for r in zip(*values, strict=True)] if values else []


def table_to_json(tbl: pa.Table) -> dict[str, Any]:
    """A whole table as the query API's JSON answer (the API itself writes it batch by batch)."""
    rows = _json_rows(tbl.column_names, tbl.columns)
    return {"columns": tbl.column_names, "types": [str(t) for t in tbl.schema.types], "rows": rows}


def _slices(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    per = VALUES_PER_SLICE // max(1, batch.num_columns)
    if batch.nbytes > SLICE_BYTES:
        per = min(per, batch.num_rows * SLICE_BYTES // batch.nbytes)
    per = max(1, per)
    for start in range(0, batch.num_rows, per):
        yield batch.slice(start, per)


def json_chunks(stream: ResultStream) -> Generator[bytes]:
    """The JSON answer, {"columns", "types", "rows"}, as bytes, a slice of a batch at a time."""
    head = json.dumps({"columns": stream.schema.names, "types": [str(t) for t in stream.schema.types]})
    yield (head[:-1] + ', "rows": [').encode()
    sep = ""
    for batch in stream:
        for piece in _slices(batch):
            rows = _json_rows(stream.schema.names, piece.columns)
            if rows:
                yield (sep + json.dumps(rows, allow_nan=False)[1:-1]).encode()
                sep = ", "
            stream.check()  # a slow serialisation stops at the time limit too
    yield b"]}"


class _Sink:
    """Where the Arrow IPC writer puts its bytes, taken as they come."""

    closed = False

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self.chunks.append(chunk)
        return len(chunk)

    def flush(self) -> None:
        pass

    def take(self) -> list[bytes]:
        """What was written since, as one chunk (a batch's many small writes, one send)."""
        out, self.chunks = self.chunks, []
        return [b"".join(out)] if out else []


def arrow_chunks(stream: ResultStream) -> Generator[bytes]:
    """The Arrow IPC stream as bytes, a batch at a time."""
    sink = _Sink()
    with pa.ipc.new_stream(sink, stream.schema) as writer:
        yield from sink.take()
        for batch in stream:
            writer.write_batch(batch)
            yield from sink.take()
    yield from sink.take()


@dataclass(frozen=True)
class Answer:
    """A 200 reply's body, written whole within the result limit (so held in memory up to
    `max_result_bytes`, and its status can still be an error until then), sent by `deadline`."""

    chunks: list[bytes]
    content_type: str
    deadline: float  # time.monotonic(): the statement's time limit, which covers sending


def _collect(chunks: Generator[bytes], cap: int, over: str, hint: str = "") -> list[bytes]:
    """The answer's chunks, refused as soon as they add up to more than `cap` bytes."""
    out, size = [], 0
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > cap:
                raise QueryTooLarge(
                    f"{over} is over {mib(cap)}, the limit; add a LIMIT, a filter or an aggregate{hint}"
                )
            out.append(chunk)
    finally:
        chunks.close()  # a refused answer ends its statement now
    return out


def _peer_gone(sock: socket.socket) -> bool:
    """True once the client closed its side (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class _Refusal(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers or {}


class _Handler(BaseHTTPRequestHandler):
    server: QueryServer
    _sending = False  # a 200's status line is out: an error can no longer be answered
    protocol_version = "HTTP/1.1"  # keep-alive: a page's queries share one connection
    default_request_version = "HTTP/1.0"  # a garbled request line still gets a status line, not HTTP/0.9 bare HTML
    disable_nagle_algorithm = True  # else headers and body in two writes wait ~40 ms for a delayed ACK
    timeout = 120  # seconds an idle kept-alive connection (and its thread) is held

    def _reply(
        self, status: int, body: bytes, content_type: str, close: bool = False, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")  # the client then opens a new one for its next query
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        # A refused request's body may be unread: this connection is not reused.
        self._reply(status, json.dumps({"error": message}).encode(), "application/json", close=True, headers=headers)

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
        if self.path == "/health":  # answered with 200 while queries answer, even when writes fail
            self._reply(200, json.dumps(self.server.health()).encode(), "application/json")
        else:
            self._error(404, "GET /health or POST /query")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise _Refusal(411, "send the body with a Content-Length (no Transfer-Encoding)")
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise _Refusal(411, "a Content-Length header is required")
        if not raw.strip().isdigit():
            raise _Refusal(400, f"Content-Length {raw[:40]!r} is not a number of bytes")
        length = int(raw)
        if length == 0:
            raise _Refusal(400, 'empty body: send {"sql": "SELECT ..."}')
        if length > MAX_REQUEST_BYTES:
            raise _Refusal(413, f"request body of {length:,} bytes; the limit is {MAX_REQUEST_BYTES:,}")
        data, deadline = bytearray(), time.monotonic() + BODY_SECONDS
        try:
            while len(data) < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Refusal(408, f"the request body did not arrive within {BODY_SECONDS:g} s")
                self.connection.settimeout(left)
                chunk = self.rfile.read1(length - len(data))
                if not chunk:
                    raise _Refusal(400, f"the body ended after {len(data):,} of {length:,} bytes")
                data += chunk
        except TimeoutError:
            raise _Refusal(408, f"the request body did not arrive within {BODY_SECONDS:g} s") from None
        finally:
            self.connection.settimeout(self.timeout)
        return bytes(data)

    def _read_request(self) -> tuple[str, Params, str]:
        data = self._read_body()
        try:
            req = json.loads(data)
        except RecursionError:
            raise _Refusal(400, "bad request: the JSON is nested too deeply") from None
        except ValueError as exc:  # also bytes that are not UTF-8
            raise _Refusal(400, f"bad request: the body is not JSON in UTF-8 ({exc})") from None
        if not isinstance(req, dict) or "sql" not in req:
            raise _Refusal(400, 'bad request: send a JSON object {"sql": ..., "params": [...], "format": ...}')
        sql, params, fmt = req["sql"], req.get("params") or [], req.get("format", "arrow")
        if not isinstance(sql, str) or not isinstance(params, (list, dict)) or fmt not in ("arrow", "json"):
            raise _Refusal(
                400,
                "bad request: sql must be a string, params a list (for ?) or an object (for $name), "
                "format arrow or json",
            )
        return sql, params, fmt

    def do_POST(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        if self.path != "/query":
            self._error(404, "POST /query")
            return
        self._sending = False
        try:
            sql, params, fmt = self._read_request()
            self.server.answer(sql, params, fmt, self._send_answer, gone=lambda: _peer_gone(self.connection))
        except _Refusal as exc:
            self._error(exc.status, str(exc), exc.headers)
        except ClientGone:
            self.close_connection = True  # nobody to answer
        except QueryError as exc:
            self._error(exc.status, str(exc))
        except Exception as exc:  # never a dropped connection: the client gets the reason
            log.exception("query api: unexpected error")
            if self._sending:  # its status line is out: the connection is all there is to end
                self.close_connection = True
            else:
                self._error(500, f"internal error: {type(exc).__name__}: {exc}")

    def _send_answer(self, answer: Answer) -> None:
        """The 200 reply, sent by the answer's deadline; past it, or once the client is gone,
        the connection is closed mid-body (its status cannot change any more)."""
        if time.monotonic() >= answer.deadline:
            raise QueryTimeout(f"the query ran past the {self.server.limits.timeout_seconds:g} s limit and was stopped")
        self._sending = True
        try:
            self.connection.settimeout(answer.deadline - time.monotonic())
            self.send_response(200)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(sum(len(c) for c in answer.chunks)))
            self.end_headers()
            for chunk in answer.chunks:
                left = answer.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                self.wfile.write(chunk)
        except OSError as exc:  # TimeoutError included
            self.close_connection = True
            log.warning(
                "query api: an answer of %s was not sent within the %g s limit or the client left (%s); "
                "connection closed",
                mib(sum(len(c) for c in answer.chunks)),
                self.server.limits.timeout_seconds,
                type(exc).__name__,
            )
        finally:
            self.connection.settimeout(self.timeout)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("query api: " + format, *args)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class QueryServer(ThreadingHTTPServer):
    """The API on `host`. Off loopback it requires `token` (Authorization: Bearer), and refuses
    to start without one. At most `max_concurrent` statements run at once; each within `limits`."""

    daemon_threads = True

    def __init__(
        self,
        warehouse: Warehouse,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        limits: Limits | None = None,
        max_concurrent: int = _limits.MAX_CONCURRENT,
    ) -> None:
        if not token and not is_loopback(host):
            raise QueryRefused(
                f"the query API on {host} (beyond loopback) needs a token: set {TOKEN_ENV} or --api-token-file"
            )
        if token and len(token) < MIN_TOKEN_CHARS:
            raise QueryRefused(f"the query API's token has fewer than {MIN_TOKEN_CHARS} characters")
        super().__init__((host, port), _Handler)
        self.warehouse = warehouse
        self.token = token
        self.limits = limits or Limits()
        self.max_concurrent = max_concurrent
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._count = threading.Lock()
        self.running = 0  # statements running now
        self.collector: Callable[[], dict[str, Any]] | None = None  # the collector's health, where one runs
        self.lake: Callable[[], dict[str, Any]] | None = None  # the lake publisher's, under serve --lake

    def health(self) -> dict[str, Any]:
        """Whether the writer writes and the collector's rounds are stored; `ok` only when both."""
        writer = self.warehouse.health.as_json()
        out: dict[str, Any] = {"ok": bool(writer["ok"]), "writer": writer, "memory": self.warehouse.memory()}
        if self.collector is not None:
            out["collector"] = collector = self.collector()
            out["ok"] = out["ok"] and bool(collector["ok"])
        if self.lake is not None:  # publishing can wait out an outage: it does not make the rack unhealthy
            out["lake"] = self.lake()
        return out

    def answer(self, sql: str, params: Params, fmt: str, send: Callable[[Answer], None], gone: Any = None) -> None:
        """Run one statement and `send` its answer, both within one concurrency slot and the
        statement's time limit; or raise a QueryError (nothing sent)."""
        wait = _limits.QUEUE_SECONDS
        if not self._slots.acquire(timeout=wait):
            raise _Refusal(
                503,
                f"{self.max_concurrent} queries are running and none finished within {wait:g} s; retry shortly",
                {"Retry-After": "2"},
            )
        with self._count:
            self.running += 1
        try:
            deadline = time.monotonic() + self.limits.timeout_seconds
            cap = self.limits.max_result_bytes
            with self.warehouse.cursor() as cur, open_read(cur, sql, params, self.limits, gone, deadline) as stream:
                if fmt == "json":
                    body = _collect(json_chunks(stream), cap, "the JSON answer", " (or ask for format arrow: smaller)")
                    answer = Answer(body, "application/json", deadline)
                else:
                    answer = Answer(_collect(arrow_chunks(stream), cap, "the result"), ARROW_STREAM, deadline)
            send(answer)
        finally:
            with self._count:
                self.running -= 1
            self._slots.release()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, name="query-api", daemon=True)
        t.start()
        return t


ERRORS: dict[int, type[QueryError]] = {400: QueryRefused, 413: QueryTooLarge, 503: QueryBusy, 504: QueryTimeout}


@dataclass
class QueryClient:
    """What the dashboard and CLI use: SQL in, DataFrame out; every failure a QueryError."""

    url: str
    timeout: float = Limits.timeout_seconds + 15  # past the server's own limit, whose 504 says more
    token: str | None = field(default_factory=lambda: os.environ.get(TOKEN_ENV) or None, repr=False)
    # One connection pool for all its queries: a new httpx client per query costs ~18 ms (TLS setup).
    _http: httpx.Client = field(default_factory=httpx.Client, init=False, repr=False, compare=False)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _post(self, body: dict[str, Any]) -> httpx.Response:
        def post() -> httpx.Response:
            return self._http.post(f"{self.url}/query", json=body, timeout=self.timeout, headers=self.headers())

        try:
            try:
                resp = post()
            except httpx.RemoteProtocolError:  # a kept-alive connection the server closed meanwhile: resend
                resp = post()
            if resp.status_code == 503:  # busy: wait as told, once
                time.sleep(min(5.0, float(resp.headers.get("Retry-After", "1") or 1)))
                resp = post()
        except httpx.TimeoutException as exc:
            raise QueryTimeout(f"the query API at {self.url} did not answer within {self.timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise ApiUnreachable(
                f"the query API at {self.url} does not answer ({exc}); is `moemeter serve` running there?"
            ) from exc
        return resp

    def __call__(self, sql: str, params: Params | None = None) -> pd.DataFrame:
        resp = self._post({"sql": sql, "params": _wire(params)})
        if resp.status_code != 200:
            try:
                message = resp.json()["error"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:200]
            raise ERRORS.get(resp.status_code, QueryError)(message)
        with pa.ipc.open_stream(resp.content) as reader:
            return reader.read_all().to_pandas()


def _wire(params: Params | None) -> Params:
    """Parameters as JSON: times as ISO 8601 text (in lists too), which DuckDB casts back."""

    def one(p: Any) -> Any:
        if isinstance(p, list):
            return [one(x) for x in p]
        return p.isoformat() if isinstance(p, (datetime, date)) else p

    if isinstance(params, dict):
        return {k: one(v) for k, v in params.items()}
    return [one(p) for p in params or []]


@dataclass
class LocalQuery:
    """The same contract as QueryClient over a connection in this process (CLI, tests), through
    the same read layer."""

    con: duckdb.DuckDBPyConnection
    limits: Limits = field(default_factory=Limits)

    def __call__(self, sql: str, params: Params | None = None) -> pd.DataFrame:
        return run_read(self.con, sql, params, self.limits).to_pandas()
