"""Hostile cases of the Prometheus-compatible source (`serve --prometheus`, `moemeter pull`): a
source's times and sizes are judged against this host's clock, the window asked for and a cap,
never trusted. The source is a loopback HTTP server speaking the query API (real Prometheus
cannot be made to hold a point in the future; it is the referee in
tests/integration/test_prometheus_source.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from collectors.parse import parse_page
from collectors.promapi import MAX_STEPS_PER_QUERY, PromAPIError, http_get, pull_range
from collectors.service import Collector
from moemeter.contract import TargetInfo
from warehouse.db import Warehouse
from warehouse.ingest import ScrapeBatch

TARGET = TargetInfo("decode-0", "http://decode-0:8000/metrics", "decode", 1)
FUTURE = timedelta(days=40)
Points = Callable[[float, float, float], list[tuple[float, str]]]


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Source:
    """A Prometheus-compatible API on loopback whose query_range answer a test writes: one counter
    series of decode-0, its points from `points(start, end, step)`; `padding` bytes of junk series."""

    def __init__(self) -> None:
        self.points: Points = lambda lo, hi, step: [
            (lo + k * step, str(100 + lo + k * step)) for k in range(1 + int((hi - lo) / step))
        ]
        self.padding = 0
        self.asked: list[dict[str, str]] = []
        source = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urlsplit(self.path)
                if url.path == "/api/v1/metadata":
                    data: Any = {"vllm:generation_tokens": [{"type": "counter", "help": "", "unit": ""}]}
                else:
                    q = {k: v[0] for k, v in parse_qs(url.query).items()}
                    source.asked.append(q)
                    values = source.points(float(q["start"]), float(q["end"]), float(q["step"]))
                    metric = {"__name__": "vllm:generation_tokens_total", "instance": "decode-0:8000", "engine": "0"}
                    result = [{"metric": metric, "values": [[t, v] for t, v in values]}]
                    junk = {"__name__": "vllm:junk", "instance": "elsewhere:1", "pad": "x" * 1000}
                    result += [{"metric": junk, "values": []}] * (source.padding // 1000)
                    data = {"resultType": "matrix", "result": result}
                body = json.dumps({"status": "success", "data": data}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def source() -> Iterator[Source]:
    s = Source()
    yield s
    s.server.shutdown()
    s.server.server_close()


def with_future_point(lo: float, hi: float, step: float) -> list[tuple[float, str]]:
    """The honest points of the window, and one 40 days ahead (the attack)."""
    honest = [(lo + k * step, str(1000 + lo + k * step)) for k in range(1 + int((hi - lo) / step))]
    return [*honest, (hi + FUTURE.total_seconds(), "1e12")]


def counts(wh: Warehouse) -> dict[str, int]:
    tables = ("samples", "increments", "samples_1m", "increments_1m", "scrapes")
    return {t: int(wh.query_df(f"SELECT count(*) AS n FROM {t}")["n"][0]) for t in tables}


def test_a_point_in_the_future_is_refused_and_moves_no_watermark_nor_retention(source, tmp_path) -> None:
    (tmp_path / "t.json").write_text(json.dumps([{"name": "decode-0", "url": TARGET.url, "role": "decode", "gpus": 1}]))
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, tmp_path / "t.json", interval=2.0, prometheus=source.url)
    now = utc_now()
    # Half an hour of history, a reading a minute, as a scrape would have stored it.
    for k in range(30, 0, -1):
        page = parse_page(
            f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {100 * (31 - k)}\n".encode()
        )
        c.store([ScrapeBatch(TARGET, now - timedelta(minutes=k), True, 0.01, page)])
    before = counts(wh)
    assert before["increments"] and before["samples_1m"]
    source.points = with_future_point
    asyncio.run(c.round(None))  # type: ignore[arg-type]  # the Prometheus source fetches nothing itself
    after_attack = counts(wh)
    assert all(after_attack[t] >= before[t] for t in before), (before, after_attack)  # retention took nothing
    through = wh.query_df("SELECT name, through FROM rollup_state")
    assert (through["through"] <= utc_now() + timedelta(minutes=5)).all(), through
    refused = wh.query_df("SELECT target, kind, reason, count FROM rejected WHERE kind = 'prometheus'")
    assert refused.values.tolist() == [["decode-0", "prometheus", "points after this host's clock: refused", 1]]
    assert c.health.refused >= 1
    # Later honest readings are stored, not refused as "at or before the series' last reading".
    c._pulled_until = None  # the next round asks for the latest step again
    source.points = lambda lo, hi, step: [(hi, str(10**6 + hi))]
    asyncio.run(c.round(None))  # type: ignore[arg-type]
    late = wh.query_df("SELECT count(*) AS n FROM rejected WHERE reason LIKE '%at or before%'")["n"][0]
    assert late == 0 and counts(wh)["increments"] > after_attack["increments"]
    assert wh.query_df("SELECT max(ts) AS t FROM scrapes")["t"][0] <= utc_now() + timedelta(seconds=1)
    wh.close()


def test_points_outside_the_window_asked_for_are_refused(source) -> None:
    end = utc_now() - timedelta(minutes=1)
    start = end - timedelta(seconds=10)
    lo = start.replace(tzinfo=UTC).timestamp()
    source.points = lambda a, b, step: [(lo - 3600, "1"), (lo, "2"), (lo + 2, "3"), (float("nan"), "4")]
    pulled = pull_range(http_get(source.url), [TARGET], start, end, 2.0)
    assert [b.ts for b in pulled.batches] == [start, start + timedelta(seconds=2)]
    assert pulled.refused["decode-0"] == {
        "points before the window asked for: refused": 1,
        "points outside the window asked for: refused": 1,
    }


def test_a_long_backfill_is_asked_for_in_pieces(source) -> None:
    end = utc_now() - timedelta(minutes=5)
    start = end - timedelta(seconds=2 * (3 * MAX_STEPS_PER_QUERY - 1))
    pulled = pull_range(http_get(source.url), [TARGET], start, end, 2.0)
    assert len(source.asked) == 3
    assert len(pulled.batches) == 3 * MAX_STEPS_PER_QUERY and not pulled.refused
    assert len({b.ts for b in pulled.batches}) == len(pulled.batches)  # no step twice at a piece's edge


def test_an_answer_over_the_cap_is_refused_before_it_is_parsed(source) -> None:
    source.padding = 2_000_000
    end = utc_now() - timedelta(minutes=1)
    with pytest.raises(PromAPIError, match="over 1,000,000 bytes"):
        pull_range(http_get(source.url, max_bytes=1_000_000), [TARGET], end - timedelta(seconds=4), end, 2.0)


def test_a_piece_over_the_cap_is_asked_for_in_halves(source, monkeypatch) -> None:
    import collectors.promapi

    monkeypatch.setattr(collectors.promapi, "MAX_STEPS_PER_QUERY", 8)
    end = utc_now() - timedelta(minutes=5)
    start = end - timedelta(seconds=2 * 15)
    sizes: list[int] = []
    get = http_get(source.url, max_bytes=100_000)

    def sized(path: str, params: dict[str, str]) -> object:
        if path.endswith("query_range"):
            n = 1 + round((float(params["end"]) - float(params["start"])) / 2)
            sizes.append(n)
            source.padding = 20_000 * n  # the answer grows with the steps asked for: four fit the cap
        return get(path, params)

    pulled = pull_range(sized, [TARGET], start, end, 2.0)
    assert len(pulled.batches) == 16 and not pulled.refused  # every step, once
    assert sizes[0] == 8 and max(sizes[1:]) <= 4, sizes


def test_one_step_over_the_cap_is_refused(source) -> None:
    source.padding = 500_000
    end = utc_now() - timedelta(minutes=1)
    with pytest.raises(PromAPIError, match="over 100,000 bytes"):
        pull_range(http_get(source.url, max_bytes=100_000), [TARGET], end - timedelta(seconds=8), end, 2.0)


@pytest.mark.parametrize("meta", [[1], {"vllm:x": [1]}, {"vllm:x": [{"type": 3}]}, {"vllm:x": "counter"}, "x"])
def test_metadata_that_is_not_the_apis_is_refused_or_left_out(source, meta) -> None:
    end = utc_now() - timedelta(minutes=1)

    def get(path: str, params: dict[str, str]) -> object:
        return meta if path.endswith("metadata") else http_get(source.url)(path, params)

    try:
        pulled = pull_range(get, [TARGET], end - timedelta(seconds=4), end, 2.0)
    except PromAPIError as exc:
        assert "metadata is not an object" in str(exc)
    else:
        assert {s.kind for b in pulled.batches for s in b.samples} == {"unknown"}


def test_a_collector_round_over_the_cap_stores_the_targets_as_down(source, tmp_path, monkeypatch) -> None:
    import collectors.promapi

    monkeypatch.setattr(collectors.promapi, "MAX_ANSWER_BYTES", 100_000)
    (tmp_path / "t.json").write_text(json.dumps([{"name": "decode-0", "url": TARGET.url, "role": "decode", "gpus": 1}]))
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, tmp_path / "t.json", interval=2.0, prometheus=source.url)
    source.padding = 500_000
    asyncio.run(c.round(None))  # type: ignore[arg-type]
    scrapes = wh.query_df("SELECT target, up, error FROM scrapes").values.tolist()
    assert len(scrapes) == 1 and scrapes[0][1] is False and "over 100,000 bytes" in scrapes[0][2]
    assert c.health.ok
    wh.close()
