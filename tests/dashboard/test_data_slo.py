"""The SLO page's error budget over time by hand, and the page on a warehouse of real request
records (tests/warehouse/test_goodput.py's: its docstring gives every request and verdict)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from dashboard.data import slo
from tests.warehouse.test_goodput import DAY, END, RECORDS, START, at, rolled, warehouse
from warehouse.api import LocalQuery
from warehouse.read import Window

ROOT = Path(__file__).parents[2]


def test_the_budget_left_at_each_whole_hour_and_at_the_end_by_hand():
    q = LocalQuery(warehouse())
    w = Window.between(START, END)
    report, _ = slo.reports(q, w)
    got = {
        (r.ts.hour, r.ts.minute, r["class"]): r.budget_left for _, r in slo.budget_over_time(q, w, report).iterrows()
    }
    # chat (objective 0.9, 1 day): at 13:00 requests 9 and 1, both met: all left; at 14:00 also 2..6,
    # 3 of 7 missed: 1 - 3 / (0.1 x 7); at 14:30 the report's 1 - 4 / (0.1 x 8)
    assert got[(13, 0, "chat")] == 1.0
    assert got[(14, 0, "chat")] == pytest.approx(1 - 3 / 0.7)
    assert got[(14, 30, "chat")] == pytest.approx(-4.0)
    # batch (0.8, 1 day): nothing held before 13:05 (None, not 0 or NaN); 11 met; then 12 missed
    assert got[(13, 0, "batch")] is None
    assert got[(14, 0, "batch")] == 1.0 and got[(14, 30, "batch")] == pytest.approx(-1.5)
    assert len(got) == 6


def test_nothing_held_over_the_period_is_no_budget_never_0_or_nan():
    q = LocalQuery(warehouse([r for r in RECORDS if r["request_id"] == "r10"]))  # 14:40, after the window
    w = Window.between(START, END)
    report, _ = slo.reports(q, w)
    budget = slo.budget_over_time(q, w, report)
    assert len(budget) == 6 and all(v is None for v in budget["budget_left"])


def test_attainment_in_steps_of_whole_minutes_is_read_from_the_minute_sums():
    con = warehouse()
    q = LocalQuery(con)
    w = Window(START + timedelta(seconds=30), END, 600)  # 12:30:30 .. 14:30 in ten minutes

    def per_class(df: pd.DataFrame) -> dict[str, tuple[int, int]]:
        sums = df.groupby("class")[["held", "met"]].sum()
        return {c: (int(r.held), int(r.met)) for c, r in sums.iterrows()}

    before = slo.attainment_over_time(q, w)
    # requests 1-7 and 11, 12 (tests/warehouse/test_goodput.py)
    assert per_class(before) == {"chat": (7, 3), "batch": (2, 1)}
    assert len(before) == 9 and before["bucket"].min() == pd.Timestamp(at("12:40"))
    rolled(con, DAY.replace(hour=16))
    pd.testing.assert_frame_equal(slo.attainment_over_time(q, w), before)  # not counted twice
    con.execute("DELETE FROM requests")  # retention: the minute sums are left
    pd.testing.assert_frame_equal(slo.attainment_over_time(q, w), before)
    assert slo.attainment_over_time(q, Window(w.start, w.end, 30)).empty  # half minutes: the records only


def test_attainment_and_budget_in_hours_take_the_reports_sums_of_the_same_window_and_read_nothing():
    local = LocalQuery(warehouse())
    asked: list[str] = []

    def q(sql, params=None):  # type: ignore[no-untyped-def]
        asked.append(sql)
        return local(sql, params)

    w = Window(END - timedelta(hours=8), END, 3600)  # past the raw records' 6 h: in hours
    report, _ = slo.reports(q, w)
    asked.clear()
    got = slo.attainment_over_time(q, w, report)
    assert not asked
    pd.testing.assert_frame_equal(got, slo.attainment_over_time(q, w))  # read here: the same
    assert len(asked) == 1 and int(got["held"].sum()) == int(report.rows["requests"].sum()) > 0
    other = Window(w.start, END - timedelta(hours=1), 3600)  # not the report's window: read, fewer held
    assert int(slo.attainment_over_time(q, other, report)["held"].sum()) < int(got["held"].sum())
    asked.clear()
    budget = slo.budget_over_time(q, w, report)  # the hours before the window, read with the report
    assert not asked and len(budget) == 2 * 8 + 2  # two classes: 8 whole hours and the end
    pd.testing.assert_frame_equal(budget, slo.budget_over_time(q, w, replace(report, history=None)))
    assert len(asked) == 1


@pytest.fixture
def records_api(tmp_path):
    from warehouse.api import QueryServer
    from warehouse.db import Warehouse

    warehouse(path=str(tmp_path / "w.duckdb")).close()
    wh = Warehouse(tmp_path / "w.duckdb")
    api = QueryServer(wh)
    api.start()
    yield api.url
    api.shutdown()
    api.server_close()
    wh.close()


def test_the_page_shows_attainment_budget_and_burn_per_class(records_api, monkeypatch):
    from tests.conftest import plotly_array, run_page

    at = run_page(str(ROOT / "dashboard" / "views" / "slo.py"), records_api, monkeypatch, timeout=120)
    assert not at.error
    # the hour up to and including the last request, (13:40, 14:40]: chat 6 (met), 7 (failed), 8 (not
    # held), 10 (met): 2 met of 3 held; batch 12 (missed): 0 of 1
    table = at.dataframe[0].value.set_index("class")
    assert (table.loc["chat", "requests"], table.loc["chat", "met"]) == (3, 2)
    assert (table.loc["batch", "requests"], table.loc["batch", "met"]) == (1, 0)
    # burn over that hour: chat 1 missed of 3 / 10% = 3.3x, batch 1 of 1 / 20% = 5x: under 14.4 and,
    # over 6 h (chat 4 of 9 / 10% = 4.4x, batch 1 of 2 / 20% = 2.5x), under 6: nothing burns
    assert table.loc["chat", "burn_1h"] == pytest.approx(1 / 3 / 0.1)
    assert table.loc["batch", "burn_1h"] == pytest.approx(5.0)
    assert table.loc["chat", "burn_6h"] == pytest.approx(4 / 9 / 0.1)
    assert {m.label: m.value for m in at.metric}["Burning"] == "none"
    charts = {c["layout"]["title"]["text"]: c for c in (json.loads(e.proto.spec) for e in at.get("plotly_chart"))}
    budget = {t["name"]: (t["x"], plotly_array(t["y"])) for t in charts["Error budget left per class"]["data"]}
    # at 14:00 (chat 3 of 7 missed) and at the end (chat 4 of 9 missed: 10 is in; batch 1 of 2)
    assert budget["chat"][1] == pytest.approx([100 * (1 - 3 / 0.7), 100 * (1 - 4 / 0.9)])
    assert budget["batch"][1] == pytest.approx([100.0, -150.0])
    assert budget["chat"][0][0].startswith(str(DAY + timedelta(hours=14)).replace(" ", "T")[:16])
