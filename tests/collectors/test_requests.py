"""The collector reads a real gateway's feed into the warehouse: every request once, across restarts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from collectors.requests import fetch_feed
from collectors.scrape import Response, ScrapeError, http_fetcher
from collectors.service import Collector
from warehouse.db import Warehouse
from warehouse.ingest import TargetInfo

from ..stack.gateway.conftest import start_rig


async def _round(collector: Collector) -> None:
    async with httpx.AsyncClient() as client:
        await collector.round(http_fetcher(client))


def test_every_request_lands_once_across_collector_restarts(tmp_path: Path) -> None:
    rig = start_rig(tmp_path)
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"name": "gateway", "url": rig.url + "/metrics", "role": "gateway", "gpus": 0}]))
    wh = Warehouse(tmp_path / "w.duckdb")
    try:
        sent = []
        for _round_no in range(3):
            for i in range(4):
                r = httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a b c",
                                                                   "max_tokens": 2 + i, "user": f"u{i}"})  # fmt: skip
                sent.append(r.headers["X-Request-Id"])
            rig.flush()
            collector = Collector(wh, targets, interval=1.0)  # a fresh collector each time: cursor from the file
            asyncio.run(_round(collector))
            asyncio.run(_round(collector))  # nothing new: nothing stored
        rows = wh.query_df("SELECT request_id, user_id, generated_tokens FROM requests ORDER BY seq")
        assert list(rows.request_id) == sent
        assert list(rows.generated_tokens) == [2, 3, 4, 5] * 3
        assert wh.query_df("SELECT records, lost FROM request_feeds").values.tolist() == [[12, 0]]
        # the gateway's /metrics was scraped in the same rounds
        assert wh.query_df("SELECT count(*) n FROM series WHERE family = 'moemeter_gateway_requests'").n[0] > 0
    finally:
        wh.close()
        rig.loop.close()


def test_feed_errors_are_reported_not_raised() -> None:
    target = TargetInfo("gw", "http://gw:1/metrics", "gateway", 0)

    async def run(answer: Response | Exception):  # type: ignore[no-untyped-def]
        async def fetch(url: str, timeout: float) -> Response:
            if isinstance(answer, Exception):
                raise answer
            return answer

        return await fetch_feed(target, None, fetch, 1.0)

    assert asyncio.run(run(ScrapeError("connection refused"))).error == "connection refused"
    assert asyncio.run(run(Response(404, "text/plain", b"nope"))).error == "HTTP 404 from /moemeter/requests"
    assert "not JSON" in asyncio.run(run(Response(200, "application/json", b"{"))).error
