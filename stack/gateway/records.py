"""The durable log of request records behind the gateway's feed (the record itself, its schema and
faults: moemeter/contract/requests.py).

A record is appended to a SQLite file (WAL, synchronous=FULL) by one writer thread and only then
becomes visible in the feed, so whatever a collector has read survives a crash of the gateway.
The feed is cursor-paged by a sequence number that is never reused; `log_id` names the file, so a
collector that meets a new log (a deleted file) starts that log from its beginning.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from moemeter.contract.requests import SCHEMA, RequestRecord

log = logging.getLogger(__name__)
KEEP_DAYS = 7.0
"""How long request records stay in the log (`gateway --keep-days`)."""
PRUNE_SECONDS = 3600.0
"""How often the writer drops records older than that: at its first batch, then hourly."""


class RecordLog:
    """Append-only, durable log of request records with a paged reader."""

    def __init__(self, path: str | Path, keep_seconds: float = KEEP_DAYS * 86400, batch_seconds: float = 0.05) -> None:
        if not keep_seconds > 0:  # NaN too: it would never prune; 0 or less drops records before they are read
            raise ValueError(f"a request log keeps its records for more than 0 seconds, not {keep_seconds}")
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
        last_prune = -math.inf  # at the first batch, on a host up for under an hour too
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
            if time.monotonic() - last_prune > PRUNE_SECONDS:
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
