"""The collector reads a real gateway's feed into the warehouse: every request once, across restarts."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx

from collectors.requests import fetch_feed
from collectors.scrape import Response, ScrapeError, http_fetch
from collectors.service import Collector
from moemeter.contract import TargetInfo
from warehouse.db import Warehouse

from ..stack.gateway.conftest import start_rig


async def _round(collector: Collector) -> None:
    async with http_fetch() as fetch:
        await collector.round(fetch)


def test_every_request_lands_once_across_collector_restarts(tmp_path: Path) -> None:
    rig = start_rig(tmp_path)
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"name": "gateway", "url": rig.url + "/metrics", "role": "gateway", "gpus": 0}]))
    wh = Warehouse(tmp_path / "w.duckdb")
    try:
        sent = []
        for _round_no in range(3):
            for i in range(4):
                r = httpx.post(
                    rig.url + "/v1/completions",
                    json={"model": "twin-moe", "prompt": "a b c", "max_tokens": 2 + i, "user": f"u{i}"},
                )
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


def test_poison_records_in_a_feed_are_repaired_or_refused_alone(tmp_path: Path) -> None:
    """The audit's poison, in the log of a gateway that wrote it as older gateways did (today's
    gateway cleans it first): a lone surrogate user and a prompt of 2^63 tokens. Every round is
    stored; the first record is kept with U+FFFD, the second refused, both said in `rejected`."""
    from moemeter.contract.requests import RequestRecord

    for d in ("old", "other"):
        (tmp_path / d).mkdir()
    old, other = start_rig(tmp_path / "old"), start_rig(tmp_path / "other")
    targets = tmp_path / "targets.json"
    targets.write_text(
        json.dumps(
            [
                {"name": n, "url": r.url + "/metrics", "role": "gateway", "gpus": 0}
                for n, r in (("old", old), ("other", other))
            ]
        )
    )
    wh = Warehouse(tmp_path / "w.duckdb")

    def record(**kw: object) -> RequestRecord:
        base = dict(
            request_id="r",
            started_at=time.time() - 3600,  # within the gateway log's week, whenever the test runs
            user="u",
            tenant="t",
            model="twin-moe",
            endpoint="completions",
            stream=False,
            status=200,
            outcome="ok",
            prompt_tokens=3,
        )
        return RequestRecord(**{**base, **kw})  # type: ignore[arg-type]

    try:
        for rec in (record(user="\ud800evil"), record(prompt_tokens=2**63), record(user="fine")):
            old.records.append(rec)
        for rig in (old, other):
            httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a", "max_tokens": 1})
            rig.flush()
        collector = Collector(wh, targets, interval=1.0)
        for _ in range(3):
            asyncio.run(_round(collector))
        stored = wh.query_df("SELECT gateway, user_id, prompt_tokens FROM requests ORDER BY gateway, seq")
        rejected = wh.query_df("SELECT target, kind, reason, count FROM rejected ORDER BY reason")
        scrapes = wh.query_df("SELECT target, count(*) FILTER (WHERE up) AS up FROM scrapes GROUP BY 1 ORDER BY 1")
    finally:
        wh.close()
        old.loop.close()
        other.loop.close()
    assert stored.values.tolist() == [
        ["old", "\ufffdevil", 3],
        ["old", "fine", 3],
        ["old", "anonymous", 1],
        ["other", "anonymous", 1],
    ]
    assert rejected.values.tolist() == [
        ["old", "request", "prompt_tokens must be a non-negative integer that fits its column: record refused", 1],
        ["old", "request", "user is not valid UTF-8: stored with U+FFFD in place", 1],
    ]
    assert scrapes.values.tolist() == [["old", 3], ["other", 3]]
    assert (collector.health.rounds, collector.health.rounds_failed, collector.health.refused) == (3, 0, 2)
