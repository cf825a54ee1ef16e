"""The Fleet page over a real DuckLake (a DuckDB-file catalog here; tests/integration/test_fleet.py
runs PostgreSQL's): the sick twin rack published as two racks. Its numbers must be the rack's own:
the same functions over the rack's warehouse give the same row."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from dashboard.data import fleet
from tests.conftest import run_page
from warehouse.api import LocalQuery
from warehouse.lake import Publisher, connect, open_reader, watermarks

ROOT = Path(__file__).parents[2]
RACKS = ("rack-a", "rack-b")


@pytest.fixture(scope="module")
def lake(sick_rack, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    uri, data = f"ducklake:{tmp / 'catalog.ducklake'}", str(tmp / "files")
    con = connect(uri, data)
    try:
        with sick_rack.cursor() as local:
            for rack in RACKS:
                assert Publisher(con, rack).catch_up(local)
    finally:
        con.close()
    return uri, data


def lines(lake, sick) -> tuple[pd.DataFrame, fleet.FleetWindow]:
    uri, data = lake
    with open_reader(uri, data_path=data) as con:
        marks = watermarks(con)
    w = fleet.FleetWindow.ending(marks, pd.Timedelta(minutes=6).to_pytimedelta())
    assert w is not None
    readers = {rack: open_reader(uri, rack, data) for rack in RACKS}
    try:
        got = fleet.fleet_lines(
            {"own": sick, **{r: LocalQuery(c) for r, c in readers.items()}},
            w.start,
            w.end,
        )
    finally:
        for c in readers.values():
            c.close()
    return got, w


def test_each_racks_line_is_the_racks_own(lake, sick):
    got, _ = lines(lake, sick)
    own = got.iloc[0].drop("rack")
    for i, rack in enumerate(RACKS, start=1):
        row = got.iloc[i]
        assert row["rack"] == rack
        for col, v in own.items():
            if isinstance(v, str):
                assert row[col] == v, col
            else:
                assert (math.isnan(v) and math.isnan(row[col])) or row[col] == pytest.approx(v, rel=1e-12), col
    assert own["cost_usd"] > 0 and own["tokens_per_second_per_gpu"] > 0 and own["gpus"] > 0
    assert 0 < own["worst_balancedness"] <= 1  # the twin's decode instance exports its rank loads
    assert math.isnan(own["p90_user_tokens_per_second"])  # 6 minutes hold no closed hour


BURNS = "MoemeterSLOFastBurn (standard), MoemeterSLOSlowBurn (standard)"


def burning_lake(tmp_path) -> tuple[tuple[str, str], duckdb.DuckDBPyConnection]:
    """The burning class of tests/dashboard/test_data_alerts.py (70 requests a minute apart, the
    last 60 over their 1 s TTFT), here up to 15:00, rolled up into the per-minute SLO counts by
    15:01 and published as rack "burning": the lake and the rack's own file."""
    from tests.dashboard.test_data_alerts import BURNING_SHEET
    from tests.warehouse.test_goodput import DAY, record, warehouse
    from warehouse.rollup import Rollups

    latest = DAY.replace(hour=15)
    finished = [latest - timedelta(minutes=70 - k) + timedelta(seconds=30) for k in range(70)]
    records = [record(k, "bob", "00:00", ttft_seconds=1.5 if k >= 10 else 0.5) for k in range(70)]
    for r, at in zip(records, finished):
        r["started_at"] = (at - datetime(1970, 1, 1)).total_seconds() - float(r["e2e_seconds"])
    local = warehouse(records, sheet=BURNING_SHEET)
    Rollups().advance(local, latest + timedelta(minutes=1))
    uri, data = f"ducklake:{tmp_path / 'catalog.ducklake'}", str(tmp_path / "files")
    con = connect(uri, data)
    try:
        assert Publisher(con, "burning").catch_up(local)
    finally:
        con.close()
    return (uri, data), local


def test_a_rack_burning_its_slo_budget_says_so_as_its_own_banner_does(tmp_path):
    (uri, data), local = burning_lake(tmp_path)
    with open_reader(uri, data_path=data) as con:
        w = fleet.FleetWindow.ending(watermarks(con), timedelta(hours=1))
    assert w is not None
    with open_reader(uri, "burning", data) as reader:
        got = fleet.fleet_lines({"own": LocalQuery(local), "burning": LocalQuery(reader)}, w.start, w.end)
    assert list(got["slo_alerts"]) == [BURNS, BURNS]


def test_the_page_names_the_racks_burning_their_budget_above_the_table(tmp_path, monkeypatch, empty_api):
    (uri, data), _ = burning_lake(tmp_path)
    monkeypatch.setenv("MOEMETER_LAKE", uri)
    monkeypatch.setenv("MOEMETER_LAKE_DATA", data)
    at = run_page(str(ROOT / "dashboard" / "views" / "fleet.py"), empty_api, monkeypatch, timeout=120)
    assert not at.exception, at.exception
    [burning] = [w.value for w in at.warning if "SLO error budgets burning" in w.value]
    assert burning.endswith(f"**burning**: {BURNS}")
    assert at.dataframe[0].value["slo_alerts"].tolist() == [BURNS]


def test_the_fleet_page_shows_every_rack_and_their_sum(lake, sick, monkeypatch, empty_api):
    uri, data = lake
    monkeypatch.setenv("MOEMETER_LAKE", uri)
    monkeypatch.setenv("MOEMETER_LAKE_DATA", data)
    at = run_page(str(ROOT / "dashboard" / "views" / "fleet.py"), empty_api, monkeypatch, timeout=120)
    at.segmented_control(key="fleet_span").set_value("1h").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["rack"]) == list(RACKS)
    cost = {m.label: m.value for m in at.metric}["Fleet cost"]
    assert cost == f"${table['cost_usd'].sum():,.2f}"
    assert table["cost_usd"].iloc[0] == table["cost_usd"].iloc[1] > 0
    assert not [w for w in at.warning if "SLO error budgets burning" in w.value]  # the sick rack has no requests


def test_a_racks_experts_page_says_which_range_the_lake_holds_per_expert_load_for(lake, monkeypatch, empty_api):
    """The lake holds expert snapshots by the hour only: a rack's Experts page over 1 h has none,
    and says where they are (not that the collectors took too few)."""
    from streamlit.testing.v1 import AppTest

    uri, data = lake
    monkeypatch.setenv("MOEMETER_LAKE", uri)
    monkeypatch.setenv("MOEMETER_LAKE_DATA", data)
    monkeypatch.setenv("MOEMETER_API", empty_api)
    at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "experts.py"), default_timeout=120)
    at.session_state["rack"] = "rack-a"
    at.run()
    assert not at.exception, at.exception
    assert any("The lake holds rack-a's per-expert load by the hour" in i.value for i in at.info), [
        i.value for i in at.info
    ]
    assert not any("needs two expert snapshots" in i.value for i in at.info)


def test_without_a_published_rack_the_page_says_so(tmp_path, monkeypatch, empty_api):
    uri, data = f"ducklake:{tmp_path / 'catalog.ducklake'}", str(tmp_path / "files")
    connect(uri, data).close()
    monkeypatch.setenv("MOEMETER_LAKE", uri)
    monkeypatch.setenv("MOEMETER_LAKE_DATA", data)
    at = run_page(str(ROOT / "dashboard" / "views" / "fleet.py"), empty_api, monkeypatch)
    assert not at.error, at.error[0].value if at.error else ""
    assert "No rack has published" in at.info[0].value
