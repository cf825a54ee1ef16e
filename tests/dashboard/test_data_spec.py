"""The speculative-decoding views on the sick rack (tests/dashboard/conftest.py), whose decode-0
engine 11 carries a collapsed draft path: the data layer, the Speculative decoding page, and the
acceptance length the Live, SLO and Cost pages show beside per-user speed, cost and the
operating point."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from dashboard.data import slo, spec
from dashboard.figures.slo import operating_point_figure
from tests.dashboard.sick_rack import COLLAPSED, LATEST, STRAGGLER, T0
from warehouse.read import Window

ROOT = Path(__file__).parents[2]
ENGINE = f"decode-0 · DP {COLLAPSED}"


@pytest.fixture(scope="module")
def drafting(sick):
    return spec.drafting(sick, Window.ending(LATEST, 300, 10))


def test_the_collapsed_engine_accepts_least_and_the_pool_carries_on(drafting):
    engines = drafting.window("engine").set_index("engine")
    length = engines["mean_acceptance_length"]
    assert len(engines) == 64 and length.idxmin() == COLLAPSED
    assert length[COLLAPSED] < 1.3 and length.drop(COLLAPSED).min() > 2.0 and length[STRAGGLER] > 2.0
    [pool] = drafting.window("pool").to_dict("records")  # prefill drafts nothing: decode alone
    assert pool["role"] == "decode" and 2.0 < pool["mean_acceptance_length"] < 3.0
    # per position, each token is accepted less often than the one before it
    rates = pool["position_rates"]
    assert len(rates) == 3 and rates[0] > rates[1] > rates[2] > 0
    # the rejected drafts' share of decode compute, from the same sums
    rejected = pool["draft_tokens"] - pool["accepted_tokens"]
    assert pool["rejected_share"] == pytest.approx(rejected / (pool["generated_tokens"] + rejected))


def test_the_figures_over_time_add_up_to_the_window(drafting):
    steps = drafting.over_time("pool")
    assert len(steps) >= 10
    whole = drafting.window("pool").iloc[0]
    assert steps["drafts"].sum() == pytest.approx(whole["drafts"], rel=1e-9)
    assert steps["accepted_tokens"].sum() == pytest.approx(whole["accepted_tokens"], rel=1e-9)


def test_a_window_before_the_rack_drafts_nothing(sick):
    assert spec.drafting(sick, Window.ending(T0 - timedelta(days=1), 300, 10)).empty


def test_a_stack_that_drafts_but_served_nothing_is_empty(drafting):
    """Started with a speculative config and idle: its counters are there and flat. Not a page
    with no rows to show (it crashed on `pools.iloc[0]`), the page's "no speculative decoding"."""
    idle = spec.Drafting(drafting.long.assign(delta=0.0))
    assert idle.empty and idle.window("pool").empty


def test_the_cost_split_adds_up_to_the_decode_pools_output_price(sick):
    split = spec.cost_split(sick, LATEST - timedelta(minutes=5), LATEST, 100.0, 2e6)
    assert split is not None
    parts = split.parts()
    assert parts["usd_per_mtok_output"] == pytest.approx(50.0)
    assert parts["accepted_output"] + parts["rejected_drafts"] == pytest.approx(50.0)
    assert 0.1 < split.rejected_share < 0.5


def test_the_operating_point_carries_the_decode_pools_acceptance_length(sick, monkeypatch):
    w = Window.ending(LATEST, 300, 10)
    buckets = spec.drafting(sick, w).over_time("pool")["bucket"]
    # the sick rack has no gateway records: per-user speed stands in at 200 tok/s in every step
    monkeypatch.setattr(slo.users, "tps_over_time", lambda q, w: pd.DataFrame({"bucket": buckets, "tps_p90": 200.0}))
    points = slo.operating_points(sick, w)
    assert len(points) >= 10 and points["acceptance_length"].between(2.0, 3.0).all()
    fig = operating_point_figure(points)
    [steps] = [t for t in fig.data if t.name == "this rack, per step"]
    assert steps.marker.showscale and "acceptance length" in steps.text[-1]
    assert any("acceptance length" in (t.name or "") for t in fig.data if t.name.startswith("latest"))


def charts(at) -> dict[str, dict]:
    """The page's Plotly figures by title, as the browser gets them."""
    out = {}
    for c in at.get("plotly_chart"):
        fig = json.loads(c.proto.spec)
        title = fig["layout"].get("title", {})
        out[title.get("text", "") if isinstance(title, dict) else title] = fig
    return out


def test_the_page_puts_the_collapsed_engine_first(sick_api, monkeypatch):
    from tests.conftest import run_page

    at = run_page(str(ROOT / "dashboard" / "views" / "spec.py"), sick_api, monkeypatch, timeout=120)
    table = at.dataframe[0].value
    assert table["label"].iloc[0] == ENGINE and len(table) == 64
    cards = {m.label: m.value for m in at.metric}
    assert 2.0 < float(cards["Mean acceptance length"]) < 3.0
    assert cards["Acceptance rate"].endswith("%") and cards["Decode $/M output: rejected drafts"].startswith("$")
    figures = charts(at)
    assert {"Mean acceptance length", "Acceptance per draft position", "Drafted tokens: accepted and rejected",
            "Decode compute on rejected drafts", "Mean acceptance length per engine"} <= set(figures)  # fmt: skip
    heat = figures["Mean acceptance length per engine"]["data"][0]
    assert ENGINE in heat["y"]
    assert any("Per tenant: not shown" in c.value for c in at.caption)
    assert not at.error


def test_the_live_page_sets_acceptance_length_beside_per_user_speed(sick_api, monkeypatch):
    from tests.conftest import run_page

    at = run_page(str(ROOT / "dashboard" / "views" / "live.py"), sick_api, monkeypatch, timeout=120)
    figures = charts(at)
    assert "Mean acceptance length" in figures
    [decode] = [t for t in figures["Mean acceptance length"]["data"] if t["name"] == "decode"]
    assert decode["x"]
