"""The Experts page over the query API, on a warehouse seeded from the twin's plugin data."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_page
from tests.dashboard.test_data_experts import seed
from warehouse.api import QueryServer
from warehouse.db import Warehouse

pytestmark = pytest.mark.integration
PAGE = str(Path(__file__).parents[2] / "dashboard" / "views" / "experts.py")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    wh = Warehouse(tmp_path_factory.mktemp("experts") / "w.duckdb")
    model, _ = wh.write(seed, timeout=300)
    srv = QueryServer(wh)
    srv.start()
    yield srv, model
    srv.shutdown()
    wh.close()


def test_experts_page_shows_hot_spots_rebalances_placement_and_what_if(api, monkeypatch):
    srv, model = api
    at = run_page(PAGE, srv.url, monkeypatch, timeout=120)
    metrics = {m.label: m for m in at.metric}
    assert 0.5 < float(metrics["Balancedness now (mean over layers)"].value) <= 1.0
    assert metrics["Worst layer now"].value.startswith("layer ")
    assert "rank" in metrics["Hottest rank now"].value and "top since" in metrics["Hottest rank now"].delta
    assert "measured" in metrics["Last rebalance"].delta
    current, planned = metrics["Mean balancedness: current → planned"].value.split(" → ")
    assert float(planned) >= float(current)
    charts = at.get("plotly_chart")
    assert len(charts) == 6  # expert and rank heatmaps, balancedness x2, placement, what-if
    assert len(at.dataframe[1].value) == len(model.experts.state.rebalances)  # the rebalances table
    # Choosing more redundant experts re-plans.
    at.slider(key="redundant").set_value(128).run()
    assert not at.exception
    assert at.get("download_button")


def test_experts_page_without_expert_data_says_where_it_comes_from(empty_api, monkeypatch):
    at = run_page(PAGE, empty_api, monkeypatch)
    assert "moemeter plugin" in at.info[0].value
