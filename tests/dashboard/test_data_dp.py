"""The DP ranks page: the straggler score computed by hand, and on the sick rack
(tests/dashboard/conftest.py) the twin's straggler ranked first and alone over 1, its full KV
cache on its own row, the page showing both."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboard.data import dp
from tests.dashboard.sick_rack import COLLAPSED, FAILING, LATEST, SATURATED, STRAGGLER
from warehouse.alerts import AlertRules
from warehouse.read import Window

ROOT = Path(__file__).parents[2]
RULES = AlertRules()  # straggler_factor 3, straggler_min_waiting 4, straggler_step_factor 1.5


def _frame(rows: list[tuple[str, float, float, float, float]]) -> pd.DataFrame:
    """(engine, waiting, tokens, steps, step_seconds) per engine, one bucket each (timed = counted steps),
    as engines_over_time gives them."""
    t = datetime(2026, 12, 1)
    return pd.DataFrame(
        [
            {
                "bucket": t, "target": "decode-0", "engine": e, "waiting": wt, "running": 1.0, "kv_usage": 0.5,
                "tokens": tok, "steps": st, "step_seconds": secs, "timed_steps": st if secs == secs else np.nan,
                "label": dp.engine_label("decode-0", e),
                **dict.fromkeys(["xfer_seconds", "transfers", "failed_transfers", "expired_kv"], np.nan),
                **dict.fromkeys(["drafts", "accepted_tokens"], np.nan),
            }
            for e, wt, tok, st, secs in rows
        ]
    )  # fmt: skip


def test_the_score_by_hand():
    # waiting 0, 1, 12: median 1 is under 4/3, so ratios 0, 0.75, 9 (/3: 0, 0.25, 3);
    # step 10, 10, 20 ms: ratios 1, 1, 2 (/1.5: 0.667, 0.667, 1.333); the score is the larger
    scores = dp.straggler_scores(
        _frame([("0", 0, 10_000, 1000, 10.0), ("1", 1, 10_000, 1000, 10.0), ("10", 12, 5000, 1000, 20.0)]), RULES
    )
    assert list(scores["engine"]) == ["10", "0", "1"]  # highest first; ties in DP-rank order
    assert scores["score"].tolist() == pytest.approx([3.0, 1 / 1.5, 1 / 1.5])
    assert scores["waiting_ratio"].tolist() == pytest.approx([9.0, 0.0, 0.75])
    assert scores["step_ms"].tolist() == pytest.approx([20.0, 10.0, 10.0])
    assert scores["tokens_per_step"].tolist() == pytest.approx([5.0, 10.0, 10.0])
    assert scores["label"].iloc[0] == "decode-0 · DP 10"


def test_a_step_time_over_fewer_steps_than_the_alert_judges_is_left_out():
    # engine 2's steps take 3x the others', over 999 steps each: no step ratio, the waiting queue alone
    scores = dp.straggler_scores(
        _frame([("0", 1, 10, 999, 9.99), ("1", 1, 10, 999, 9.99), ("2", 1, 10, 999, 29.97)]), RULES
    )
    assert scores["step_ms"].tolist() == pytest.approx([10.0, 10.0, 30.0])  # shown, not judged
    assert scores["step_ratio"].isna().all()
    assert scores["score"].tolist() == pytest.approx([0.75 / 3] * 3)  # median 1 under the floor 4/3
    judged = dp.straggler_scores(
        _frame([("0", 1, 10, 1000, 10.0), ("1", 1, 10, 1000, 10.0), ("2", 1, 10, 1000, 30.0)]), RULES
    )
    assert judged["engine"].iloc[0] == "2" and judged["score"].iloc[0] == pytest.approx(3 / 1.5)


def test_a_busy_pools_median_is_the_yardstick_and_no_plugin_leaves_step_time_out():
    # waiting 6, 8, 30: median 8 (over the floor): ratios 0.75, 1, 3.75 -> /3; no step times
    scores = dp.straggler_scores(
        _frame([("0", 6, 10, 1, np.nan), ("1", 8, 10, 1, np.nan), ("2", 30, 10, 1, np.nan)]), RULES
    )
    assert scores["score"].tolist() == pytest.approx([3.75 / 3, 1 / 3, 0.75 / 3])
    assert scores["step_ms"].isna().all() and scores["step_ratio"].isna().all()


def test_no_engines_no_scores():
    empty = _frame([]).reindex(columns=["bucket", "target", "engine", "waiting", "running", "kv_usage", "tokens",
                                         "steps", "step_seconds", "timed_steps"])  # fmt: skip
    assert dp.straggler_scores(empty, RULES).empty


def test_rows_follow_dp_rank_order():
    df = _frame([("10", 0, 1, 1, 0.1), ("2", 0, 1, 1, 0.1), ("1", 0, 1, 1, 0.1)])
    assert list(dp.grid(df, "waiting").index) == ["decode-0 · DP 1", "decode-0 · DP 2", "decode-0 · DP 10"]


@pytest.fixture(scope="module")
def decode(sick):
    return dp.engines_over_time(sick, Window.ending(LATEST, 300, 10), "decode")


def test_the_twins_straggler_ranks_first_and_alone_over_1(decode):
    scores = dp.straggler_scores(decode, RULES)
    assert len(scores) == 64
    assert scores["engine"].iloc[0] == STRAGGLER
    assert scores["score"].iloc[0] > 1 and (scores["score"].iloc[1:] < 1).all()
    # it waits for its KV: its own queue, not its step time, sets it apart (the ranks step together)
    assert scores["waiting_ratio"].iloc[0] > RULES.straggler_factor
    assert scores["step_ratio"].max() < RULES.straggler_step_factor


def test_the_saturated_engine_is_the_one_full_row(decode):
    kv = dp.grid(decode, "kv_usage")
    assert kv.shape[0] == 64 and kv.shape[1] >= 10
    last = kv.iloc[:, -1]
    assert last.idxmax() == f"decode-0 · DP {SATURATED}" and last.max() > RULES.kv_usage_max
    assert (last.drop(f"decode-0 · DP {SATURATED}") < RULES.kv_usage_max).all()


def test_the_failing_engine_alone_fails_kv_transfers_and_the_stragglers_crawl(decode):
    scores = dp.straggler_scores(decode, RULES).set_index("engine")
    failed = scores["failed_transfers"]
    assert failed[FAILING] > 0 and (failed.drop(FAILING) == 0).all()
    assert (scores["transfers"] > 0).all() and (scores["expired_kv"] == 0).all()
    # the straggler reads its KV over a slow link: its mean transfer is the pool's longest by far
    xfer = scores["xfer_ms"]
    assert xfer.idxmax() == STRAGGLER and xfer[STRAGGLER] > 10 * xfer.drop(STRAGGLER).max()
    grid = dp.grid(decode, "failed_transfers")
    assert grid.loc[f"decode-0 · DP {FAILING}"].sum() == failed[FAILING]


def test_an_engine_whose_drafts_are_rejected_is_told_apart_from_a_straggler(decode):
    """The collapsed draft path: the pool's lowest acceptance length by far, and no straggler
    score (its queue does not grow); the straggler's own drafts accept as the pool's do."""
    scores = dp.straggler_scores(decode, RULES).set_index("engine")
    length = scores["acceptance_length"]
    assert length.idxmin() == COLLAPSED and length[COLLAPSED] < 1.3
    assert length.drop(COLLAPSED).min() > 2.0 and length[STRAGGLER] > 2.0
    assert scores.loc[COLLAPSED, "score"] < 1
    grid = dp.grid(decode, "acceptance_length")
    assert grid.loc[f"decode-0 · DP {COLLAPSED}"].max() < grid.drop(f"decode-0 · DP {COLLAPSED}").min().min()


def test_tokens_per_step_is_the_histograms_sum_over_its_count(sick, decode):
    # one engine, the whole window, from the raw counters by hand
    raw = sick(
        """SELECT s.metric, sum(i.delta) AS d FROM increments i JOIN series_targets s USING (series_id)
           WHERE s.role = 'decode' AND s.engine = '0' AND i.ts > $a AND i.ts <= $b
             AND s.metric IN ('vllm:iteration_tokens_total_sum', 'vllm:iteration_tokens_total_count')
           GROUP BY ALL""",
        {"a": LATEST - timedelta(seconds=300), "b": LATEST},
    ).set_index("metric")["d"]
    scores = dp.straggler_scores(decode, RULES).set_index("engine")
    expected = raw["vllm:iteration_tokens_total_sum"] / raw["vllm:iteration_tokens_total_count"]
    assert scores.loc["0", "tokens_per_step"] == pytest.approx(expected, rel=0.02)  # the window's edges prorate


def test_the_page_shows_the_straggler_first(sick_api, monkeypatch):
    from tests.conftest import plotly_array, run_page

    at = run_page(str(ROOT / "dashboard" / "views" / "dp.py"), sick_api, monkeypatch, timeout=120)
    table = at.dataframe[0]  # the page's one table
    assert table.value["label"].iloc[0] == f"decode-0 · DP {STRAGGLER}"
    cards = {m.label: m.value for m in at.metric}
    assert cards["Engines over score 1"] == "1 of 64"
    failing = table.value.set_index("label").loc[f"decode-0 · DP {FAILING}", "failed_transfers"]
    assert failing > 0 and table.value["failed_transfers"].sum() == failing
    assert not at.error and not [i for i in at.info if "No NIXL" in i.value]
    # the KV-cache heatmap as the browser gets it: the saturated engine's row is the one full
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    [kv] = [c["data"][0] for c in charts if c["layout"]["title"]["text"] == "KV-cache usage"]
    last = dict(zip(kv["y"], plotly_array(kv["z"])[:, -1]))
    assert max(last, key=lambda k: np.nan_to_num(last[k])) == f"decode-0 · DP {SATURATED}"
    assert last[f"decode-0 · DP {SATURATED}"] > 100 * RULES.kv_usage_max


def test_before_any_scrape_the_page_says_so(empty_api, monkeypatch):
    from tests.conftest import run_page

    at = run_page(str(ROOT / "dashboard" / "views" / "dp.py"), empty_api, monkeypatch)
    assert any("No scrapes stored yet" in i.value for i in at.info)
