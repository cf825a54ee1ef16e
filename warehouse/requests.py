"""Request records from a gateway's feed (schema moemeter.requests/1) into the warehouse.

The cursor of each gateway is committed in the same transaction as the records it covers, so a
collector or warehouse that dies mid-way reads the same records again and stores them once.
"""

from __future__ import annotations

import logging
import math
import operator
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from moemeter.contract.clock import latest_allowed
from moemeter.contract.columns import MAX_COUNT, MAX_REQUEST_TOKENS, clean_text, is_count, is_token_count
from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import SCHEMA, ColumnPage, records_of

from .db import insert_arrow, record_rejected
from .slo import ensure_slo_sheet, slo_params
from .sql import bind, sql

log = logging.getLogger(__name__)
MAX_TEXT = 1024  # the gateway cuts user names to 256 characters; anything this long is not a record
_TEXT = ("request_id", "user", "tenant", "model", "endpoint", "outcome")
_INT = ("status", "prompt_tokens", "generated_tokens")
_TOKENS = ("prompt_tokens", "generated_tokens")  # bounded by one request's (MAX_REQUEST_TOKENS)
_OPT_FLOAT = (
    "ttft_seconds",
    "itl_mean_seconds",
    "itl_max_seconds",
    "decode_tokens_per_second",
    "slo_ttft_seconds",  # absent from records of gateways before per-request targets: NULL
    "slo_itl_seconds",
)


_DURATIONS = ("ttft_seconds", "itl_mean_seconds", "itl_max_seconds", "e2e_seconds")
# seconds (292 years): a duration is stored in micro- or nanoseconds (requests_insert.sql), in a BIGINT
_LONGEST = 2**63 / 1e9


class FeedError(MoemeterError, ValueError):
    """A feed page that does not follow moemeter.requests/1."""


@dataclass
class Cursor:
    log_id: str
    seq: int
    records: int = 0
    lost: int = 0
    rejected: int = 0


def _record_row(r: Any, repaired: Counter[str], latest: datetime) -> tuple[Any, ...]:
    """One record as a row (columns after gateway and ingested_at), or ValueError saying what is wrong.
    Text that is not valid UTF-8 is stored with U+FFFD in place, counted in `repaired`. A record
    that finished after `latest` (moemeter.contract.clock.latest_allowed) has not happened yet."""
    if not isinstance(r, dict):
        raise ValueError("not an object")
    text: dict[str, str] = {}
    for k in _TEXT:
        if not isinstance(r.get(k), str):
            raise ValueError(f"{k} must be a string")
        if len(r[k]) > MAX_TEXT:
            raise ValueError(f"{k} is over {MAX_TEXT} characters long")
        text[k] = clean_text(r[k])
    for k in _INT:
        if not is_count(r.get(k)) or (k == "status" and r[k] > 999):
            raise ValueError(f"{k} must be a non-negative integer that fits its column")
        if k in _TOKENS and not is_token_count(r[k]):
            raise ValueError(f"{k} is over {MAX_REQUEST_TOKENS:,}, more than one request can hold")
    cached = r.get("cached_prompt_tokens")
    if cached is not None and (not is_token_count(cached) or cached > r["prompt_tokens"]):
        raise ValueError("cached_prompt_tokens must be null or an integer within prompt_tokens")
    nums: dict[str, float | None] = {}
    for k in ("started_at", "e2e_seconds", *_OPT_FLOAT):
        v = r.get(k)
        if v is None and k in _OPT_FLOAT:
            nums[k] = None
            continue
        if not isinstance(v, int | float) or isinstance(v, bool) or not _finite(v) or v < 0:
            raise ValueError(f"{k} must be a finite non-negative number")
        if k in _DURATIONS and not v < _LONGEST:
            raise ValueError(f"{k} is over {_LONGEST:,.0f} seconds, longer than a duration is stored")
        nums[k] = float(v)
    t0, e2e = float(r["started_at"]), float(r["e2e_seconds"])
    try:
        datetime.fromtimestamp(t0, UTC)  # a start a timestamp holds (the table has it as finished less e2e)
        finished = datetime.fromtimestamp(t0 + e2e, UTC).replace(tzinfo=None)
    except (OverflowError, OSError, ValueError) as exc:
        raise ValueError("started_at and e2e_seconds must name a time a timestamp holds") from exc
    if finished > latest:
        raise ValueError(f"finished at {finished:%Y-%m-%d %H:%M:%S}, after the collector's clock: not yet happened")
    repaired.update(f"{k} is not valid UTF-8: stored with U+FFFD in place" for k in _TEXT if text[k] is not r[k])
    return (
        text["request_id"],
        finished,
        text["user"],
        text["tenant"],
        text["model"],
        text["endpoint"],
        bool(r.get("stream")),
        r["status"],
        text["outcome"],
        r["prompt_tokens"],
        cached,
        r["generated_tokens"],
        nums["ttft_seconds"],
        nums["itl_mean_seconds"],
        nums["itl_max_seconds"],
        nums["e2e_seconds"],
        bool(r.get("usage_reported")),
        nums["slo_ttft_seconds"],
        nums["slo_itl_seconds"],
    )


