"""The warehouse fed from a real Prometheus server (Debian's prometheus) scraping the twin,
through /api/v1/query_range: the same series, values and kinds as a direct scrape."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from collectors.parse import parse_page
from collectors.promapi import PromAPIError, family_of, http_get, pull_range
from collectors.targets import load_targets
from moemeter.cli import main
from stack.ready import scaled
from stack.twin.server import write_targets
from tests.e2e.test_browser import free_port, wait_http

pytestmark = pytest.mark.integration
PROMETHEUS = shutil.which("prometheus")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("needs Debian's prometheus package (make test installs it)")
    tmp = tmp_path_factory.mktemp("prom")
    # The twin in its own process, as in production: parsing 4 MB pages in this process must
    # not starve the pages Prometheus scrapes.
    twin = subprocess.Popen(
        [sys.executable, "-m", "moemeter.cli", "twin", "--seed", "6", "--targets-out", str(tmp / "all.json")],
        stdout=subprocess.DEVNULL,
    )
    procs = [twin]
    try:
        yield from _with_prometheus(twin, tmp, procs)
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)


def _with_prometheus(twin: subprocess.Popen, tmp, procs: list[subprocess.Popen]):
    # The twin publishes its targets once its simulation has caught up with the clock: 31 s on an idle
    # 2-core machine, twice that and more beside other work.
    within = scaled(180)
    deadline = time.monotonic() + within
    while not (tmp / "all.json").exists() and twin.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp / "all.json").exists(), f"the twin did not publish its targets within {within:g} s (exit {twin.poll()})"
    all_targets = json.loads((tmp / "all.json").read_text())
    chosen = [t for t in all_targets if t["name"] in ("decode-0", "prefill-0", "gpu-tray-03")]
    write_targets(chosen, tmp / "targets.json")
    assert main(["rules", "--out", str(tmp / "rules.yml")]) == 0  # the alert pack, evaluated by the real server
    targets = [str(t["url"]).split("//")[1].split("/")[0] for t in chosen]
    scrape = {"job_name": "moemeter-twin", "static_configs": [{"targets": targets}]}
    url = start_prometheus(tmp, [scrape], procs)
    wait_for_scrapes(url, len(chosen), 5, scaled(180))
    yield url, tmp / "targets.json", tmp


def start_twin(tmp, procs: list[subprocess.Popen], *args: str) -> list[dict]:
    """The twin in its own process (added to `procs`, for the caller to stop), until it publishes
    its targets: their entries."""
    twin = subprocess.Popen(
        [sys.executable, "-m", "moemeter.cli", "twin", *args, "--targets-out", str(tmp / "all.json")],
        stdout=subprocess.DEVNULL,
    )
    procs.append(twin)
    within = scaled(180)  # it publishes once its simulation has caught up with the clock
    deadline = time.monotonic() + within
    while not (tmp / "all.json").exists() and twin.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (tmp / "all.json").exists(), f"the twin did not publish its targets within {within:g} s (exit {twin.poll()})"
    return json.loads((tmp / "all.json").read_text())


def start_prometheus(tmp, scrape_configs: list[dict], procs: list[subprocess.Popen]) -> str:
    """Debian's Prometheus on a free loopback port, the alert pack in tmp/rules.yml loaded, until
    it is ready; its address. Added to `procs` for the caller to stop."""
    (tmp / "prometheus.yml").write_text(
        json.dumps(
            {
                # 5 s to render a 4 MB decode page: 2 s timed out on a 2-core machine with both cores
                # taken (the busy-core clean-clone run of 9f954b7 beside a dashboard in Chromium)
                "global": {"scrape_interval": "5s", "scrape_timeout": "5s", "evaluation_interval": "5s"},
                "rule_files": [str(tmp / "rules.yml")],
                "scrape_configs": scrape_configs,
            }
        )
    )  # JSON is YAML
    port = free_port()
    procs.append(
        subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/-/ready", scaled(30))
    return url


def target_health(url: str) -> dict[str, tuple[str, str, float]]:
    return {
        t["labels"]["instance"]: (t["health"], t["lastError"], t["lastScrapeDuration"])
        for t in httpx.get(url + "/api/v1/targets").json()["data"]["activeTargets"]
    }


def wait_for_scrapes(url: str, targets: int, scrapes: int, within: float = 120.0) -> None:
    """Until Prometheus holds `scrapes` successful scrapes of every target and the types of the
    families the tests read; fails with the targets' health when it does not."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        ups = httpx.get(url + "/api/v1/query", params={"query": "sum_over_time(up[1m])"}).json()["data"]["result"]
        meta = httpx.get(url + "/api/v1/metadata", params={"metric": "vllm:generation_tokens"}).json()["data"]
        meta = (
            meta
            or httpx.get(url + "/api/v1/metadata", params={"metric": "vllm:generation_tokens_total"}).json()["data"]
        )
        if len(ups) == targets and all(float(r["value"][1]) >= scrapes for r in ups) and meta:
            return
        time.sleep(1)
    pytest.fail(f"Prometheus has not scraped every target {scrapes} times in {within:.0f} s: {target_health(url)}")


