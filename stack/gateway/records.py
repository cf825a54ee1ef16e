"""Per-request records: what the gateway knows of each request, and the durable log behind the feed.

A record is appended to a SQLite file (WAL, synchronous=FULL) by one writer thread and only then
becomes visible in the feed, so whatever a collector has read survives a crash of the gateway.
The feed is cursor-paged by a sequence number that is never reused; `log_id` names the file, so a
collector that meets a new log (a deleted file) starts that log from its beginning.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
SCHEMA = "moemeter.requests/1"
SERVER_FAULTS = frozenset(
    {
        "upstream_timeout",
        "upstream_unavailable",
        "upstream_error",
        "upstream_5xx",
        "upstream_dropped",
        "upstream_stream_error",
        "gateway_error",
        "overloaded",
    }
)
"""Outcomes that are the server side's failure, not the client's: they count against availability
(the gateway turning requests away when it is full is one). A refused request (bad JSON, unknown
model, no key, a malformed SLO header), an upstream 4xx and a client that went away do not."""


@dataclass
class RequestRecord:
    """One request as the gateway saw it. Times are seconds; `started_at` is epoch seconds."""

    request_id: str  # the X-Request-Id the gateway set and passed upstream
    started_at: float
    user: str  # a user of `tenant`: the request's `user` field, else the tenant's name
    tenant: str  # the API key's tenant, else "anonymous"
    model: str
    endpoint: str  # "completions" | "chat/completions"
    stream: bool
    status: int  # HTTP status the client got (499: the client went away)
    outcome: str  # "ok", or the error class
    prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None  # upstream's prompt_tokens_details.cached_tokens, when it says
    generated_tokens: int = 0
    ttft_seconds: float | None = None  # request received -> first token chunk (streams only)
    itl_mean_seconds: float | None = None  # (last token - first token) / (generated - 1), streams only
    itl_max_seconds: float | None = None  # the longest gap between token chunks
    decode_tokens_per_second: float | None = None  # 1 / itl_mean_seconds
    e2e_seconds: float = 0.0
    usage_reported: bool = False  # token counts came from the upstream's usage, not from counting chunks
    slo_ttft_seconds: float | None = None  # the request's own TTFT target (x-slo-ttft-ms), when it set one
    slo_itl_seconds: float | None = None  # its own mean inter-token latency target (x-slo-tpot-ms)

    def to_json(self) -> dict[str, object]:
        # asdict() without its deep copy (every field is a plain value; a dataclass without slots
        # holds exactly its fields in its __dict__, in their order): the twin's fast-forward spent
        # 40% of its time in asdict(), and 5% in a dict built field by field
        return dict(self.__dict__)


RECORD_KEYS = ("seq", *(f.name for f in fields(RequestRecord)))
"""A feed record's keys, in order: its sequence number, then RequestRecord's fields."""


class ColumnPage(dict[str, object]):
    """A feed page made in the process that stores it (the fast-forward's twin): its records as
    columns, one list per key of RECORD_KEYS under "fields", instead of a list of records under
    "records". The warehouse reads it with the same checks as records; a page read from the network
    is never one (JSON gives plain dicts)."""


def records_of(fields: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The records whose fields these columns are, each a dict with the columns' keys in order."""
    return [dict(zip(fields, row, strict=True)) for row in zip(*fields.values(), strict=True)]


class RecordLog:
    """Append-only, durable log of request records with a paged reader."""

    def __init__(self, path: str | Path, keep_seconds: float = 7 * 86400, batch_seconds: float = 0.05) -> None:
        self.path = Path(path)
        self.keep_seconds = keep_seconds
        self.batch_seconds = batch_seconds
        self._queue: queue.Queue[RequestRecord | None] = queue.Queue()
        self._local = threading.local()
        con = self._connect()
        con.execute(
            "CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "started_at REAL NOT NULL, body TEXT NOT NULL)"
        )
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        con.execute("INSERT OR IGNORE INTO meta VALUES ('log_id', ?)", (uuid.uuid4().hex,))
        con.commit()
        self.log_id: str = con.execute("SELECT value FROM meta WHERE key = 'log_id'").fetchone()[0]
        self.written = 0
        self.failed = 0
        self.appended = 0
        self._writer = threading.Thread(target=self._write_loop, args=(con,), name="gateway-records", daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        return con

    def append(self, record: RequestRecord) -> None:
        self.appended += 1  # from one thread (the gateway's event loop)
        self._queue.put(record)

    @property
    def pending(self) -> int:
        """Records appended and neither stored nor given up on yet (queued or being written)."""
        return self.appended - self.written - self.failed

    def _write_loop(self, con: sqlite3.Connection) -> None:
        last_prune = 0.0
        stopping = False
        while not stopping:
            item = self._queue.get()
            batch: list[RequestRecord] = []
            if item is None:
                stopping = True
            else:
                batch.append(item)
            deadline = time.monotonic() + self.batch_seconds
            while not stopping and len(batch) < 1000:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                else:
                    batch.append(item)
            if batch:
                self._commit(con, batch)
            if time.monotonic() - last_prune > 3600:
                last_prune = time.monotonic()
                con.execute("DELETE FROM records WHERE started_at < ?", (time.time() - self.keep_seconds,))
                con.commit()
        con.close()

    def _commit(self, con: sqlite3.Connection, batch: list[RequestRecord]) -> None:
        rows = [(r.started_at, json.dumps(r.to_json(), separators=(",", ":"))) for r in batch]
        for attempt in range(3):
            try:
                with con:
                    con.executemany("INSERT INTO records (started_at, body) VALUES (?, ?)", rows)
                self.written += len(rows)
                return
            except sqlite3.Error as exc:
                if attempt == 2:
                    self.failed += len(rows)
                    log.error("could not store %d request records in %s: %s", len(rows), self.path, exc)
                else:
                    time.sleep(0.5)

    def page(self, after: int, limit: int) -> dict[str, object]:
        """Records with seq > after, oldest first, at most `limit`."""
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = self._connect()
        rows = con.execute(
            "SELECT seq, body FROM records WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit + 1)
        ).fetchall()
        oldest = con.execute("SELECT min(seq) FROM records").fetchone()[0]
        more = len(rows) > limit
        rows = rows[:limit]
        records = [{"seq": seq, **json.loads(body)} for seq, body in rows]
        return {
            "schema": SCHEMA,
            "log_id": self.log_id,
            "oldest": oldest,
            "records": records,
            "next": rows[-1][0] if rows else after,
            "more": more,
        }

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the writer."""
        self._queue.put(None)
        self._writer.join(timeout)
