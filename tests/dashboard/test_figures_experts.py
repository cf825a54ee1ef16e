import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from dashboard.figures import experts as figures


def _bal(buckets: int, layers: int = 4) -> pd.DataFrame:
    ts = pd.date_range("2026-11-30", periods=buckets, freq="12min")
    rows = [(t, layer, 0.9 - 0.01 * layer, 1 / (0.9 - 0.01 * layer)) for t in ts for layer in range(layers)]
    return pd.DataFrame(rows, columns=["bucket", "layer", "balancedness", "imbalance"])


def test_each_rebalance_is_one_vertical_line_on_both_figures():
    events = pd.DataFrame({"ts": pd.to_datetime(["2026-11-30 01:00", "2026-11-30 03:30"])})
    for fig in (figures.balancedness_figure(_bal(30), events), figures.balancedness_summary_figure(_bal(30), events)):
        assert [pd.Timestamp(s.x0) for s in fig.layout.shapes] == list(events["ts"])
        assert all(s.x0 == s.x1 and s.yref == "paper" and s.line.dash == "dash" for s in fig.layout.shapes)


def test_a_day_of_rebalances_every_5_minutes_is_one_tick_each_along_the_top():
    events = pd.DataFrame({"ts": pd.date_range("2026-11-30", periods=288, freq="5min")})
    for fig in (figures.balancedness_figure(_bal(120), events), figures.balancedness_summary_figure(_bal(120), events)):
        assert not fig.layout.shapes
        [ticks] = [t for t in fig.data if t.name == "EPLB rebalance"]
        assert [pd.Timestamp(x) for x in ticks.x] == list(events["ts"]) and ticks.yaxis == "y3"
        assert fig.layout.yaxis3.overlaying == "y" and fig.layout.yaxis3.visible is False
        # along the top: the ticks' axis keeps its range, whatever the layer axis does
        assert fig.layout.yaxis3.range == (0, 1.02) and fig.layout.yaxis3.autorange in (None, False)


def test_no_rebalances_no_lines():
    assert not figures.balancedness_figure(_bal(5), pd.DataFrame(columns=["ts"])).layout.shapes
    assert not figures.balancedness_summary_figure(pd.DataFrame(), pd.DataFrame(columns=["ts"])).layout.shapes


def test_expert_heatmap_is_perceptually_uniform_with_a_log_option_and_whole_ticks() -> None:
    shares = pd.DataFrame(
        {"layer": [0, 0, 0, 1, 1, 1], "expert": [0, 1, 2, 0, 1, 2], "share": [0.9, 0.099, 0.001, 0.5, 0.5, 0.0]}
    )
    lin = figures.expert_heatmap(shares)
    viridis = go.Figure(go.Heatmap(colorscale="Viridis")).data[0].colorscale
    assert [c[1] for c in lin.data[0].colorscale] == [c[1] for c in viridis]
    assert lin.data[0].z[0][0] == pytest.approx(90.0)
    log = figures.expert_heatmap(shares, log=True)
    z = np.asarray(log.data[0].z, dtype=float)
    assert z[0].tolist() == pytest.approx([math.log10(90), math.log10(9.9), math.log10(0.1)])
    assert math.isnan(z[1][2])  # no tokens: blank, not log10(0)
    assert list(log.data[0].colorbar.ticktext) == ["0.1%", "1%", "10%", "100%"]
    assert np.asarray(log.data[0].customdata, dtype=float)[0][0] == pytest.approx(90.0)  # hover shows the share
    for fig in (lin, log):
        assert fig.layout.xaxis.dtick == 1 and fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.tick0 == 0


def test_rank_heatmap_ticks_whole_ranks_and_layers() -> None:
    m = pd.DataFrame(np.ones((43, 64)), index=range(43), columns=range(64))
    fig = figures.rank_heatmap(m)
    assert fig.layout.xaxis.dtick == 4 and fig.layout.yaxis.dtick == 3  # ~20 ticks, all whole numbers


def test_layer_axes_tick_whole_layers() -> None:
    """Three MoE layers (the local stack's tiny model) were ticked -0.5, 0, 0.5, ... 2.5."""
    bal = pd.DataFrame(
        {
            "layer": [0, 1, 2] * 2,
            "bucket": pd.to_datetime(["2026-12-01 17:00"] * 3 + ["2026-12-01 17:01"] * 3),
            "balancedness": [1.0, 0.9, 0.8, 0.95, 0.85, 0.75],
        }
    )
    fig = figures.balancedness_figure(bal, pd.DataFrame())
    assert fig.layout.yaxis.dtick == 1 and fig.layout.yaxis.tick0 == 0
    wi = figures.what_if_figure(
        pd.DataFrame(
            {"layer": [0, 1, 2], "current_balancedness": [0.5, 0.6, 0.7], "planned_balancedness": [0.9, 0.9, 0.9]}
        )
    )
    assert wi.layout.xaxis.dtick == 1 and wi.layout.xaxis.tick0 == 0
