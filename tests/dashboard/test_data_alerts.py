"""The banner's alerts on the twin's named faults: a straggler, failing NIXL transfers and a full
KV cache on three decode engines, scraped every 10 s for 8 minutes into a real warehouse; the
alerts judged there name those engines and no other (as Prometheus does on the same pack:
tests/integration/test_alert_pack.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from collectors.parse import parse_page
from dashboard.data import alerts
from moemeter.contract import TargetInfo
from stack.twin.config import load_profile
from stack.twin.faults import Fault
from stack.twin.server import Twin
from warehouse.api import LocalQuery
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch

ROOT = Path(__file__).parents[2]
T0 = datetime(2026, 11, 30, 12, 0, 0)
START = 1_000_000.0  # twin epoch seconds at T0
STRAGGLER, FAILING, SATURATED = "7", "5", "3"
FAULTS = (f"straggler:decode-0:{STRAGGLER}", f"nixl-failures:decode-0:{FAILING}", f"kv-saturated:decode-0:{SATURATED}")
ROUNDS = 49  # 8 minutes of scrapes every 10 s


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    wh = Warehouse(tmp_path_factory.mktemp("alerts") / "w.duckdb")
    faults = tuple(map(Fault.parse, FAULTS))
    twin = Twin(
        load_profile("deepseek-v4.1-flash"), seed=6, start=START - 60, tick=0.5, faults=faults
    )  # 0.5 s ticks: 5x faster
    twin.pages(START)  # builds the model
    assert twin.model is not None
    decode = [e for e in twin.endpoints() if e.role == "decode"]  # the faults' pool, its median the decode pool's
    ing = Ingestor()
    for k in range(ROUNDS):
        twin.model.advance(START + 10 * k)
        for e in decode:
            t = TargetInfo(e.name, f"http://twin/{e.name}", e.role, e.gpus, "twin:test", e.hostname)
            batch = ScrapeBatch(t, T0 + timedelta(seconds=10 * k), True, 0.01, parse_page(e.render().encode()))
            wh.write(lambda con, b=batch: ing.write(con, b))
    yield wh
    wh.close()


@pytest.fixture(scope="module")
def faulty(warehouse):
    return LocalQuery(warehouse.cursor())


def test_the_twins_faults_fire_on_their_engines_and_nowhere_else(faulty):
    fired = alerts.firing(faulty, T0 + timedelta(seconds=10 * (ROUNDS - 1)))
    assert sorted((f.rule, f.subject) for f in fired) == [
        ("DPEngineStraggler", f"decode decode-0 engine {STRAGGLER}"),
        ("KVCacheSaturated", f"decode decode-0 engine {SATURATED}"),
        ("NIXLFailedTransfers", "decode decode-0"),
    ]
    text = alerts.banner(fired)
    assert text.startswith("3 alerts firing") and f"engine {STRAGGLER}" in text


def test_before_the_hold_time_nothing_fires(faulty):
    # 4 minutes in: the KV cache and the straggler have not held 5 minutes yet; NIXL counts at once
    fired = alerts.firing(faulty, T0 + timedelta(minutes=4))
    assert [f.rule for f in fired] == ["NIXLFailedTransfers"]


def test_every_page_shows_them_on_its_banner(warehouse, monkeypatch):
    from tests.conftest import run_page
    from warehouse.api import QueryServer

    api = QueryServer(warehouse)
    api.start()
    try:
        at = run_page(str(ROOT / "dashboard" / "app.py"), api.url, monkeypatch, timeout=120)
    finally:
        api.shutdown()
    [banner] = [w.value for w in at.warning if "alerts firing" in w.value]
    assert banner.startswith("3 alerts firing")
    for subject in (f"engine {STRAGGLER}", f"engine {SATURATED}", "NIXLFailedTransfers"):
        assert subject in banner


def test_with_the_api_down_the_page_says_so_and_the_banner_does_not_break_it(monkeypatch):
    from tests.conftest import run_page
    from tests.e2e.test_browser import free_port

    at = run_page(str(ROOT / "dashboard" / "app.py"), f"http://127.0.0.1:{free_port()}", monkeypatch)
    assert any("Cannot reach the warehouse query API" in e.value for e in at.error)
    assert not [w for w in at.warning if "alerts firing" in w.value]
