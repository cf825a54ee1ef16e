"""Live page figures: DataFrames from dashboard.data.live in, Plotly figures out. No Streamlit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

POOL_COLORS = {"prefill": "#1f77b4", "decode": "#d62728", "rack": "#2ca02c"}
QUANTILE_DASH = {0.5: "solid", 0.9: "dash", 0.99: "dot"}
P90_PER_USER_REFERENCE = 196.0  # tokens/s, the write-up's P90 per-user decode throughput...
RACK_PER_GPU_REFERENCE = 954_000.0  # ...at the rack's 954,000 tokens/s per GPU
SINGLE_USER_REFERENCE = 826.0  # tokens/s for a single user on the small-batch decode path


def _layout(fig: go.Figure, title: str, height: int = 320, subtitle: str = "") -> go.Figure:
    """A chart's title (short: half a 1280 px page holds about 45 characters), what it measures
    below it, and the legend under the time axis's date line."""
    fig.update_layout(
        title=dict(text=title, subtitle=dict(text=subtitle)) if subtitle else title,
        height=height,
        margin=dict(l=40, r=10, t=64 if subtitle else 40, b=30),
        legend=dict(orientation="h", y=-0.2, yanchor="top"),
        hovermode="x unified",
    )
    return fig


def gapped(series: pd.DataFrame, x: str = "bucket") -> pd.DataFrame:
    """One series with an empty row inserted where it has a hole (a step over twice its usual),
    so the line breaks across an outage instead of being drawn straight through it."""
    if len(series) < 3:
        return series
    s = series.sort_values(x)
    steps = s[x].diff()
    usual = steps.median()
    holes = s[steps > 2 * usual]
    if holes.empty:
        return s
    blanks = pd.DataFrame({x: holes[x] - usual}).reindex(columns=s.columns)
    return pd.concat([s, blanks]).sort_values(x, kind="stable")


def tokens_per_gpu_figure(tpg: pd.DataFrame) -> go.Figure:
    """One panel per pool: the scales differ by three orders of magnitude."""
    panels = [
        ("Prefill pool", ["prefill logical", "prefill computed"]),
        ("Decode pool", ["decode"]),
        ("Rack (prefill prompt + decode generated) / all GPUs", ["rack logical"]),
    ]
    fig = make_subplots(
        rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=[p[0] for p in panels]
    )
    for row, (_, names) in enumerate(panels, start=1):
        for name in names:
            s = gapped(tpg[tpg["series"] == name])
            pool = name.split()[0]
            fig.add_trace(
                go.Scatter(
                    x=s["bucket"],
                    y=s["value"],
                    name=name,
                    mode="lines+markers",
                    marker=dict(size=4),
                    line=dict(color=POOL_COLORS[pool], dash="dot" if "computed" in name else "solid"),
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="tok/s/GPU", row=row, col=1, rangemode="tozero")
    return _layout(fig, "Tokens/s per GPU", height=560)


def latency_figure(quantiles: pd.DataFrame, title: str) -> go.Figure:
    """Quantile lines per pool, in milliseconds."""
    fig = go.Figure()
    for (role, qt), g in quantiles.groupby(["role", "quantile"], sort=True):
        g = gapped(g)
        fig.add_trace(
            go.Scatter(
                x=g["bucket"],
                y=g["value"] * 1000.0,
                mode="lines+markers",
                marker=dict(size=4),
                name=f"{role} p{int(round(qt * 100))}",
                line=dict(color=POOL_COLORS.get(role, "#7f7f7f"), dash=QUANTILE_DASH.get(qt, "solid")),
            )
        )
    fig.update_yaxes(title_text="ms", rangemode="tozero")
    return _layout(fig, title)


def per_user_figure(per_user: pd.DataFrame) -> go.Figure:
    per_user = gapped(per_user)
    fig = go.Figure(
        go.Scatter(
            x=per_user["bucket"],
            y=per_user["value"],
            mode="lines+markers",
            marker=dict(size=4),
            name="P90 per-user tok/s",
            line=dict(color=POOL_COLORS["decode"]),
        )
    )
    fig.add_hline(
        y=P90_PER_USER_REFERENCE,
        line_dash="dot",
        line_color="#7f7f7f",
        annotation_text=f"write-up: {P90_PER_USER_REFERENCE:.0f} tok/s",
        annotation_position="bottom right",
    )
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero")
    return _layout(fig, "P90 per-user decode tok/s", subtitle="1 / P90 of per-request mean inter-token latency")


def queue_figure(gauges: pd.DataFrame) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, subplot_titles=["Running requests", "Waiting requests"])
    for role, g in gauges.groupby("role"):
        g = gapped(g)
        color = POOL_COLORS.get(str(role), "#7f7f7f")
        fig.add_trace(
            go.Scatter(x=g["bucket"], y=g["running"], name=f"{role} running", line=dict(color=color)), row=1, col=1
        )
        fig.add_trace(
            go.Scatter(x=g["bucket"], y=g["waiting"], name=f"{role} waiting", line=dict(color=color, dash="dash")),
            row=1,
            col=2,
        )
    _layout(fig, "Requests (sum over engines)", height=340)
    return fig.update_layout(margin_t=72, legend_y=-0.28)  # room for the subplots' own titles and dates


def kv_figure(gauges: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for role, g in gauges.groupby("role"):
        g = gapped(g)
        color = POOL_COLORS.get(str(role), "#7f7f7f")
        fig.add_trace(go.Scatter(x=g["bucket"], y=g["kv_mean"] * 100, name=f"{role} mean", line=dict(color=color)))
        fig.add_trace(
            go.Scatter(x=g["bucket"], y=g["kv_max"] * 100, name=f"{role} max", line=dict(color=color, dash="dot"))
        )
    fig.update_yaxes(title_text="% of KV cache", range=[0, 100])
    return _layout(fig, "KV-cache usage (mean and busiest engine)")


def gpu_heatmap(latest: pd.DataFrame, column: str, title: str, unit: str) -> go.Figure:
    """Trays down, GPUs across: every GPU of the rack in one glance."""
    if latest.empty:
        return _layout(go.Figure(), title)
    grid = latest.pivot_table(index="target", columns="gpu", values=column, aggfunc="first")
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=[f"GPU {c}" for c in grid.columns],
            y=list(grid.index),
            colorscale="Viridis",
            colorbar=dict(title=unit),
            hovertemplate="%{y} %{x}: %{z:.0f} " + unit + "<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title, height=520)


def gpu_time_figure(df: pd.DataFrame) -> go.Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=df["bucket"], y=df["util_pct"], name="mean GPU util %"), secondary_y=False)
    fig.add_trace(go.Scatter(x=df["bucket"], y=df["power_watts"] / 1000.0, name="rack GPU power kW"), secondary_y=True)
    fig.update_yaxes(title_text="%", range=[0, 100], secondary_y=False)
    fig.update_yaxes(title_text="kW", rangemode="tozero", secondary_y=True)
    return _layout(fig, "GPU utilisation and power")
