"""The warehouse fed from a real Prometheus server (Debian's prometheus) scraping the twin,
through /api/v1/query_range: the same series, values and kinds as a direct scrape."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from collectors.parse import parse_page
from collectors.promapi import PromAPIError, family_of, http_get, pull_range
from collectors.targets import load_targets
from moemeter.cli import main
from stack.twin.config import load_profile
from stack.twin.server import Twin, write_targets
from tests.e2e.test_browser import free_port, wait_http

pytestmark = pytest.mark.integration
PROMETHEUS = shutil.which("prometheus")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("needs Debian's prometheus package (make test installs it)")
    tmp = tmp_path_factory.mktemp("prom")
    twin = Twin(load_profile("deepseek-v4.1-flash"), seed=6)
    all_targets = twin.serve()
    chosen = [t for t in all_targets if t["name"] in ("decode-0", "prefill-0", "gpu-tray-03")]
    write_targets(chosen, tmp / "targets.json")
    port = free_port()
    (tmp / "prometheus.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "2s", "scrape_timeout": "1900ms"},
                "scrape_configs": [
                    {
                        "job_name": "moemeter-twin",
                        "static_configs": [{"targets": [str(t["url"]).split("//")[1].split("/")[0] for t in chosen]}],
                    }
                ],
            }
        )
    )  # fmt: skip  (JSON is YAML)
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/-/ready", 30)
        deadline = time.monotonic() + 60  # until Prometheus holds five scrapes of the decode instance
        while time.monotonic() < deadline:
            r = httpx.get(url + "/api/v1/query", params={
                "query": 'count_over_time(vllm:generation_tokens_total{engine="0"}[1m])'}).json()["data"]["result"]  # fmt: skip
            if r and float(r[0]["value"][1]) >= 5:
                break
            time.sleep(1)
        yield url, tmp / "targets.json", tmp
    finally:
        proc.terminate()
        proc.wait(20)
        twin.close()


def test_query_range_gives_the_same_series_and_kinds_as_a_scrape(prometheus):
    url, targets_file, _ = prometheus
    targets = load_targets(targets_file)
    end = datetime.now(UTC).replace(tzinfo=None)
    batches = pull_range(http_get(url), targets, end - timedelta(seconds=8), end, 2.0)
    decode = [b for b in batches if b.target.name == "decode-0"]
    health = {t["labels"]["instance"]: (t["health"], t["lastError"])
              for t in httpx.get(url + "/api/v1/targets").json()["data"]["activeTargets"]}  # fmt: skip
    assert len(decode) >= 3, health
    got = {(s.name, s.labels): s.kind for s in decode[-1].samples}
    direct = parse_page(httpx.get(str(next(t for t in targets if t.name == "decode-0").url)).content)
    expected = {(s.name, s.labels): s.kind for s in direct if s.name.startswith(("vllm:", "moemeter_"))}
    assert set(got) == set(expected)  # every series, none made up
    assert {k: v for k, v in got.items() if v != expected[k]} == {}  # the same types from metadata
    gpu = [b for b in batches if b.target.name == "gpu-tray-03"][-1]
    assert {s.labels for s in gpu.samples if s.name == "DCGM_FI_DEV_GPU_UTIL"} == {
        s.labels for s in parse_page(httpx.get(str(next(t for t in targets if t.name == "gpu-tray-03").url)).content)
        if s.name == "DCGM_FI_DEV_GPU_UTIL"}  # fmt: skip


def test_pull_backfills_the_warehouse_and_counts_increases(prometheus, capsys):
    url, targets_file, tmp = prometheus
    db = tmp / "pulled.duckdb"
    end = datetime.now(UTC).replace(tzinfo=None)
    assert main(["pull", "--prometheus", url, "--targets", str(targets_file), "--db", str(db),
                 "--from", (end - timedelta(seconds=8)).isoformat(), "--to", end.isoformat(), "--step", "2"]) == 0  # fmt: skip
    assert "pulled" in capsys.readouterr().out
    assert main(["query", "--db", str(db), "--json", """SELECT count(*) AS n, min(i.delta) AS low FROM increments i
                 JOIN series s USING (series_id) WHERE s.metric = 'vllm:generation_tokens_total'"""]) == 0  # fmt: skip
    row = json.loads(capsys.readouterr().out)[0]
    assert row["n"] >= 64 * 3 and row["low"] >= 0  # 64 engines, at least three intervals each


def test_api_errors_are_clear():
    with pytest.raises(PromAPIError, match="ConnectError"):
        http_get("http://127.0.0.1:9")("/api/v1/metadata", {})
    assert family_of("vllm:x_seconds_bucket", {"vllm:x_seconds": "histogram"}) == ("vllm:x_seconds", "histogram")
    assert family_of("vllm:a_total", {"vllm:a_total": "counter"}) == ("vllm:a_total", "counter")
    assert family_of("other", {}) == ("other", "unknown")


def test_serve_reads_continuously_from_the_api_instead_of_scraping(prometheus, tmp_path):
    import asyncio

    from collectors.service import Collector
    from warehouse.db import Warehouse

    url, targets_file, _ = prometheus
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, targets_file, interval=2.0, prometheus=url)

    async def rounds() -> None:
        for i in range(3):
            if i:
                await asyncio.sleep(2.0)
            await c.round(None)  # type: ignore[arg-type]  # no scraping in this mode

    asyncio.run(rounds())
    scrapes = wh.query_df(
        "SELECT target, count(*) AS n, bool_and(up) AS up FROM scrapes GROUP BY target ORDER BY target"
    )
    assert scrapes["target"].tolist() == ["decode-0", "gpu-tray-03", "prefill-0"] and scrapes["up"].all()
    dup = wh.query_df("SELECT count(*) AS n FROM (SELECT ts, series_id FROM samples GROUP BY ALL HAVING count(*) > 1)")
    assert dup["n"][0] == 0  # consecutive rounds ask for consecutive evaluation points, never twice
    inc = wh.query_df("""SELECT count(*) AS n FROM increments i JOIN series s USING (series_id)
                         WHERE s.metric = 'vllm:generation_tokens_total'""")  # fmt: skip
    assert inc["n"][0] >= 64
    wh.close()
    down = Collector(Warehouse(tmp_path / "d.duckdb"), targets_file, interval=2.0, prometheus="http://127.0.0.1:9")
    down._pulled_until = None
    batches = down._pull(down.refresh_targets())
    assert batches and all(not b.up and "prometheus API" in b.error for b in batches)
    down.warehouse.close()
