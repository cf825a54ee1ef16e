"""Users page figures: what each trace holds."""

from __future__ import annotations

import math

import pandas as pd

from dashboard.figures import users as figures


def test_distribution_marks_p50_and_p90() -> None:
    hist = pd.DataFrame({"tokens_per_second": [100.0, 200.0, 400.0], "requests": [1, 5, 2]})
    fig = figures.tps_distribution_figure(hist, 210.0, 150.0)
    assert list(fig.data[0].y) == [1, 5, 2] and fig.layout.xaxis.type == "log"
    # on a log axis plotly.js takes a shape's x as the value, an annotation's as log10 of it (seen in Chromium)
    assert [s.x0 for s in fig.layout.shapes] == [210.0, 150.0]
    assert [a.x for a in fig.layout.annotations] == [math.log10(210.0), math.log10(150.0)]
    assert [a.xanchor for a in fig.layout.annotations] == ["left", "right"]  # close lines' labels apart
    assert [a.text for a in fig.layout.annotations] == ["P50 210", "P90 150"]
    assert not figures.tps_distribution_figure(hist, math.nan, math.nan).layout.shapes
    assert not figures.tps_distribution_figure(hist, math.inf, 0.0).layout.shapes


def test_top_users_stack_computed_cached_and_generated() -> None:
    t = pd.DataFrame(
        {
            "user_id": ["a", "b"],
            "prompt_tokens": [100, 50],
            "cached_prompt_tokens": [60, 0],
            "generated_tokens": [10, 20],
        }
    )
    fig = figures.top_users_figure(t)
    assert [d.name for d in fig.data] == ["prompt, computed", "prompt, cached", "generated"]
    assert list(fig.data[0].y) == ["b", "a"] and list(fig.data[0].x) == [50, 40]  # biggest on top
    same_name = figures.top_users_figure(t.assign(user_id=["acme", "acme"], tenant=["globex", "acme"]))
    assert list(same_name.data[0].y) == ["acme of acme", "acme of globex"]  # a user is named within its tenant
