"""The collector loop: every interval, scrape all targets and hand the batches to the warehouse.

The targets file is re-read every round (the twin or an operator may rewrite it); a bad file
keeps the last good list and is reported once per change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx

from warehouse.db import Warehouse, storage_problem
from warehouse.experts import ExpertIngestor
from warehouse.ingest import Ingestor, ScrapeBatch, TargetInfo
from warehouse.requests import FeedError, RequestIngestor
from warehouse.rollup import Retention

from .experts import NOT_READY, SnapshotResult, fetch_snapshot
from .promapi import PromAPIError, http_get, pull_range
from .requests import FeedResult, fetch_feed
from .scrape import Fetch, http_fetcher, scrape_all, utc_now
from .targets import TargetsError, load_targets

log = logging.getLogger(__name__)


class Collector:
    def __init__(self, warehouse: Warehouse, targets_path: str | Path, interval: float = 5.0,
                 timeout: float | None = None, snapshot_every: int = 12,
                 retention: Retention | None = None, prometheus: str | None = None) -> None:  # fmt: skip
        self.warehouse = warehouse
        self.targets_path = Path(targets_path)
        self.interval = interval
        self.timeout = timeout if timeout is not None else max(0.5, interval * 0.8)
        self.retention = retention or Retention()
        self.ingestor = Ingestor(self.retention)
        self.expert_ingestor = ExpertIngestor()
        self.request_ingestor = RequestIngestor()
        self.snapshot_every = snapshot_every  # rounds between per-expert snapshots (60 s at 5 s)
        self._snapshot_due: dict[str, int] = {}
        self.targets: list[TargetInfo] = []
        self._targets_error: str | None = None
        # Read a Prometheus-compatible API instead of scraping (one interval behind, so its
        # scrapes of that interval are in).
        self.prometheus = prometheus
        self._pulled_until: datetime | None = None
        self.rounds = 0

    def refresh_targets(self) -> list[TargetInfo]:
        try:
            self.targets = load_targets(self.targets_path)
            self._targets_error = None
        except TargetsError as exc:
            if str(exc) != self._targets_error:
                log.error("%s (keeping %d known targets)", exc, len(self.targets))
                self._targets_error = str(exc)
        return self.targets

    def store(self, batches: list[ScrapeBatch], snapshots: list[SnapshotResult] | None = None,
              feeds: list[FeedResult] | None = None) -> int:  # fmt: skip
        def job(con) -> int:  # type: ignore[no-untyped-def]
            n = sum(self.ingestor.write(con, b) for b in batches)
            ts = batches[0].ts if batches else None
            for r in snapshots or []:
                if r.snapshot is not None and ts is not None:
                    self.expert_ingestor.write(con, r.target.name, ts, r.snapshot)
            for f in feeds or []:
                for page in f.pages:
                    try:
                        self.request_ingestor.write(con, f.target.name, page, ts or utc_now())
                    except FeedError as exc:  # the rest of this gateway's pages wait for the next round
                        log.error("request feed %s: %s", f.target.name, exc)
                        break
            return n

        try:
            return self.warehouse.write_stored(job, "a collector round")
        except Exception:
            # The transaction rolled back: forget what the ingestors believe was stored, so
            # they reload series, last values and feed cursors from the database.
            self.ingestor, self.expert_ingestor = Ingestor(self.retention), ExpertIngestor()
            self.request_ingestor = RequestIngestor()
            raise

    async def _feeds(self, targets: list[TargetInfo], fetch: Fetch) -> list[FeedResult]:
        gateways = [t for t in targets if t.role == "gateway"]
        if not gateways:
            return []
        ingestor = self.request_ingestor
        cursors = await asyncio.to_thread(self.warehouse.write_stored,
                                          lambda con: {t.name: ingestor.cursor(con, t.name) for t in gateways},
                                          "the request feeds' cursors")  # fmt: skip
        results = list(await asyncio.gather(*(fetch_feed(t, cursors[t.name], fetch, self.timeout) for t in gateways)))
        for r in results:
            if r.error:
                log.warning("request feed %s: %s", r.target.name, r.error)
        return results

    async def _snapshots(self, targets: list[TargetInfo], fetch: Fetch) -> list[SnapshotResult]:
        due = [
            t for t in targets if t.role in ("prefill", "decode") and self._snapshot_due.get(t.name, 0) <= self.rounds
        ]
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
            batches = pull_range(http_get(self.prometheus, self.timeout * 4), targets, start, end, self.interval)
        except PromAPIError as exc:
            return [ScrapeBatch(t, end, False, 0.0, error=f"prometheus API: {exc}") for t in targets]
        self._pulled_until = start + step * int((end - start) / step)  # the last evaluation point asked for
        return batches

    async def round(self, fetch: Fetch) -> list[ScrapeBatch]:
        targets = self.refresh_targets()
        if self.prometheus:
            batches = await asyncio.to_thread(self._pull, targets)
            await asyncio.to_thread(self.store, batches)
            self.rounds += 1
            return batches
        batches = await scrape_all(targets, fetch, self.timeout)
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
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=256)) as client:
            fetch = http_fetcher(client)
            next_at = time.monotonic()
            while not stop.is_set():
                try:
                    await self.round(fetch)
                except Exception as exc:  # keep collecting; the reason is in the log
                    if storage_problem(exc) is None:  # the warehouse reports disk full or read-only itself
                        log.exception("collector round failed")
                next_at += self.interval
                delay = next_at - time.monotonic()
                if delay < 0:  # fell behind: skip missed rounds rather than burst
                    next_at = time.monotonic()
                    delay = 0
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
