"""Roofline figures: roofs as lines (the one MFU divides by drawn heavy), points on log axes, and what
a log axis cannot hold left out rather than drawn at zero."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboard.data.roofline import roofs
from dashboard.figures import roofline as figures
from warehouse.roofline import default_sheet


def _points() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "role": ["prefill", "decode", "decode", "decode"],
            "kind": ["pool", "pool", "engine", "engine"],
            "label": ["prefill pool", "decode pool", "decode-0 · DP 0", "decode-0 · DP 1"],
            "intensity": [600_000.0, 80_000.0, 79_000.0, np.nan],  # DP 1 moved no bytes
            "flops_per_second": [5.1e15, 3.4e14, 3.3e14, 3.3e14],
            "bytes_per_second": [8e9, 4e9, 4e9, 0.0],
            "mfu": [0.34, 0.022, 0.022, 0.022],
            "mbu": [0.001, 0.0005, 0.0005, 0.0],
        }
    )


def test_the_assumed_roof_is_heavy_and_points_skip_what_log_axes_cannot_hold():
    gpu = default_sheet().gpu("NVIDIA GB300")
    fig = figures.roofline(_points(), roofs(gpu, (1.0, 1e7), "fp4"))
    by_name = {t.name: t for t in fig.data}
    assert by_name["NVIDIA GB300 FP4 roof (MFU's)"].line.width == 3
    assert by_name["NVIDIA GB300 FP8 roof"].line.width == 1.5
    assert max(by_name["NVIDIA GB300 FP4 roof (MFU's)"].y) == 15.0e15
    assert list(by_name["decode engines"].text) == ["decode-0 · DP 0"]  # DP 1 has no intensity to place
    assert list(by_name["prefill pool"].customdata[0][:2]) == [34.0, 0.1]  # MFU, MBU in percent
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"


def test_over_time_draws_mfu_and_mbu_per_pool_in_percent():
    t = pd.date_range("2026-12-01", periods=3, freq="20s")
    df = pd.DataFrame({"bucket": list(t) * 2, "role": ["prefill"] * 3 + ["decode"] * 3, "mfu": 0.3, "mbu": 0.01})
    fig = figures.utilisation_over_time(df)
    assert [t.name for t in fig.data] == ["prefill MFU", "prefill MBU", "decode MFU", "decode MBU"]
    assert list(fig.data[0].y) == [30.0] * 3
    assert not figures.utilisation_over_time(df.iloc[0:0]).data
