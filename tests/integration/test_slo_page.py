"""The SLO page shows the numbers `moemeter report slo` gives (AppTest over the query API, on the
hand-computed records of tests/warehouse/test_goodput.py), and pages on a fast burn."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_page
from tests.warehouse.test_goodput import RECORDS, record, warehouse
from warehouse.api import QueryServer
from warehouse.db import Warehouse

pytestmark = pytest.mark.integration
PAGE = str(Path(__file__).parents[2] / "dashboard" / "views" / "slo.py")


def serve(tmp_path: Path, **kw):  # type: ignore[no-untyped-def]
    db = tmp_path / "w.duckdb"
    warehouse(path=str(db), **kw).close()
    wh = Warehouse(db)
    srv = QueryServer(wh)
    srv.start()
    return srv, wh


@pytest.fixture
def api(tmp_path):
    srv, wh = serve(tmp_path)
    yield srv.url
    srv.shutdown()
    wh.close()


def metric(at, label: str) -> str:  # type: ignore[no-untyped-def]
    return next(m.value for m in at.metric if m.label == label)


def test_the_page_shows_the_reports_numbers(api, monkeypatch) -> None:
    at = run_page(PAGE, api, monkeypatch)
    at.segmented_control(key="slo_range").set_value("6h").run()
    assert not at.exception, at.exception
    # 6 h up to the last request (14:40): chat holds 9, 1..7 and 10 (8 went away): 5 met; batch 1 of 2
    assert metric(at, "Attainment") == "54.55%"
    assert metric(at, "Burning") == "none"
    classes = at.dataframe[0].value
    assert list(classes["class"]) == ["batch", "chat"]
    assert list(classes["requests"]) == [2, 9] and list(classes["met"]) == [1, 5]
    # the hour up to and including 14:40 starts a microsecond after 13:40: 6, 7 (failed) and 10
    assert classes["burn_1h"].iloc[1] == pytest.approx(1 / 3 / 0.1)
    tenants = at.dataframe[1].value
    assert list(zip(tenants["class"], tenants["tenant"])) == [("batch", "acme"), ("chat", "acme"), ("chat", "other")]
    assert not at.error  # nothing burning fast


def test_a_fast_burn_pages_on_the_banner(tmp_path, monkeypatch) -> None:
    """The default sheet (99% within 2.5 s TTFT): every request of the last hour missed, burn 100x."""
    late = [record(100 + i, "bob", f"14:{i:02d}", ttft_seconds=3.0) for i in range(0, 40, 4)]
    srv, wh = serve(tmp_path, records=RECORDS[:2] + late, sheet=None)
    try:
        at = run_page(PAGE, srv.url, monkeypatch)
        assert metric(at, "Burning") == "interactive"
        assert "interactive: burning its error budget fast (100.0x over 1 h" in at.error[0].value
    finally:
        srv.shutdown()
        wh.close()