def _finite(v: float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer past what a double holds
        return False


def _plain_columns(get: dict[str, list[Any]], after: int, latest: datetime) -> dict[str, Any] | None:
    """A page's records, given as their fields' columns (_fields), as the table's columns (seq, then
    _COLUMNS) when each is one _record_row takes as it is (no repair, no refusal) and their seqs
    rise from after `after`; None otherwise, for the record by record reading to say what is wrong.
    The same rows, column by column: each check is _record_row's, over a column at once (a column's
    types checked as the set of them)."""
    seq = get["seq"]
    if not _counts(seq) or (seq and (seq[0] <= after or any(map(operator.ge, seq, seq[1:])))):
        return None
    for k in _TEXT:
        texts = get[k]
        if not _types(texts) <= {str} or max(map(len, texts), default=0) > MAX_TEXT:
            return None
        try:
            "".join(texts).encode("utf-8")  # valid UTF-8 throughout: nothing to repair
        except UnicodeEncodeError:
            return None
    if not all(_counts(get[k]) for k in _INT) or max(get["status"], default=0) > 999:
        return None
    if max((max(get[k], default=0) for k in _TOKENS), default=0) > MAX_REQUEST_TOKENS:
        return None
    cached, prompt = get["cached_prompt_tokens"], get["prompt_tokens"]
    if _types(cached) <= {int}:
        if min(cached, default=0) < 0 or any(map(operator.gt, cached, prompt)):  # prompt is bounded
            return None
    elif any(c is not None and (type(c) is not int or not 0 <= c <= p) for c, p in zip(cached, prompt, strict=True)):
        return None
    nums: dict[str, np.ndarray] = {}
    null: dict[str, np.ndarray] = {}
    for k in ("started_at", "e2e_seconds", *_OPT_FLOAT):
        col = get[k]
        types = _types(col)
        if not types <= ({float, int, type(None)} if k in _OPT_FLOAT else {float, int}):
            return None
        nones = col.count(None)
        try:
            if 0 < nones < len(col):
                values = np.array([np.nan if v is None else v for v in col], dtype=np.float64)
                given = np.array([v is not None for v in col], dtype=bool)  # NaN is a value, and not a finite one
            else:  # the column given in whole, or not at all
                values = np.array(col, dtype=np.float64) if not nones else np.full(len(col), np.nan)
                given = np.full(len(col), not nones)
        except OverflowError:
            return None
        if not (np.isfinite(values[given]).all() and (values[given] >= 0).all()):
            return None
        if k in _DURATIONS and not (values[given] < _LONGEST).all():
            return None
        nums[k], null[k] = values, ~given
    started, finished = _micros(nums["started_at"]), _micros(nums["started_at"] + nums["e2e_seconds"])
    if started is None or finished is None or (len(finished) and finished.max() > (latest - _EPOCH) // _MICROSECOND):
        return None
    columns: dict[str, Any] = {k: get[k] for k in ("seq", *_TEXT, *_INT)}
    columns.update({"finished_at": finished, "user_id": get["user"]})
    columns["cached_prompt_tokens"] = cached
    columns["stream"] = list(map(bool, get["stream"]))
    columns["usage_reported"] = list(map(bool, get["usage_reported"]))
    columns.update({k: pa.array(nums[k], mask=null[k]) for k in _OPT_FLOAT if k in _COLUMNS})
    columns["e2e_seconds"] = nums["e2e_seconds"]
    return columns


_FIELDS = (
    "seq",
    *_TEXT,
    *_INT,
    "cached_prompt_tokens",
    "started_at",
    "e2e_seconds",
    *_OPT_FLOAT,
    "stream",
    "usage_reported",
)


def _fields(records: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Each of _FIELDS as a column, None where a record lacks it."""
    return {k: _field(records, k) for k in _FIELDS}


def _field(records: list[dict[str, Any]], k: str) -> list[Any]:
    try:
        return list(map(operator.itemgetter(k), records))
    except KeyError:  # a record without it
        return [r.get(k) for r in records]


def _types(values: list[Any]) -> set[type]:
    return set(map(type, values))


def _counts(values: list[Any]) -> bool:
    """Every value is a count (moemeter.contract.columns.is_count)."""
    return _types(values) <= {int} and (not values or (min(values) >= 0 and max(values) <= MAX_COUNT))


_EPOCH, _MICROSECOND = datetime(1970, 1, 1), timedelta(microseconds=1)
LATEST_SECOND = 253402300000  # a little before 10000-01-01: later times go record by record


def _micros(seconds: np.ndarray) -> np.ndarray | None:
    """datetime.fromtimestamp(s, UTC) of each, as microseconds since the epoch: whole seconds, and
    the fraction rounded half to even as CPython rounds it; None past LATEST_SECOND."""
    if len(seconds) and not seconds.max() < LATEST_SECOND:
        return None
    frac, whole = np.modf(seconds)
    return whole.astype(np.int64) * 1_000_000 + np.rint(frac * 1e6).astype(np.int64)


_COLUMNS = (
    "request_id",
    "finished_at",
    "user_id",
    "tenant",
    "model",
    "endpoint",
    "stream",
    "status",
    "outcome",
    "prompt_tokens",
    "cached_prompt_tokens",
    "generated_tokens",
    "ttft_seconds",
    "itl_mean_seconds",
    "itl_max_seconds",
    "e2e_seconds",
    "usage_reported",
    "slo_ttft_seconds",
    "slo_itl_seconds",
)
"""What a record gives `requests`, after gateway, seq and ingested_at: requests_insert.sql stores
the durations in whole units and the request id as its text and number, and the table computes the
start and the decode speed (migration 024)."""
_TYPES = {
    "finished_at": pa.timestamp("us"),
    "stream": pa.bool_(),
    "status": pa.int32(),
    "prompt_tokens": pa.int64(),
    "cached_prompt_tokens": pa.int64(),
    "generated_tokens": pa.int64(),
    "usage_reported": pa.bool_(),
}


class RequestIngestor:
    def __init__(self) -> None:
        self._cursors: dict[str, Cursor | None] = {}

    def cursor(self, con: duckdb.DuckDBPyConnection, gateway: str) -> Cursor | None:
        """Where this gateway's feed was read up to (None: never read)."""
        if gateway not in self._cursors:
            row = con.execute(sql("requests_feed_cursor"), {"gateway": gateway}).fetchall()
            self._cursors[gateway] = Cursor(*row[0]) if row else None
        return self._cursors[gateway]

    def write(self, con: duckdb.DuckDBPyConnection, gateway: str, page: Any, now: datetime) -> int:
        """Store one feed page (inside the caller's transaction); returns records stored. A page is
        its records, or (made in this process: moemeter.contract.requests.ColumnPage) their columns."""
        in_columns = type(page) is ColumnPage
        body, kind = ("fields", dict) if in_columns else ("records", list)
        if not isinstance(page, dict) or page.get("schema") != SCHEMA or not isinstance(page.get(body), kind):
            raise FeedError(f"{gateway}: not a {SCHEMA} feed page")
        log_id = page.get("log_id")
        if not isinstance(log_id, str) or not log_id:
            raise FeedError(f"{gateway}: feed page without a log_id")
        cur = self.cursor(con, gateway)
        if cur is None or cur.log_id != log_id:
            if cur is not None:
                log.warning(
                    "gateway %s has a new request log (%s, was %s): reading it from the start",
                    gateway,
                    log_id,
                    cur.log_id,
                )
            cur = Cursor(log_id, 0, cur.records if cur else 0, cur.lost if cur else 0, cur.rejected if cur else 0)
        oldest = page.get("oldest")
        if isinstance(oldest, int) and oldest > cur.seq + 1:
            gap = oldest - cur.seq - 1
            cur.lost += gap
            log.error("gateway %s dropped %d request records from its log before they were read", gateway, gap)
        if in_columns:
            fields, records = page["fields"], None
        else:
            records = page["records"]
            fields = _fields(records) if all(type(r) is dict for r in records) else None
        latest = latest_allowed(now)  # a record finished after this has not happened yet
        columns = _plain_columns(fields, cur.seq, latest) if fields is not None else None
        if columns is not None:  # every record as _record_row takes it: read column by column
            seqs = columns["seq"]
            last, stored = (seqs[-1], len(seqs)) if seqs else (cur.seq, 0)
        else:
            if records is None:
                records = records_of(fields)
            last, stored, columns = self._one_by_one(gateway, cur, records, now, latest, con)
        if stored:
            ensure_slo_sheet(con, now)  # the first records are held to the default sheet unless one was loaded
            table = {"gateway": pa.array([gateway] * stored), "seq": pa.array(columns["seq"], pa.int64())}
            for name in _COLUMNS:
                column = columns[name]
                table[name] = column if isinstance(column, pa.Array) else pa.array(column, _TYPES.get(name))
                if name == "finished_at":
                    table["ingested_at"] = pa.array([now] * stored, pa.timestamp("us"))
            insert_arrow(con, "requests", table, "requests_insert")
        cur.seq, cur.records = last, cur.records + stored
        feed = {"gateway": gateway, "log_id": cur.log_id, "seq": cur.seq, "records": cur.records, "lost": cur.lost}
        con.execute(sql("requests_feed_store"), {**feed, "rejected": cur.rejected, "updated_at": now})
        self._cursors[gateway] = cur
        return stored

    @staticmethod
    def _one_by_one(
        gateway: str,
        cur: Cursor,
        records: list[Any],
        now: datetime,
        latest: datetime,
        con: duckdb.DuckDBPyConnection,
    ) -> tuple[int, int, dict[str, Any]]:
        """The page record by record: those stored already skipped, bad ones refused and counted
        (one that finished after `latest` among them). Returns the last seq read, the records to
        store, and their columns."""
        rows, last = [], cur.seq
        refused: Counter[str] = Counter()
        repaired: Counter[str] = Counter()
        for r in records:
            seq = r.get("seq") if isinstance(r, dict) else None
            if not is_count(seq):
                raise FeedError(f"{gateway}: a record without an integer seq after {last}")
            if seq <= last:
                if seq <= cur.seq:
                    continue  # stored already (a page read twice)
                raise FeedError(f"{gateway}: record sequence numbers go back from {last} to {seq}")
            last = seq
            try:
                rows.append((seq, *_record_row(r, repaired, latest)))
            except ValueError as exc:
                cur.rejected += 1
                refused[f"{exc}: record refused"] += 1
                log.error("gateway %s: request record %d refused: %s", gateway, seq, exc)
        record_rejected(con, now, gateway, "request", refused + repaired)
        return last, len(rows), dict(zip(("seq", *_COLUMNS), zip(*rows), strict=False))


# requests_itl_1h.bin of a request: its mean inter-token latency in log bins 1% wide
# (warehouse/sql/requests_hour_itl.sql).
ITL_BIN_SCALE = 100.0


def _stored(start: datetime, until: datetime) -> dict[str, Any]:
    """A roll-up's parameters: the records stored in [start, until), whenever they finished."""
    return {"ingested_from": start, "ingested_until": until, "finished_from": None, "finished_until": None}


def roll_requests_slo_1m(con: duckdb.DuckDBPyConnection, start: datetime, until: datetime) -> None:
    """Add the requests ingested in [start, until) to their finishing minute's SLO sums per class and tenant."""
    ensure_slo_sheet(con, until)
    con.execute(*bind(sql("requests_roll_slo_1m"), {**_stored(start, until), **slo_params(None, None)}))


def roll_requests_1h(con: duckdb.DuckDBPyConnection, start: datetime, until: datetime) -> None:
    """Add the requests ingested in [start, until) to their finishing hour's per-user sums, inter-token
    latency histogram and per-class SLO sums."""
    window = _stored(start, until)
    ensure_slo_sheet(con, until)  # a warehouse from before SLO sheets holds requests and no sheet
    con.execute(sql("requests_roll_1h"), window)
    con.execute(sql("requests_roll_itl_1h"), {**window, "bin_scale": ITL_BIN_SCALE})
    con.execute(*bind(sql("requests_roll_slo_1h"), {**window, **slo_params(None, None)}))
