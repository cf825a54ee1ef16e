"""The banner's alerts on the twin's named faults (tests/dashboard/conftest.py's sick rack): the
alerts judged on the warehouse name the faulty engines and no other (as Prometheus does on the same pack:
tests/integration/test_alert_pack.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from dashboard.data import alerts
from tests.dashboard.sick_rack import LATEST, SATURATED, STRAGGLER, T0

ROOT = Path(__file__).parents[2]


def test_the_twins_faults_fire_on_their_engines_and_nowhere_else(sick):
    fired = alerts.firing(sick, LATEST)
    assert sorted((f.rule, f.subject) for f in fired) == [
        ("DPEngineStraggler", f"decode decode-0 engine {STRAGGLER}"),
        ("KVCacheSaturated", f"decode decode-0 engine {SATURATED}"),
        ("NIXLFailedTransfers", "decode decode-0"),
    ]
    text = alerts.banner(fired)
    assert text.startswith("3 alerts firing") and f"engine {STRAGGLER}" in text


def test_before_the_hold_time_nothing_fires(sick):
    # 4 minutes in: the KV cache and the straggler have not held 5 minutes yet; NIXL counts at once
    fired = alerts.firing(sick, T0 + timedelta(minutes=4))
    assert [f.rule for f in fired] == ["NIXLFailedTransfers"]


def test_every_page_shows_them_on_its_banner(sick_api, monkeypatch):
    from tests.conftest import run_page

    at = run_page(str(ROOT / "dashboard" / "app.py"), sick_api, monkeypatch, timeout=120)
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
