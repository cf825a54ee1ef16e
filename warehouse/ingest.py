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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from moemeter.contract import Layout, Page, Sample, TargetInfo
from moemeter.contract.clock import latest_allowed, utc_now

from .db import insert_arrow, reasons_text, record_rejected
from .read import HOUR, floor, micros
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
    samples: Sequence[Sample] = field(default_factory=list)
    bytes: int = 0
    error: str | None = None


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
NO_READING = np.iinfo(np.int64).min  # a series' last reading time, in microseconds, when it has none
_F64, _I64, _BOOL = pa.float64(), pa.int64(), pa.bool_()


def dcgm_blanks(values: np.ndarray) -> np.ndarray:
    """Which of a DCGM series' values are its "no value" sentinels."""
    with np.errstate(invalid="ignore"):
        return (values >= DCGM_INT64_BLANK_MIN) | ((values >= DCGM_FP64_BLANK) & (values <= DCGM_FP64_BLANK + 3))


def is_dcgm_blank(name: str, value: float) -> bool:
    """DCGM's "no value" sentinels, which must never be read as a measurement."""
    return name.startswith("DCGM_") and bool(dcgm_blanks(np.array([value]))[0])


@dataclass
class _Raw:
    """Raw rows of one scrape time, held until they are inserted together."""

    ts: datetime | None = None
    targets: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # name -> its row (first and last seen now)
    seen: list[str] = field(default_factory=list)  # targets stored as they are: their last_seen alone moves to ts
    scrapes: list[tuple[Any, ...]] = field(default_factory=list)
    samples: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)  # ids, values, NULL
    increments: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)

    def renumber(self, final: np.ndarray) -> None:
        """Give rows of series first seen this round their ids."""
        for ids, *_ in self.samples:
            _renumber(ids, final)

    def flush(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.targets:
            names = ["name", "url", "role", "gpus", "stack", "hostname", "first_seen", "last_seen"]
            insert_arrow(
                con,
                "targets",
                {n: pa.array(c) for n, c in zip(names, zip(*self.targets.values()), strict=True)},
                "ingest_targets",  # an upsert
            )
        if self.seen:  # one column updated: a tenth of the upsert's CPU
            con.execute(sql("ingest_targets_seen"), {"ts": self.ts, "names": self.seen})
        if self.scrapes:
            names = ["ts", "target", "up", "duration_seconds", "samples", "bytes", "error"]
            types = [pa.timestamp("us"), pa.string(), _BOOL, _F64, pa.int32(), _I64, pa.string()]
            rows = zip(names, zip(*self.scrapes), types, strict=True)
            insert_arrow(con, "scrapes", {n: pa.array(c, type=t) for n, c, t in rows})
        if self.samples:
            ids, values, null = (np.concatenate(c) for c in zip(*self.samples))
            self._append(con, "samples", ids, {"value": pa.array(values, mask=null)})
        if self.increments:
            ids, delta, seconds, reset = (np.concatenate(c) for c in zip(*self.increments))
            columns = {"delta": pa.array(delta), "seconds": pa.array(seconds), "reset": pa.array(reset)}
            self._append(con, "increments", ids, columns)
        self.targets.clear()
        self.seen.clear()
        self.scrapes.clear()
        self.samples.clear()
        self.increments.clear()

    def _append(
        self, con: duckdb.DuckDBPyConnection, table: str, ids: np.ndarray, columns: dict[str, pa.Array]
    ) -> None:
        """Insert the rows in series id order: like series side by side (Ingestor._number)."""
        if len(ids) > 1 and bool((ids[1:] < ids[:-1]).any()):
            order = np.argsort(ids, kind="stable")
            ids, columns = ids[order], {k: a.take(pa.array(order)) for k, a in columns.items()}
        stamps = pa.repeat(pa.scalar(self.ts, pa.timestamp("us")), len(ids))
        insert_arrow(con, table, {"ts": stamps, "series_id": pa.array(ids), **columns})


@dataclass
class _NewSeries:
    """A series first seen in the round being written: its id is given when the round is flushed."""

    provisional: int  # negative, unique in the round
    monotonic: bool
    key: int
    target: str
    seen_as: tuple[str, tuple[tuple[str, str], ...], str, str]
    sample: Sample


@dataclass
class _Mapped:
    """A page's samples as the series they are, position by position: what a page of the same
    layout (moemeter.contract.Layout) maps to again without looking at a sample."""

    layout: Layout | None
    sids: np.ndarray  # series id; 0 where the sample was refused, negative for a series new this round
    monotonic: np.ndarray  # a counter's sample: its increases count
    dcgm: np.ndarray  # a DCGM field's: its "no value" sentinels are blanks
    keep: np.ndarray = field(init=False)  # the first sample of its series on the page, not refused
    started: tuple[int, ...] = ()  # where the page says when its process started (process_start_time_seconds)

    def __post_init__(self) -> None:
        self.keep = np.zeros(len(self.sids), dtype=bool)  # a duplicate sample in a page: the first one counts
        self.keep[np.unique(self.sids, return_index=True)[1]] = True
        self.keep &= self.sids != 0

    def renumber(self, final: np.ndarray) -> None:
        """Give the series first seen this round their ids."""
        _renumber(self.sids, final)


def _renumber(ids: np.ndarray, final: np.ndarray) -> None:
    """Replace provisional ids (-k, a series first seen in the round being written) with their
    ids (final[k - 1]), in place."""
    new = ids < 0
    if new.any():
        ids[new] = final[-ids[new] - 1]


class Ingestor:
    """Turns batches into rows. Keeps the last reading of every counter, in arrays by series id,
    and each target's last page layout as series ids, so a page like the last one is written
    column by column."""

    def __init__(
        self,
        retention: Retention | None = None,
        max_series: int = MAX_SERIES_PER_TARGET,
        max_new_series: int = MAX_NEW_SERIES_PER_ROUND,
        clock: Callable[[], datetime] | None = None,
        roll: bool = True,
    ) -> None:
        """`clock`: the writer's own time, naive UTC (a batch after moemeter.contract.clock.latest_allowed is refused);
        `roll`: advance the rollups as batches of a new minute come (the collector rolls them up in
        a transaction of their own instead, so a roll-up that fails costs no round)."""
        self._ids: dict[int, int] = {}  # series key -> series id, of every stored series
        self._next_id = _next_ids(0)
        self._new: list[_NewSeries] = []  # first seen in the round being written
        self._series_of: Counter[str] = Counter()  # series stored, per target
        # a counter's last reading, by series id: its time (microseconds) and value
        self._last_us = np.full(1024, NO_READING, dtype=np.int64)
        self._last_v = np.full(1024, np.nan)
        self._new_last: dict[int, tuple[int, float]] = {}  # the same, of series new this round
        # per target, what a sample's name, labels, family and kind make of it: (series id,
        # monotonic); kept for stored series only, so a target inventing labels adds none
        self._seen_as: dict[str, dict[tuple[str, tuple[tuple[str, str], ...], str, str], tuple[int, bool]]] = {}
        self._mapped: dict[str, _Mapped] = {}  # per target, its last page's layout, mapped
        self._targets: dict[str, tuple[Any, ...]] = {}  # per target, its url, role, gpus, stack, hostname as stored
        self._longest = 0.0  # the longest interval of any stored increment
        self._loaded = False
        self.rollups = Rollups(retention)
        self.clock = clock or utc_now
        self.roll = roll
        self.max_series, self.max_new_series = max_series, max_new_series

    def _load(self, con: duckdb.DuckDBPyConnection) -> None:
        """After a restart: known series, and the last reading of each series seen in the last hour
        (a counter's: its last stored reading plus the increases since)."""
        self._ids = dict(con.execute(sql("ingest_series_ids")).fetchall())
        self._next_id = _next_ids(max(self._ids.values(), default=0))
        self._grow(max(self._ids.values(), default=0))
        self._series_of = Counter(dict(con.execute(sql("ingest_series_per_target")).fetchall()))
        last = con.execute(sql("ingest_last_readings")).fetchnumpy()
        self._last_us[last["series_id"]] = last["us"]
        self._last_v[last["series_id"]] = last["value"]
        self._longest = float(con.execute(sql("ingest_longest")).fetchall()[0][0])
        rows = con.execute(sql("ingest_targets_known")).fetchall()
        self._targets = {name: tuple(about) for name, *about in rows}
        self._loaded = True

    def _grow(self, last_id: int) -> None:
        if last_id >= len(self._last_us):
            more = max(last_id + 1, 2 * len(self._last_us)) - len(self._last_us)
            self._last_us = np.concatenate([self._last_us, np.full(more, NO_READING, dtype=np.int64)])
            self._last_v = np.concatenate([self._last_v, np.full(more, np.nan)])

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
        final = np.zeros(len(self._new), dtype=np.int64)
        rows: list[SeriesRow] = []
        for new in sorted(self._new, key=lambda n: (n.sample.name, -n.provisional)):
            sid = final[-new.provisional - 1] = self._next_id[new.monotonic]
            self._next_id[new.monotonic] += 2
            self._ids[new.key] = sid
            self._seen_as[new.target][new.seen_as] = (sid, new.monotonic)
            rows.append(self._series_row(sid, new.key, new.target, new.sample))
        self._grow(int(final.max()))
        for provisional, (us, v) in self._new_last.items():
            self._last_us[final[-provisional - 1]], self._last_v[final[-provisional - 1]] = us, v
        self._new.clear()
        self._new_last.clear()
        raw.renumber(final)
        for mapped in self._mapped.values():
            mapped.renumber(final)
        cols = list(zip(*rows))
        types = [pa.int64(), *[pa.string()] * 6, pa.float64(), pa.int64()]
        names = ["series_id", "target", "metric", "family", "kind", "labels", "engine", "le", "series_key"]
        insert_arrow(con, "series", {n: pa.array(c, type=t) for n, c, t in zip(names, cols, types, strict=True)})

    def _write(self, con: duckdb.DuckDBPyConnection, batch: ScrapeBatch, raw: _Raw) -> int:
        if not self._loaded:
            self._load(con)
        t = batch.target
        if batch.ts > latest_allowed(now := self.clock()):  # its time would move watermarks and retention
            why = (
                f"a batch at {batch.ts:%Y-%m-%d %H:%M:%S}, after the writer's clock ({now:%Y-%m-%d %H:%M:%S}): refused"
            )
            log.warning("%s: %s", t.name, why)
            record_rejected(con, now, t.name, "scrape", Counter({why: max(len(batch.samples), 1)}))
            return 0
        if self.roll:  # a batch of a new minute (hour) closes the previous ones, never past the clock
            self.rollups.advance(con, min(batch.ts, now))
        about = (t.url, t.role, t.gpus, t.stack, t.hostname)
        if self._targets.get(t.name) == about:
            raw.seen.append(t.name)
        else:
            raw.targets[t.name] = (t.name, *about, batch.ts, batch.ts)
            self._targets[t.name] = about  # a rolled-back round leaves the collector a fresh Ingestor
        raw.scrapes.append(
            (batch.ts, t.name, batch.up, batch.duration_seconds, len(batch.samples), batch.bytes, batch.error)
        )
        raw.ts = batch.ts
        refused: Counter[str] = Counter()
        mapped = self._map(t.name, batch.samples, refused)
        values = np.asarray(
            batch.samples.values if isinstance(batch.samples, Page) else [s.value for s in batch.samples]
        )
        late, rolled = self._rows(batch.ts, mapped, values, raw)
        if late:
            refused["counter readings at or before the series' last reading: not stored"] += late
        if refused:
            log.warning("%s: %s", t.name, reasons_text(refused))
            record_rejected(con, batch.ts, t.name, "series", refused)
        if rolled > self._longest:  # how far a raw row reaches back (read.py)
            self._longest = rolled
            con.execute(sql("ingest_longest_clear"))
            con.execute(sql("ingest_longest_set"), {"seconds": self._longest})
        return int(mapped.keep.sum()) - late

    def _map(self, target: str, samples: Sequence[Sample], refused: Counter[str]) -> _Mapped:
        """The page's samples as series: from the target's last page where the page has its layout
        (or one made from it by a few moved lines), else sample by sample. A new series gets a
        provisional id; one over the limits is refused (id 0), and counted in `refused`."""
        layout = samples.layout if isinstance(samples, Page) else None
        last = self._mapped.get(target)
        if last is not None and layout is not None and last.layout is layout:
            return last
        seen_as = self._seen_as.setdefault(target, {})
        room = [min(self.max_new_series, self.max_series - self._series_of[target]), 0]  # and new series taken
        if last is not None and layout is not None and layout.parent is last.layout:
            sids, monotonic = last.sids.copy(), last.monotonic.copy()
            for at in layout.changed:
                sids[at], monotonic[at] = self._series(target, layout.samples[at], seen_as, room, refused)
            mapped = _Mapped(layout, sids, monotonic, last.dcgm, last.started)
        else:
            named = layout.samples if layout is not None else samples  # the layout's: no Sample made per value
            pairs = [self._series(target, s, seen_as, room, refused) for s in named]
            sids = np.array([sid for sid, _ in pairs], dtype=np.int64)
            monotonic = np.array([m for _, m in pairs], dtype=bool)
            dcgm = np.array([s.name.startswith("DCGM_") for s in named], dtype=bool)
            started = tuple(i for i, s in enumerate(named) if s.name == "process_start_time_seconds")
            mapped = _Mapped(layout, sids, monotonic, dcgm, started)
        self._series_of[target] += room[1]
        if layout is not None and not (mapped.sids == 0).any():  # a refused sample is counted again each round
            self._mapped[target] = mapped
        else:
            self._mapped.pop(target, None)
        return mapped

    def _series(
        self,
        target: str,
        s: Sample,
        seen_as: dict[tuple[str, tuple[tuple[str, str], ...], str, str], tuple[int, bool]],
        room: list[int],
        refused: Counter[str],
    ) -> tuple[int, bool]:
        """One sample's series id (0: refused, negative: new this round) and whether it counts.
        `room`: how many new series the target may add this round, and how many it has."""
        as_seen = (s.name, s.labels, s.family, s.kind)
        known = seen_as.get(as_seen)
        if known is not None:
            return known
        key = series_key(target, s.name, s.labels)
        monotonic = is_monotonic(s)
        if key in self._ids:
            sid = self._ids[key]
            if sid < 0:  # new this round, first seen as another family or kind (a page repeating a
                return sid, monotonic  # family): `_number` numbers the first sight only, so not kept
        elif room[1] >= room[0]:
            refused[self._over_limit(target, room[0])] += 1
            return 0, monotonic
        else:
            sid = self._ids[key] = -(len(self._new) + 1)  # numbered when the round is flushed
            self._new.append(_NewSeries(sid, monotonic, key, target, as_seen, s))
            room[1] += 1
        seen_as[as_seen] = (sid, monotonic)
        return sid, monotonic

    def _rows(self, ts: datetime, mapped: _Mapped, values: np.ndarray, raw: _Raw) -> tuple[int, float]:
        """A page's rows into `raw`, column by column: every kept sample that is not a counter's
        reading as read, a counter's reading where it anchors, its increase since the last one.
        Returns the readings refused as late, and the longest interval of an increase."""
        now, hour = micros(ts), micros(floor(ts, HOUR))
        keep = mapped.keep
        sids, v = mapped.sids[keep], values[keep]
        blank = mapped.dcgm[keep] & dcgm_blanks(v)  # stored as NULL: "no value", not a reading
        with np.errstate(invalid="ignore"):  # a counter is finite and never negative; else kept raw
            counts = mapped.monotonic[keep] & np.isfinite(v) & (v >= 0) & ~blank
        if not counts.all():
            raw.samples.append((sids[~counts], v[~counts], blank[~counts]))
        sids, v = sids[counts], v[counts]
        prev_us, prev_v = self._previous(sids)
        seen = prev_us != NO_READING
        late = seen & (now <= prev_us)  # adds nothing, and as a row could pass for the last reading
        sids, v, prev_us, prev_v, seen = sids[~late], v[~late], prev_us[~late], prev_v[~late], seen[~late]
        self._remember(sids, now, v)
        with np.errstate(invalid="ignore"):
            exact = (v < EXACT_BELOW) & (np.floor(v) == v) & (np.floor(prev_v) == prev_v)
        anchor = ~seen | (prev_us < hour) | ~exact  # the increases cannot give this reading back exactly
        raw.samples.append((sids[anchor], v[anchor], np.zeros(int(anchor.sum()), dtype=bool)))
        sids, v, prev_us, prev_v = sids[seen], v[seen], prev_us[seen], prev_v[seen]
        reset = v < prev_v
        since = prev_us
        started = next((us for at in mapped.started if (us := _started(values[at])) is not None), None)
        if started is not None:  # a restart's increase is counted since the process started
            since = np.where(reset & (prev_us < started) & (started < now), started, prev_us)
        seconds = (now - since) / 1e6
        raw.increments.append((sids, np.where(reset, v, v - prev_v), seconds, reset))
        return int(late.sum()), float(seconds.max(initial=0.0))

    def _previous(self, sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The last reading of these counters: its time (NO_READING where none) and value."""
        known = sids > 0
        if known.all():
            return self._last_us[sids], self._last_v[sids]
        us, v = np.full(len(sids), NO_READING, dtype=np.int64), np.full(len(sids), np.nan)
        us[known], v[known] = self._last_us[sids[known]], self._last_v[sids[known]]
        for i in np.flatnonzero(~known):
            us[i], v[i] = self._new_last.get(int(sids[i]), (NO_READING, np.nan))
        return us, v

    def _remember(self, sids: np.ndarray, now: int, values: np.ndarray) -> None:
        known = sids > 0
        self._last_us[sids[known]], self._last_v[sids[known]] = now, values[known]
        for sid, v in zip(sids[~known].tolist(), values[~known].tolist(), strict=True):
            self._new_last[sid] = (now, v)

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


def _started(value: float) -> int | None:
    """When the target's process started, from its `process_start_time_seconds` (which vLLM and the
    twin export), in microseconds since the epoch as a naive UTC time; None where it is no time."""
    if not (math.isfinite(value) and 0 < value < 32503680000):
        return None
    return micros(datetime.fromtimestamp(value, UTC).replace(tzinfo=None))
