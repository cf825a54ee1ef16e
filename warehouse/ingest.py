"""Typed rows the collectors hand over, and how they land in DuckDB.

One `ScrapeBatch` per target per scrape: its samples (already parsed), its health. The
ingestor assigns stable series ids and derives counter increases with Prometheus' increase()
rules (first sight: no increase; a drop is a restart counted from zero). A restart's increase
covers the time since the process started when the page says when (`process_start_time_seconds`),
not the whole gap since the previous scrape.

A counter is stored once: as its increase (`increments`). Its reading goes to `samples` only where
the increases cannot give it back exactly: the first reading, the first of each clock hour (so a
restart of the writer, and the `readings` view, start from a reading at most an hour old), and any
reading that is not a whole number below 2^53 (or follows one). Whole numbers below 2^53 add up
exactly in any order, so a reading is its anchor plus the increases since. Every other sample
(gauges, info, a blank, a counter's negative or infinite value) is stored as read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from moemeter.contract import Sample, TargetInfo

from .db import insert_arrow, record_rejected
from .read import HOUR, floor
from .rollup import Retention, Rollups
from .sql import sql

log = logging.getLogger(__name__)

# Sample names that carry monotonic counts, by family kind.
_MONOTONIC_SUFFIXES = {
    "counter": ("_total", ""),
    "histogram": ("_bucket", "_count", "_sum"),
    "gaugehistogram": (),
    "summary": ("_count", "_sum"),
}
DCGM_INT64_BLANK_MIN = 9.223372036854775e18  # DCGM int64 blanks sit at 2^63 - 16 and above
DCGM_FP64_BLANK = 140737488355328.0  # 2^47: DCGM_FP64_BLANK .. NOT_PERMISSIONED (+3)
# A target's series: a DP64 decode instance with the plugin serves ~36,000; a target that invents
# label values (a request id, a timestamp) would otherwise add its page's worth every round.
MAX_SERIES_PER_TARGET = 200_000
MAX_NEW_SERIES_PER_ROUND = 50_000
EXACT_BELOW = 2.0**53  # whole numbers below this add up exactly in a double, in any order


@dataclass
class ScrapeBatch:
    target: TargetInfo
    ts: datetime  # UTC, naive
    up: bool
    duration_seconds: float
    samples: list[Sample] = field(default_factory=list)
    bytes: int = 0
    error: str | None = None


def is_dcgm_blank(name: str, value: float) -> bool:
    """DCGM's "no value" sentinels, which must never be read as a measurement."""
    if not name.startswith("DCGM_"):
        return False
    return value >= DCGM_INT64_BLANK_MIN or DCGM_FP64_BLANK <= value <= DCGM_FP64_BLANK + 3


def process_start(samples: list[Sample]) -> datetime | None:
    """When the target's process started (`process_start_time_seconds`, which vLLM and the twin
    export), as naive UTC; None when the page does not say."""
    for s in samples:
        if s.name == "process_start_time_seconds" and math.isfinite(s.value) and 0 < s.value < 32503680000:
            return datetime.fromtimestamp(s.value, UTC).replace(tzinfo=None)
    return None


