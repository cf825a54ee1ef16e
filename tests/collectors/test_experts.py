"""Snapshot pulls: the URL next to /metrics, 404 means no plugin, bad bodies are reasons."""

from __future__ import annotations

import asyncio
import json

from collectors.experts import fetch_snapshot, snapshot_url
from collectors.scrape import http_fetch
from moemeter.contract import TargetInfo
from tests.conftest import reply

GOOD = {"schema": "moemeter.experts/1", "logical_tokens_total": [[1, 2]], "phy2log": [[0, 1]], "ranks": 1}


def test_snapshot_url_sits_beside_metrics():
    assert snapshot_url(TargetInfo("d", "http://h:1/metrics", "decode", 1)) == "http://h:1/moemeter/experts"
    assert snapshot_url(TargetInfo("d", "http://h:1/", "decode", 1)) == "http://h:1/moemeter/experts"


def test_fetch_outcomes(http_server):
    base, routes = http_server
    routes["/a/moemeter/experts"] = reply(json.dumps(GOOD).encode(), content_type="application/json")
    routes["/b/moemeter/experts"] = reply(b"not found", status=404)
    routes["/c/moemeter/experts"] = reply(b"{oops", content_type="application/json")
    routes["/d/moemeter/experts"] = reply(json.dumps({**GOOD, "ranks": 0}).encode())
    routes["/e/moemeter/experts"] = reply(b'{"error": "no MoE routing measured yet"}', status=503)

    async def go():
        async with http_fetch() as f:
            return [await fetch_snapshot(TargetInfo(n, f"{base}/{n}/metrics", "decode", 1), f, 2.0) for n in "abcde"]

    a, b, c, d, e = asyncio.run(go())
    assert a.snapshot is not None and a.error is None
    assert b.absent and b.snapshot is None
    assert "not JSON" in c.error
    assert "do not divide" in d.error
    assert e.error == "not ready yet (HTTP 503)" and not e.absent  # the plugin before any token: ask again later
