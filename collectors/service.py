"""The collector loop: every interval, scrape all targets and hand the batches to the warehouse.

The targets file is re-read every round (the twin or an operator may rewrite it); a bad file
keeps the last good list and is reported once per change. A round is one transaction; should
one target's input still break it (whatever the checks before did not foresee), the round is
stored again target by target, so only that target's input is refused, with its reason stored
in `rejected` and its scrape marked not stored. `health` says how rounds went (GET /health).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from moemeter.contract import DEFAULT_INTERVAL, POOLS, TargetInfo
from moemeter.contract.clock import utc_now
from moemeter.contract.errors import MoemeterError
from warehouse.db import REASON_CHARS, Warehouse, reasons_text, record_rejected, storage_problem
from warehouse.experts import ExpertIngestor
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.limits import trim_heap
from warehouse.requests import FeedError, RequestIngestor
from warehouse.rollup import Retention, Rollups
from warehouse.sql import sql

from .experts import NOT_READY, SnapshotResult, fetch_snapshot
from .parse import PageCache
from .promapi import PromAPIError, http_get, pull_range
from .requests import FeedResult, fetch_feed
from .scrape import Fetch, http_fetch, scrape_all
from .targets import TargetsError, load_targets

log = logging.getLogger(__name__)


@dataclass
class CollectorHealth:
    """How the collector's rounds went, since it started (GET /health on the query API)."""

    rounds: int = 0  # rounds stored, whole or target by target
    rounds_failed: int = 0  # rounds nothing of which could be stored
    failing_since: str = ""  # ISO time of the first failed round in the current run of failures, "" if none
    last_error: str = ""  # why the last failed round failed
    targets_not_stored: int = 0  # target-rounds refused alone while the rest of their round was stored
    refused: int = 0  # samples, records and snapshots refused or repaired (the `rejected` table has each)
    starting: str = ""  # what collection waits for before its first round ("" once it runs)
    rollups_failing_since: str = ""  # ISO time the roll-ups first failed in the current run of failures
    rollup_error: str = ""  # why the last roll-up failed (rounds are still stored, raw)

    @property
    def ok(self) -> bool:
        return not self.failing_since and not self.rollups_failing_since

    def as_json(self) -> dict[str, object]:
        return {"ok": self.ok, **self.__dict__}


ROLL_BACKOFF_ROUNDS = 64  # the longest wait between tries of a failing roll-up (5 min 20 s at 5 s)