def differences(left: set, right: set) -> str:
    """A short account of two sets that should be equal (pytest's full diff of 36k series is useless)."""
    only_left, only_right = sorted(left - right), sorted(right - left)
    return f"{len(only_left)} only left, e.g. {only_left[:3]}; {len(only_right)} only right, e.g. {only_right[:3]}"


def test_query_range_gives_the_same_series_and_kinds_as_a_scrape(prometheus):
    url, targets_file, _ = prometheus
    targets = load_targets(targets_file)
    end = datetime.now(UTC).replace(tzinfo=None)
    batches = pull_range(http_get(url), targets, end - timedelta(seconds=8), end, 2.0).batches
    decode = [b for b in batches if b.target.name == "decode-0"]
    assert len(decode) >= 3, target_health(url)
    # The hottest experts' labels change from one step window to the next; all else is fixed.
    got = {(s.name, s.labels): s.kind for s in decode[-1].samples if s.name != "moemeter_expert_hot_share"}
    direct = parse_page(httpx.get(str(next(t for t in targets if t.name == "decode-0").url)).content)
    expected = {
        (s.name, s.labels): s.kind
        for s in direct
        if s.name.startswith(("vllm:", "moemeter_")) and s.name != "moemeter_expert_hot_share"
    }
    assert set(got) == set(expected), differences(set(got), set(expected)) + f"; {target_health(url)}"
    assert {k: v for k, v in got.items() if v != expected[k]} == {}  # the same types from metadata
    gpu = [b for b in batches if b.target.name == "gpu-tray-03"][-1]
    assert {s.labels for s in gpu.samples if s.name == "DCGM_FI_DEV_GPU_UTIL"} == {
        s.labels
        for s in parse_page(httpx.get(str(next(t for t in targets if t.name == "gpu-tray-03").url)).content)
        if s.name == "DCGM_FI_DEV_GPU_UTIL"
    }


def test_pull_backfills_the_warehouse_and_counts_increases(prometheus, capsys):
    url, targets_file, tmp = prometheus
    db = tmp / "pulled.duckdb"
    end = datetime.now(UTC).replace(tzinfo=None)
    assert (
        main(
            [
                "pull",
                "--prometheus",
                url,
                "--targets",
                str(targets_file),
                "--db",
                str(db),
                "--from",
                (end - timedelta(seconds=8)).isoformat(),
                "--to",
                end.isoformat(),
                "--step",
                "2",
            ]
        )
        == 0
    )
    assert "pulled" in capsys.readouterr().out
    assert (
        main(
            [
                "query",
                "--db",
                str(db),
                "--json",
                """SELECT count(*) AS n, min(i.delta) AS low FROM increments i
                 JOIN series s USING (series_id) WHERE s.metric = 'vllm:generation_tokens_total'""",
            ]
        )
        == 0
    )
    row = json.loads(capsys.readouterr().out)[0]
    assert row["n"] >= 64 * 3 and row["low"] >= 0, (row, target_health(url))  # 64 engines, three intervals each


def test_the_real_server_evaluates_every_rule_of_the_pack(prometheus):
    """promtool's unit tests hold the rules to hand-made series; here Prometheus evaluates them on
    the twin's real pages: no rule errors, and the per-engine recording rules have the engines."""
    url, targets_file, _ = prometheus
    within = scaled(120)
    deadline = time.monotonic() + within
    while True:
        groups = httpx.get(url + "/api/v1/rules").json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(not r["lastEvaluation"].startswith("0001") for r in rules):
            break
        assert time.monotonic() < deadline, f"Prometheus has not evaluated every rule within {within:g} s"
        time.sleep(1)
    assert {g["name"] for g in groups} == {"moemeter-slo", "moemeter-engines", "moemeter-targets", "moemeter-eplb"}
    assert [(r["name"], r["lastError"]) for r in rules if r["health"] != "ok"] == []
    engines = {f"{t.url.split('//')[1].split('/')[0]}" for t in load_targets(targets_file) if t.role != "gpu"}
    # (the waiting queue's 2-min mean waits for 2 minutes of scrapes: the alert pack's test reads it)
    steps = httpx.get(url + "/api/v1/query", params={"query": "moemeter:engine_steps:increase5m"}).json()["data"]
    assert {r["metric"]["instance"] for r in steps["result"]} == engines


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
    dup = wh.query_df("SELECT count(*) AS n FROM (SELECT ts, series_id FROM readings GROUP BY ALL HAVING count(*) > 1)")
    assert dup["n"][0] == 0  # consecutive rounds ask for consecutive evaluation points, never twice
    inc = wh.query_df("""SELECT count(*) AS n FROM increments i JOIN series s USING (series_id)
                         WHERE s.metric = 'vllm:generation_tokens_total'""")
    assert inc["n"][0] >= 64
    wh.close()
    down = Collector(Warehouse(tmp_path / "d.duckdb"), targets_file, interval=2.0, prometheus="http://127.0.0.1:9")
    down._pulled_until = None
    batches = down._pull(down.refresh_targets())
    assert batches and all(not b.up and "prometheus API" in b.error for b in batches)
    down.warehouse.close()
