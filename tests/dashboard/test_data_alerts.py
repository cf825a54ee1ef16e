"""The banner's alerts on the twin's named faults (tests/dashboard/conftest.py's sick rack): the
alerts judged on the warehouse name the faulty engines and no other (as Prometheus does on the same pack:
tests/integration/test_alert_pack.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from dashboard.data import alerts
from tests.dashboard.sick_rack import COLLAPSED, LATEST, SATURATED, STRAGGLER, T0

ROOT = Path(__file__).parents[2]


def test_the_twins_faults_fire_on_their_engines_and_nowhere_else(sick):
    fired = alerts.firing(sick, LATEST)
    assert sorted((f.rule, f.subject) for f in fired) == [
        ("DPEngineStraggler", f"decode decode-0 engine {STRAGGLER}"),
        ("EnginePreempting", f"decode decode-0 engine {SATURATED}"),
        ("KVCacheSaturated", f"decode decode-0 engine {SATURATED}"),
        ("NIXLFailedTransfers", "decode decode-0"),
        ("SpecAcceptanceLow", f"decode decode-0 engine {COLLAPSED}"),
    ]
    text = alerts.banner(fired)
    assert text.startswith("5 alerts firing") and f"engine {STRAGGLER}" in text


def test_before_the_hold_time_nothing_fires(sick):
    # 4 minutes in: the KV cache, the preemptions, the straggler and the collapsed draft path have not
    # held 5 minutes yet; NIXL counts at once
    fired = alerts.firing(sick, T0 + timedelta(minutes=4))
    assert [f.rule for f in fired] == ["NIXLFailedTransfers"]


def test_every_page_shows_them_on_its_banner(sick_api, monkeypatch):
    from tests.conftest import run_page

    at = run_page(str(ROOT / "dashboard" / "app.py"), sick_api, monkeypatch, timeout=120)
    [banner] = [w.value for w in at.warning if "alerts firing" in w.value]
    assert banner.startswith("5 alerts firing")
    for subject in (
        f"engine {STRAGGLER}",
        f"engine {SATURATED}",
        "EnginePreempting",
        "NIXLFailedTransfers",
        "SpecAcceptanceLow",
    ):
        assert subject in banner


def test_with_the_api_down_the_page_says_so_and_the_banner_does_not_break_it(monkeypatch):
    from tests.conftest import run_page
    from tests.e2e.test_browser import free_port

    at = run_page(str(ROOT / "dashboard" / "app.py"), f"http://127.0.0.1:{free_port()}", monkeypatch)
    assert any("Cannot reach the warehouse query API" in e.value for e in at.error)
    assert not [w for w in at.warning if "alerts firing" in w.value]


BURNING_SHEET = """
name = "burn"