def series_key(target: str, name: str, labels: tuple[tuple[str, str], ...]) -> int:
    """A series' identity: a 64-bit hash of its target, name and labels as scraped (its stored id
    is a number the writer gives it, migration 015)."""
    key = "\x00".join([target, name, *(f"{k}\x01{v}" for k, v in labels)]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big", signed=True)


def is_monotonic(sample: Sample) -> bool:
    if sample.kind in ("unknown", "untyped"):  # no TYPE line: trust the counter naming convention
        return sample.name.endswith("_total")
    suffixes = _MONOTONIC_SUFFIXES.get(sample.kind)
    if not suffixes:
        return False
    return any(sample.name == sample.family + s for s in suffixes)


def _next_ids(last: int) -> dict[bool, int]:
    """The next id for a counter (odd) and for any other series (even), after id `last`."""
    odd = last + 1 if last % 2 == 0 else last + 2
    return {True: odd, False: odd + 1}


# a new row of `series`: id, target, metric, family, kind, labels, engine, le, key
SeriesRow = tuple[int, str, str, str, str, str, str | None, float | None, int]


@dataclass
class _Raw:
    """Raw rows of one scrape time, held until they are inserted together."""

    ts: datetime | None = None
    ids: list[int] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    inc: dict[str, list[Any]] = field(
        default_factory=lambda: {"series_id": [], "delta": [], "seconds": [], "reset": []}
    )

    def flush(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.ids:
            self._append(con, "samples", {"series_id": (self.ids, pa.int64()), "value": (self.values, pa.float64())})
        if self.inc["series_id"]:
            types = {"series_id": pa.int64(), "delta": pa.float64(), "seconds": pa.float64(), "reset": pa.bool_()}
            self._append(con, "increments", {k: (v, types[k]) for k, v in self.inc.items()})
        self.ids.clear()
        self.values.clear()
        for column in self.inc.values():
            column.clear()

    def _append(
        self, con: duckdb.DuckDBPyConnection, table: str, columns: dict[str, tuple[list[Any], pa.DataType]]
    ) -> None:
        """Insert the rows in series id order: like series side by side (Ingestor._number)."""
        ids = np.asarray(columns["series_id"][0], dtype=np.int64)
        arrays = {k: pa.array(v, type=t) for k, (v, t) in columns.items()}
        if len(ids) > 1 and bool((ids[1:] < ids[:-1]).any()):
            order = pa.array(np.argsort(ids, kind="stable"))
            arrays = {k: a.take(order) for k, a in arrays.items()}
        stamps = pa.repeat(pa.scalar(self.ts, pa.timestamp("us")), len(ids))
        insert_arrow(con, table, {"ts": stamps, **arrays})


@dataclass
class _NewSeries:
    """A series first seen in the round being written: its id is given when the round is flushed."""

    provisional: int  # negative, unique in the round
    monotonic: bool
    key: int
    target: str
    seen_as: tuple[str, tuple[tuple[str, str], ...], str, str]
    sample: Sample


class Ingestor:
    """Turns batches into rows. Keeps the last value of every monotonic series in memory."""

    def __init__(
        self,
        retention: Retention | None = None,
        max_series: int = MAX_SERIES_PER_TARGET,
        max_new_series: int = MAX_NEW_SERIES_PER_ROUND,
    ) -> None:
        self._ids: dict[int, int] = {}  # series key -> series id, of every stored series
        self._next_id = _next_ids(0)
        self._new: list[_NewSeries] = []  # first seen in the round being written
        self._series_of: Counter[str] = Counter()  # series stored, per target
        self._last: dict[int, tuple[datetime, float]] = {}
        # per target, what a sample's name, labels, family and kind make of it: (series id,
        # monotonic); kept for stored series only, so a target inventing labels adds none
        self._seen_as: dict[str, dict[tuple[str, tuple[tuple[str, str], ...], str, str], tuple[int, bool]]] = {}
        self._longest = 0.0  # the longest interval of any stored increment
        self._loaded = False
        self.rollups = Rollups(retention)
        self.max_series, self.max_new_series = max_series, max_new_series

    def _load(self, con: duckdb.DuckDBPyConnection) -> None:
        """After a restart: known series, and the last reading of each series seen in the last hour
        (a counter's: its last stored reading plus the increases since)."""
        self._ids = dict(con.execute("SELECT series_key, series_id FROM series").fetchall())
        self._next_id = _next_ids(max(self._ids.values(), default=0))
        self._series_of = Counter(dict(con.execute("SELECT target, count(*) FROM series GROUP BY 1").fetchall()))
        self._last = {sid: (ts, v) for sid, ts, v in con.execute(sql("last_readings")).fetchall()}
        self._longest = float(con.execute("SELECT coalesce(max(seconds), 0) FROM longest_interval").fetchall()[0][0])
        self._loaded = True

    def write(self, con: duckdb.DuckDBPyConnection, batch: ScrapeBatch) -> int:
        """Write one batch inside the caller's transaction; returns samples stored."""
        return self.write_all(con, [batch])

    def write_all(self, con: duckdb.DuckDBPyConnection, batches: list[ScrapeBatch]) -> int:
        """Write batches in order inside the caller's transaction; returns samples stored. The raw
        rows of consecutive batches of one scrape time (a round) go in one insert per table."""
        raw = _Raw()
        n = 0
        for b in batches:
            if raw.ts is not None and b.ts != raw.ts:
                self._number(con, raw)
                raw.flush(con)  # before the next time's batch rolls up the minutes they may close
            n += self._write(con, b, raw)
        self._number(con, raw)
        raw.flush(con)
        return n

    def _number(self, con: duckdb.DuckDBPyConnection, raw: _Raw) -> None:
        """Give the round's new series their ids and store them. Counters are numbered odd, other
        series even, each in metric order, then in the order first seen: the round's rows, inserted
        in id order, then hold like series side by side (the flops counters of every engine, the
        buckets of one histogram), and their ids rise by two. DuckDB compresses a column a vector
        at a time, so values of one magnitude together and ids in steps pack into a few bits."""
        if not self._new:
            return
        final: dict[int, int] = {}
        rows: list[SeriesRow] = []
        for new in sorted(self._new, key=lambda n: (n.sample.name, -n.provisional)):
            sid = final[new.provisional] = self._next_id[new.monotonic]
            self._next_id[new.monotonic] += 2
            self._ids[new.key] = sid
            self._seen_as[new.target][new.seen_as] = (sid, new.monotonic)
            if new.provisional in self._last:
                self._last[sid] = self._last.pop(new.provisional)
            rows.append(self._series_row(sid, new.key, new.target, new.sample))
        self._new.clear()
        raw.ids[:] = [final[i] if i < 0 else i for i in raw.ids]
        cols = list(zip(*rows))
        types = [pa.int64(), *[pa.string()] * 6, pa.float64(), pa.int64()]
        names = ["series_id", "target", "metric", "family", "kind", "labels", "engine", "le", "series_key"]
        insert_arrow(con, "series", {n: pa.array(c, type=t) for n, c, t in zip(names, cols, types, strict=True)})

    def _write(self, con: duckdb.DuckDBPyConnection, batch: ScrapeBatch, raw: _Raw) -> int:
        if not self._loaded:
            self._load(con)
        self.rollups.advance(con, batch.ts)  # a batch of a new minute (hour) closes the previous ones
        t = batch.target
        con.execute(
            """INSERT INTO targets VALUES (?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT (name) DO UPDATE SET url = excluded.url, role = excluded.role, gpus = excluded.gpus,
                   stack = excluded.stack, hostname = excluded.hostname, last_seen = excluded.last_seen""",
            [t.name, t.url, t.role, t.gpus, t.stack, t.hostname, batch.ts, batch.ts],
        )
        con.execute(
            "INSERT INTO scrapes VALUES (?, ?, ?, ?, ?, ?, ?)",
            [batch.ts, t.name, batch.up, batch.duration_seconds, len(batch.samples), batch.bytes, batch.error],
        )
        raw.ts = batch.ts
        ids, values, inc = raw.ids, raw.values, raw.inc
        rolled = len(inc["seconds"])
        accepted = late = 0
        hour = floor(batch.ts, HOUR)
        new_series = 0
        seen: set[int] = set()
        room = min(self.max_new_series, self.max_series - self._series_of[t.name])
        started = process_start(batch.samples)
        refused: Counter[str] = Counter()
        seen_as = self._seen_as.setdefault(t.name, {})
        for s in batch.samples:
            as_seen = (s.name, s.labels, s.family, s.kind)
            known = seen_as.get(as_seen)
            if known is not None:
                sid, monotonic = known
            else:
                key = series_key(t.name, s.name, s.labels)
                monotonic = is_monotonic(s)
                if key in self._ids:
                    sid = self._ids[key]
                elif new_series >= room:
                    refused[self._over_limit(t.name, room)] += 1
                    continue
                else:
                    sid = self._ids[key] = -(len(self._new) + 1)  # numbered when the round is flushed
                    self._new.append(_NewSeries(sid, monotonic, key, t.name, as_seen, s))
                    new_series += 1
                seen_as[as_seen] = (sid, monotonic)
            if sid in seen:  # a duplicate sample in one page: the first one counts
                continue
            seen.add(sid)
            v = s.value
            accepted += 1
            if is_dcgm_blank(s.name, v):  # stored as NULL: "no value", not a reading
                ids.append(sid)
                values.append(None)
                continue
            # A counter is finite and never negative; anything else is kept raw but adds no increase.
            if not (monotonic and math.isfinite(v) and v >= 0):
                ids.append(sid)
                values.append(v)
                continue
            prev = self._last.get(sid)
            if prev is not None and batch.ts <= prev[0]:
                late += 1  # at or before the last reading: adds nothing, and as a row could pass for it
                continue
            if prev is None or prev[0] < hour or not (v < EXACT_BELOW and v.is_integer() and prev[1].is_integer()):
                ids.append(sid)  # an anchor: the increases cannot give this reading back exactly
                values.append(v)
            if prev is not None:
                reset = v < prev[1]
                seconds = (batch.ts - prev[0]).total_seconds()
                if reset and started is not None and prev[0] < started < batch.ts:
                    seconds = (batch.ts - started).total_seconds()  # counted since the restart
                inc["series_id"].append(sid)
                inc["delta"].append(v if reset else v - prev[1])
                inc["seconds"].append(seconds)
                inc["reset"].append(reset)
            self._last[sid] = (batch.ts, v)
        self._series_of[t.name] += new_series
        if late:
            refused["counter readings at or before the series' last reading: not stored"] += late
        if refused:
            log.warning("%s: %s", t.name, "; ".join(f"{n:,} {why}" for why, n in refused.items()))
            record_rejected(con, batch.ts, t.name, "series", refused)
        longest = max(inc["seconds"][rolled:], default=0.0)
        if longest > self._longest:  # how far a raw row reaches back (read.py)
            self._longest = longest
            con.execute("DELETE FROM longest_interval")
            con.execute("INSERT INTO longest_interval VALUES (?)", [self._longest])
        return accepted - late

    def _over_limit(self, target: str, room: int) -> str:
        if self._series_of[target] + room >= self.max_series:
            return f"new series over the limit of {self.max_series:,} per target: samples refused"
        return f"new series over the limit of {self.max_new_series:,} per round: samples refused until a later round"

    @staticmethod
    def _series_row(sid: int, key: int, target: str, s: Sample) -> SeriesRow:
        labels = dict(s.labels)
        le = labels.pop("le", None)
        engine = labels.get("engine")
        le_value = float(le.replace("+Inf", "inf")) if le is not None and s.name.endswith("_bucket") else None
        if le is not None and le_value is None:
            labels["le"] = le
        return (sid, target, s.name, s.family, s.kind, json.dumps(labels, sort_keys=True), engine, le_value, key)
