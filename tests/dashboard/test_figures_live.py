"""Figures are built from data alone: assert on what they draw."""

from __future__ import annotations

import pandas as pd

from dashboard.figures import live as figures

B = pd.to_datetime(["2026-11-30 12:00:00", "2026-11-30 12:00:10"])


def test_tokens_per_gpu_draws_one_trace_per_series_in_its_pool_panel():
    tpg = pd.DataFrame(
        {
            "bucket": list(B) * 4,
            "series": ["prefill logical"] * 2 + ["prefill computed"] * 2 + ["decode"] * 2 + ["rack logical"] * 2,
            "value": [8e6, 8.1e6, 4e5, 4.1e5, 9e3, 9.1e3, 9.5e5, 9.6e5],
        }
    )
    fig = figures.tokens_per_gpu_figure(tpg)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"prefill logical", "prefill computed", "decode", "rack logical"}
    assert list(by_name["decode"].y) == [9e3, 9.1e3]
    assert by_name["decode"].yaxis == "y2" and by_name["rack logical"].yaxis == "y3"


def test_latency_figure_is_in_milliseconds_per_pool_and_quantile():
    q = pd.DataFrame(
        {
            "bucket": list(B) * 2,
            "role": ["decode"] * 4,
            "quantile": [0.5, 0.5, 0.9, 0.9],
            "value": [0.004, 0.0045, 0.005, 0.0052],
        }
    )
    fig = figures.latency_figure(q, "ITL")
    assert [t.name for t in fig.data] == ["decode p50", "decode p90"]
    assert list(fig.data[1].y) == [5.0, 5.2]


def test_per_user_figure_marks_the_write_up_reference():
    fig = figures.per_user_figure(pd.DataFrame({"bucket": B, "value": [190.0, 200.0]}))
    assert list(fig.data[0].y) == [190.0, 200.0]
    assert fig.layout.shapes[0].y0 == 196.0


def test_gpu_heatmap_has_one_cell_per_gpu():
    latest = pd.DataFrame({"target": ["t0"] * 4 + ["t1"] * 4, "gpu": list(range(4)) * 2, "util_pct": range(8)})
    fig = figures.gpu_heatmap(latest, "util_pct", "util", "%")
    assert fig.data[0].z.shape == (2, 4)
    assert list(fig.data[0].y) == ["t0", "t1"]
    assert figures.gpu_heatmap(latest.iloc[0:0], "util_pct", "util", "%").data == ()


def test_queue_and_kv_figures():
    g = pd.DataFrame(
        {
            "bucket": list(B) * 2,
            "role": ["decode"] * 2 + ["prefill"] * 2,
            "running": [3000, 3100, 2, 3],
            "waiting": [0, 1, 5, 0],
            "kv_mean": [0.5, 0.6, 0.7, 0.7],
            "kv_max": [0.8, 0.9, 0.9, 1.0],
        }
    )
    names = [t.name for t in figures.queue_figure(g).data]
    assert names == ["decode running", "decode waiting", "prefill running", "prefill waiting"]
    kv = figures.kv_figure(g)
    assert list(kv.data[0].y) == [50.0, 60.0]


def test_a_line_breaks_across_an_outage_instead_of_joining_its_edges():
    t = pd.to_datetime(
        [
            "2026-11-30 12:00:00",
            "2026-11-30 12:00:10",
            "2026-11-30 12:00:20",
            "2026-11-30 12:05:00",
            "2026-11-30 12:05:10",
        ]
    )  # a 4 min 40 s hole
    tpg = pd.DataFrame({"bucket": t, "series": ["decode"] * 5, "value": [1.0, 2.0, 3.0, 4.0, 5.0]})
    decode = next(tr for tr in figures.tokens_per_gpu_figure(tpg).data if tr.name == "decode")
    ys = list(decode.y)
    assert len(ys) == 6 and pd.isna(ys[3]) and ys[:3] == [1.0, 2.0, 3.0] and ys[4:] == [4.0, 5.0]
    assert pd.Timestamp(decode.x[3]) == pd.Timestamp("2026-11-30 12:04:50")  # one usual step before the return
    assert not decode.connectgaps
    steady = pd.DataFrame({"bucket": t[:3], "series": ["decode"] * 3, "value": [1.0, 2.0, 3.0]})
    assert list(figures.gapped(steady)["value"]) == [1.0, 2.0, 3.0]  # no hole, nothing added