[[class]]
name = "standard"
effective = "2026-11-01T00:00:00Z"
default = true
ttft_ms = 1000
objective = 0.99
period_days = 30
"""


def test_a_class_burning_its_budget_fires_with_the_reports_burn_rate():
    """One request a minute for 70 minutes up to 14:30, the last 60 over the class's 1 s TTFT: the
    1 h burn is 60 / 60 / 1% = 100x, 6 h 60 / 70 / 1% = 85.7x; the report's burn rates, read through
    its own statements, are the referee."""
    from tests.warehouse.test_goodput import DAY, record, warehouse
    from warehouse.api import LocalQuery
    from warehouse.goodput import slo_report
    from warehouse.requests import RequestIngestor
    from warehouse.rollup import Rollups

    latest = DAY.replace(hour=14, minute=30)
    finished = [latest - timedelta(minutes=70 - k) + timedelta(seconds=30) for k in range(70)]
    records = [record(k, "bob", "00:00", ttft_seconds=1.5 if k >= 10 else 0.5) for k in range(70)]
    for r, at in zip(records, finished):  # started e2e seconds before it finished
        r["started_at"] = (at - datetime(1970, 1, 1)).total_seconds() - float(r["e2e_seconds"])
    q = LocalQuery(warehouse(records, sheet=BURNING_SHEET))
    fired = alerts.burning(q, latest)
    assert [(f.rule, f.subject) for f in fired] == [
        ("MoemeterSLOFastBurn", "class standard"),
        ("MoemeterSLOSlowBurn", "class standard"),
    ]
    [row] = slo_report(q, latest - timedelta(hours=2), latest, pools={"prefill": [], "decode": []}).as_json()["rows"]
    assert fired[0].value == pytest.approx(row["burn_1h"]) == pytest.approx(100.0)
    assert fired[1].value == pytest.approx(row["burn_6h"]) == pytest.approx(6000 / 70)
    assert "a 30-day budget lasts 0.3 days" in fired[0].message
    # the same traffic meeting its targets burns nothing
    met = [r | {"ttft_seconds": 0.5} for r in records]
    assert alerts.burning(LocalQuery(warehouse(met, sheet=BURNING_SHEET)), latest) == []
    # the first 40 records rolled up into the per-minute counts, the other 30 stored after the
    # roll-up: the same judgement from both halves
    con = warehouse(records[:40], sheet=BURNING_SHEET)
    Rollups().advance(con, DAY.replace(hour=15, minute=1))
    assert con.execute("SELECT sum(held) FROM requests_slo_1m").fetchall() == [(40,)]
    page = {
        "schema": "moemeter.requests/1",
        "log_id": "gw",
        "records": [r | {"seq": 41 + i} for i, r in enumerate(records[40:])],
    }
    RequestIngestor().write(con, "gw", page, DAY.replace(hour=15, minute=2))
    split = alerts.burning(LocalQuery(con), latest)
    assert [(f.rule, f.value, f.since) for f in split] == [(f.rule, f.value, f.since) for f in fired]


@pytest.mark.slow("25 hours of real pages every 10 minutes, and the cost report over them")
def test_a_pools_cost_per_token_spike_fires_with_the_cost_reports_figure(tmp_path):
    """Real vLLM 0.32 pages every 10 min for 25 h (tests/warehouse/conftest.py sets their counters):
    the decode pool (4 GPUs) generates 600,000 tokens per 10 min, then 120,000 for the last 2 hours;
    the prefill pool computes 600,000 prompt tokens per 10 min throughout. The last hour's decode
    $/M is 4 x $38.96 / 0.72 M = $216.44; the day's is 96 GPU-hours x $38.96 / (132 x 0.6 M + 12 x
    0.12 M) = $46.38: 4.7x. `moemeter report cost` over the hour is the referee."""
    from collectors.parse import parse_page
    from moemeter.contract import TargetInfo
    from tests.warehouse.conftest import page
    from warehouse.api import LocalQuery
    from warehouse.cost import cost_report, stored_pools
    from warehouse.db import Warehouse
    from warehouse.ingest import Ingestor, ScrapeBatch

    latest = datetime(2026, 11, 30, 12, 0)
    wh = Warehouse(tmp_path / "w.duckdb")
    ingestor = Ingestor()
    generated = prompt = 0.0
    for k in range(151):
        at = latest - timedelta(minutes=10 * (150 - k))
        if k:
            generated += 120_000 if at > latest - timedelta(hours=2) else 600_000
            prompt += 600_000
        pages = (
            ("prefill", 2, "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt", {"vllm:prompt_tokens_total": prompt}),
            ("decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", {"vllm:generation_tokens_total": generated}),
        )
        for role, gpus, capture, values in pages:
            body = page(capture, values).encode()
            target = TargetInfo(f"{role}-0", f"file://{capture}", role, gpus, None)
            batch = ScrapeBatch(target, at, True, 0.0, parse_page(body, "text/plain"), bytes=len(body))
            wh.write(lambda con, batch=batch: ingestor.write(con, batch))
    q = LocalQuery(wh.cursor())
    [spike] = alerts.cost_spikes(q, latest)
    hour = latest - timedelta(hours=1)
    referee = cost_report(q, stored_pools(q, hour, latest), hour, latest).as_json()["pools"]["decode"]
    assert (spike.rule, spike.subject) == ("CostPerTokenSpike", "decode")
    assert spike.value == pytest.approx(referee["usd_per_mtok_output"], abs=0.005) == pytest.approx(216.44, abs=0.005)
    assert "4.7x its 24-hour $46.38" in spike.message
    # judged 3 minutes after the last scrape of either pool: both absent since then
    later = alerts.firing(q, latest + timedelta(minutes=3))
    assert [(f.subject, f.since) for f in later if f.rule == "PoolAbsent"] == [("decode", latest), ("prefill", latest)]
    wh.close()