class RoundNotStored(MoemeterError, RuntimeError):
    """Nothing of a round could be stored, target by target either: the round failed."""


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Collector:
    def __init__(
        self,
        warehouse: Warehouse,
        targets_path: str | Path | None,
        interval: float = DEFAULT_INTERVAL,
        timeout: float | None = None,
        snapshot_every: int = 12,
        retention: Retention | None = None,
        prometheus: str | None = None,
    ) -> None:
        self.warehouse = warehouse
        self.targets_path = Path(targets_path) if targets_path is not None else None  # None: rounds come from store()
        self.interval = interval
        self.timeout = timeout if timeout is not None else max(0.5, interval * 0.8)
        self.retention = retention or Retention()
        self.ingestor = Ingestor(self.retention, roll=False)  # rolled up apart: self._roll
        self.expert_ingestor = ExpertIngestor()
        self.request_ingestor = RequestIngestor()
        self.pages: dict[str, PageCache] = {}  # each target's scrape cache
        self.snapshot_every = snapshot_every  # rounds between per-expert snapshots (60 s at 5 s)
        self._snapshot_due: dict[str, int] = {}
        self.targets: list[TargetInfo] = []
        self._targets_error: str | None = None
        # Read a Prometheus-compatible API instead of scraping (one interval behind, so its
        # scrapes of that interval are in).
        self.prometheus = prometheus
        self._pulled_until: datetime | None = None
        self.rounds = 0
        self.health = CollectorHealth()
        self._roll_failures, self._roll_wait = 0, 0  # roll-ups failed in a row; rounds until the next try

    def refresh_targets(self) -> list[TargetInfo]:
        if self.targets_path is None:
            return self.targets
        try:
            targets = load_targets(self.targets_path)
            self._targets_error = None
            if targets != self.targets:
                self._warn_other_stacks(targets)
            self.targets = targets
        except TargetsError as exc:
            if str(exc) != self._targets_error:
                log.error("%s (keeping %d known targets)", exc, len(self.targets))
                self._targets_error = str(exc)
        return self.targets

    def _warn_other_stacks(self, targets: list[TargetInfo]) -> None:
        """A target name the database already holds for another stack: both histories would mix
        under one name (the twin's decode-0 and real vLLM's), so say it, once per load."""
        try:
            stored = dict(self.warehouse.query_df(sql("service_target_stacks")).itertuples(index=False))
        except Exception:  # noqa: BLE001 - a warning only; the round reports storage trouble itself
            return
        for t in targets:
            was = stored.get(t.name)
            if was is not None and (was or "") != (t.stack or ""):
                log.warning(
                    "target %s was stack %r in this database and is now stack %r: their histories mix "
                    "under one name; give each stack a database of its own (moemeter up does) or "
                    "distinct target names",
                    t.name,
                    was,
                    t.stack,
                )

    def store(
        self,
        batches: list[ScrapeBatch],
        snapshots: list[SnapshotResult] | None = None,
        feeds: list[FeedResult] | None = None,
    ) -> int:
        """Store one round, then roll up what it closed; returns samples stored. Raises only when
        nothing of the round could be stored (a roll-up that fails is reported, not raised)."""
        snapshots, feeds = snapshots or [], feeds or []
        ts = batches[0].ts if batches else utc_now()
        try:
            n, refused = self.warehouse.write_stored(
                lambda con: self._write(con, ts, batches, snapshots, feeds), "a collector round"
            )
            self.health.refused += refused
        except Exception as exc:
            self._forget()
            if storage_problem(exc) is not None or not batches:
                raise
            log.error("a collector round failed (%s); storing it target by target", exc)
            n = self._store_apart(ts, batches, snapshots, feeds)
        self.health.rounds += 1
        self.health.failing_since = ""
        self._roll(max((b.ts for b in batches), default=ts))
        return n

    def _roll(self, ts: datetime) -> None:
        """Roll up the minutes and hours before `ts` in a transaction of their own: a roll-up that
        fails leaves the rows raw, to be rolled up by a later round, and says so on /health. After
        k failures in a row it is tried again 2^(k-1) rounds later (at most ROLL_BACKOFF_ROUNDS):
        each try reads the whole backlog on the one writer."""
        if self._roll_wait > 0:
            self._roll_wait -= 1
            return
        rollups, h = self.ingestor.rollups, self.health
        now = utc_now()  # a batch ahead of the clock closes no minute before its rows can arrive
        try:
            self.warehouse.write_stored(lambda con: rollups.advance(con, min(ts, now)), "the roll-ups")
        except Exception as exc:
            self.ingestor.rollups = Rollups(self.retention)  # its watermarks again from rollup_state
            if storage_problem(exc) is not None:
                return  # the writer reports a full or read-only disk itself
            h.rollup_error = f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
            self._roll_failures += 1
            self._roll_wait = min(2 ** (self._roll_failures - 1), ROLL_BACKOFF_ROUNDS) - 1
            if not h.rollups_failing_since:
                h.rollups_failing_since = _now_iso()
                log.error("roll-ups failed: %s; rounds are stored raw and rolled up once it passes", exc)
            return
        if h.rollups_failing_since:
            log.warning("roll-ups resumed after failing since %s", h.rollups_failing_since)
        h.rollups_failing_since = h.rollup_error = ""
        self._roll_failures = 0

    def _write(
        self,
        con,
        ts: datetime,
        batches: list[ScrapeBatch],
        snapshots: list[SnapshotResult],  # type: ignore[no-untyped-def]
        feeds: list[FeedResult],
    ) -> tuple[int, int]:
        """Store these inside the writer's transaction: (samples stored, items refused or repaired)."""
        n = self.ingestor.write_all(con, batches)
        for r in snapshots:
            if r.snapshot is not None:
                self.expert_ingestor.write(con, r.target.name, ts, r.snapshot)
            elif r.refused:
                record_rejected(con, ts, r.target.name, "snapshot", Counter({f"{r.error}: refused": 1}))
        for f in feeds:
            for page in f.pages:
                try:
                    self.request_ingestor.write(con, f.target.name, page, ts)
                except FeedError as exc:  # the rest of this gateway's pages wait for the next round
                    log.error("request feed %s: %s", f.target.name, exc)
                    records = page.get("records") if isinstance(page, dict) else None
                    count = len(records) if isinstance(records, list) else 1
                    record_rejected(
                        con,
                        ts,
                        f.target.name,
                        "request",
                        Counter({f"{exc}: page not stored, read again next round": count}),
                    )
                    break
        names = sorted({b.target.name for b in batches} | {f.target.name for f in feeds})
        refused = con.execute(sql("service_refused"), {"ts": ts, "targets": names}).fetchone()
        return n, int(refused[0])

    def _store_apart(
        self, ts: datetime, batches: list[ScrapeBatch], snapshots: list[SnapshotResult], feeds: list[FeedResult]
    ) -> int:
        """The round again, one transaction per target: a bad input is refused alone. Raises
        RoundNotStored when no target's input could be stored."""
        n, stored_any = 0, False
        for b in batches:
            name = b.target.name
            job = partial(
                self._write,
                ts=ts,
                batches=[b],
                snapshots=[r for r in snapshots if r.target.name == name],
                feeds=[f for f in feeds if f.target.name == name],
            )
            try:
                stored, refused = self.warehouse.write_stored(job, f"{name}'s round")
                n += stored
                self.health.refused += refused
                stored_any = True
                continue
            except Exception as exc:
                self._forget()
                if storage_problem(exc) is not None:
                    raise
                reason = f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
            log.error("%s: this round's input could not be stored: %s", name, reason)
            self.health.targets_not_stored += 1
            not_stored = ScrapeBatch(
                b.target, b.ts, False, b.duration_seconds, bytes=b.bytes, error=f"scraped but not stored: {reason}"
            )
            why = Counter({f"{reason}: refused": max(len(b.samples), 1)})
            try:
                self.warehouse.write_stored(partial(self._note, batch=not_stored, why=why), f"{name}'s refusal")
                self.health.refused += max(len(b.samples), 1)
            except Exception as exc:
                self._forget()
                log.error("%s: could not even store why its round was refused: %s", name, exc)
        if not stored_any:
            raise RoundNotStored(f"no target's input of the round at {ts:%Y-%m-%d %H:%M:%S} could be stored")
        return n

    def _note(self, con, batch: ScrapeBatch, why: Counter[str]) -> None:  # type: ignore[no-untyped-def]
        """A target's round that could not be stored: its scrape, marked so, and the reason."""
        self.ingestor.write(con, batch)
        record_rejected(con, batch.ts, batch.target.name, "round", why)

    def _forget(self) -> None:
        """After a rolled-back transaction: forget what the ingestors believe was stored, so they
        reload series, last values and feed cursors from the database."""
        limits = self.ingestor.max_series, self.ingestor.max_new_series
        self.ingestor = Ingestor(self.retention, *limits, roll=False)
        self.expert_ingestor = ExpertIngestor()
        self.request_ingestor = RequestIngestor()

    def _round_failed(self, exc: BaseException) -> None:
        h = self.health
        h.rounds_failed += 1
        h.last_error = f"{type(exc).__name__}: {exc}"[:REASON_CHARS]
        h.failing_since = h.failing_since or _now_iso()

    async def _feeds(self, targets: list[TargetInfo], fetch: Fetch) -> list[FeedResult]:
        gateways = [t for t in targets if t.role == "gateway"]
        if not gateways:
            return []
        ingestor = self.request_ingestor
        cursors = await asyncio.to_thread(
            self.warehouse.write_stored,
            lambda con: {t.name: ingestor.cursor(con, t.name) for t in gateways},
            "the request feeds' cursors",
        )
        results = list(await asyncio.gather(*(fetch_feed(t, cursors[t.name], fetch, self.timeout) for t in gateways)))
        for r in results:
            if r.error:
                log.warning("request feed %s: %s", r.target.name, r.error)
        return results

    async def _snapshots(self, targets: list[TargetInfo], fetch: Fetch) -> list[SnapshotResult]:
        due = [t for t in targets if t.role in POOLS and self._snapshot_due.get(t.name, 0) <= self.rounds]
        results = list(await asyncio.gather(*(fetch_snapshot(t, fetch, self.timeout) for t in due)))
        for r in results:
            absent = r.absent
            self._snapshot_due[r.target.name] = self.rounds + self.snapshot_every * (60 if absent else 1)
            if r.error and not absent and r.error != NOT_READY:
                log.warning("expert snapshot %s failed: %s", r.target.name, r.error)
        return results

    def _pull(self, targets: list[TargetInfo]) -> list[ScrapeBatch]:
        assert self.prometheus is not None
        step = timedelta(seconds=self.interval)
        end = utc_now() - step
        start = self._pulled_until + step if self._pulled_until else end
        if start > end:
            return []
        try:
            pulled = pull_range(http_get(self.prometheus, self.timeout * 4), targets, start, end, self.interval)
        except PromAPIError as exc:
            return [ScrapeBatch(t, end, False, 0.0, error=f"prometheus API: {exc}") for t in targets]
        self._pulled_until = start + step * int((end - start) / step)  # the last evaluation point asked for
        if pulled.refused:
            self._note_refused(pulled.refused, "prometheus")
        return pulled.batches

    def _note_refused(self, refused: dict[str, Counter[str]], kind: str) -> None:
        """Store and count what a source sent that was refused before it reached a round."""
        for name, why in refused.items():
            log.warning("%s: %s", name, reasons_text(why))
        now = utc_now()

        def note(con) -> None:  # type: ignore[no-untyped-def]
            for name, why in refused.items():
                record_rejected(con, now, name, kind, why)

        self.warehouse.write_stored(note, "the refused points")
        self.health.refused += sum(sum(why.values()) for why in refused.values())

    async def round(self, fetch: Fetch) -> list[ScrapeBatch]:
        targets = self.refresh_targets()
        if self.prometheus:
            batches = await asyncio.to_thread(self._pull, targets)
            await asyncio.to_thread(self.store, batches)
            self.rounds += 1
            return batches
        for gone in self.pages.keys() - {t.name for t in targets}:
            del self.pages[gone]
        batches = await scrape_all(targets, fetch, self.timeout, caches=self.pages)
        for b in batches:
            if not b.up:
                log.warning("scrape %s failed: %s", b.target.name, b.error)
        up = [b.target for b in batches if b.up]
        snapshots = await self._snapshots(up, fetch)
        feeds = await self._feeds(up, fetch)
        await asyncio.to_thread(self.store, batches, snapshots, feeds)
        self.rounds += 1
        return batches

    async def run(self, stop: asyncio.Event) -> None:
        async with http_fetch() as fetch:
            next_at = time.monotonic()
            while not stop.is_set():
                try:
                    await self.round(fetch)
                except Exception as exc:  # keep collecting; the reason is in the log and in /health
                    self._round_failed(exc)
                    if storage_problem(exc) is None:  # the warehouse reports disk full or read-only itself
                        log.exception("collector round failed")
                await asyncio.to_thread(trim_heap)  # what the round freed goes back to the system
                next_at += self.interval
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind: skip missed rounds rather than burst
                    next_at = time.monotonic()
                    delay = 0
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
