"""Roofline page figures: DataFrames from dashboard.data.roofline in, Plotly figures out. No Streamlit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .live import POOL_COLORS, _layout, gapped

PRECISION_DASH = {"fp4": "solid", "fp8": "dash", "bf16": "dot"}


def roofline(points: pd.DataFrame, roofs: pd.DataFrame, title: str = "Roofline: FLOP/s per GPU") -> go.Figure:
    """Arithmetic intensity (FLOP/byte) across, FLOP/s per GPU up, both logarithmic. Each GPU
    model's roofs (one per precision; the one MFU is measured against drawn heavy), each pool a large
    point, each engine a small one. `points`: role, kind ("pool" or "engine"), label, intensity,
    flops_per_second, bytes_per_second, mfu, mbu; rows without a positive intensity and FLOP/s
    cannot sit on log axes and are left out."""
    fig = go.Figure()
    for (model, precision), r in roofs.groupby(["gpu_model", "precision"], sort=False):
        heavy = bool(r["assumed"].any())
        fig.add_trace(
            go.Scatter(
                x=r["intensity"],
                y=r["flops_per_second"],
                mode="lines",
                name=f"{model} {str(precision).upper()} roof" + (" (MFU's)" if heavy else ""),
                line=dict(color="#444" if heavy else "#999", width=3 if heavy else 1.5, dash=PRECISION_DASH[precision]),
                hovertemplate="%{x:,.0f} FLOP/byte: %{y:.3s}FLOP/s<extra>" + f"{model} {precision.upper()}</extra>",
            )
        )
    drawn = points[(points["intensity"] > 0) & (points["flops_per_second"] > 0)] if len(points) else points
    for (kind, role), p in drawn.groupby(["kind", "role"], sort=False) if len(drawn) else []:
        pool = kind == "pool"
        fig.add_trace(
            go.Scatter(
                x=p["intensity"],
                y=p["flops_per_second"],
                mode="markers",
                name=f"{role} pool" if pool else f"{role} engines",
                marker=dict(
                    color=POOL_COLORS.get(role, "#555"),
                    size=16 if pool else 7,
                    symbol="diamond" if pool else "circle",
                    opacity=1.0 if pool else 0.55,
                    line=dict(width=1.5 if pool else 0, color="white"),
                ),
                customdata=p[["mfu", "mbu", "bytes_per_second"]].to_numpy(dtype=float) * [100, 100, 1],
                text=p["label"],
                hovertemplate=(
                    "%{text}<br>%{y:.3s}FLOP/s per GPU, %{customdata[2]:.3s}B/s<br>%{x:,.1f} FLOP/byte"
                    "<br>MFU %{customdata[0]:.2f}%, MBU %{customdata[1]:.2f}%<extra></extra>"
                ),
            )
        )
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP/byte, vLLM's estimates)", **_decades(0, 9))
    fig.update_yaxes(type="log", title="FLOP/s per GPU", **_decades(6, 19))
    _layout(
        fig,
        title,
        height=520,
        subtitle="roofs: min(dense peak, intensity x HBM bandwidth), from the GPU sheet",
    )
    return fig.update_layout(hovermode="closest", legend=dict(y=-0.14))


def _decades(low: int, high: int) -> dict[str, object]:
    """Ticks on the powers of ten from 10^low to 10^high, labelled with SI prefixes (1k, 10T, 1P):
    plotly's own switch to 10^15 past T reads as another unit."""
    prefixes = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
    vals = [10.0**e for e in range(low, high + 1)]
    text = [f"{10 ** (e % 3)}{prefixes[e - e % 3]}" for e in range(low, high + 1)]
    return {"tickvals": vals, "ticktext": text, "minor": dict(showgrid=False)}


def utilisation_over_time(pools_over_time: pd.DataFrame) -> go.Figure:
    """MFU and MBU of each pool per step, in percent of the GPU's peaks."""
    fig = go.Figure()
    for role, g in pools_over_time.groupby("role", sort=False) if len(pools_over_time) else []:
        for column, name, dash in (("mfu", "MFU", "solid"), ("mbu", "MBU", "dot")):
            s = gapped(g[["bucket", column]])
            fig.add_trace(
                go.Scatter(
                    x=s["bucket"],
                    y=s[column] * 100,
                    mode="lines",
                    name=f"{role} {name}",
                    line=dict(color=POOL_COLORS.get(str(role), "#555"), dash=dash),
                    hovertemplate="%{y:.2f}%",
                )
            )
    fig.update_yaxes(title="% of peak", rangemode="tozero")
    return _layout(fig, "MFU and MBU per pool", subtitle="per step: achieved / the GPU's peak")
