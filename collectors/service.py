"""The collector loop: every interval, scrape all targets and hand the batches to the warehouse.

The targets file is re-read every round (the twin or an operator may rewrite it); a bad file
keeps the last good list and is reported once per change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx

from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch, TargetInfo

from .scrape import Fetch, http_fetcher, scrape_all
from .targets import TargetsError, load_targets

log = logging.getLogger(__name__)


class Collector:
    def __init__(self, warehouse: Warehouse, targets_path: str | Path, interval: float = 5.0,
                 timeout: float | None = None) -> None:  # fmt: skip
        self.warehouse = warehouse
        self.targets_path = Path(targets_path)
        self.interval = interval
        self.timeout = timeout if timeout is not None else max(0.5, interval * 0.8)
        self.ingestor = Ingestor()
        self.targets: list[TargetInfo] = []
        self._targets_error: str | None = None
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

    def store(self, batches: list[ScrapeBatch]) -> int:
        def job(con) -> int:  # type: ignore[no-untyped-def]
            return sum(self.ingestor.write(con, b) for b in batches)

        return self.warehouse.write(job)

    async def round(self, fetch: Fetch) -> list[ScrapeBatch]:
        targets = self.refresh_targets()
        batches = await scrape_all(targets, fetch, self.timeout)
        for b in batches:
            if not b.up:
                log.warning("scrape %s failed: %s", b.target.name, b.error)
        await asyncio.to_thread(self.store, batches)
        self.rounds += 1
        return batches

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=256)) as client:
            fetch = http_fetcher(client)
            next_at = time.monotonic()
            while not stop.is_set():
                try:
                    await self.round(fetch)
                except Exception:  # keep collecting; the reason is in the log
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
