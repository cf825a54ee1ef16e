import pandas as pd

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


def test_no_rebalances_no_lines():
    assert not figures.balancedness_figure(_bal(5), pd.DataFrame(columns=["ts"])).layout.shapes
    assert not figures.balancedness_summary_figure(pd.DataFrame(), pd.DataFrame(columns=["ts"])).layout.shapes
