"""CPU overhead figures: DataFrames from dashboard.data.overhead in, Plotly figures out."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .live import _layout

PHASE_COLORS = {
    "forward": "#2ca02c",
    "schedule": "#1f77b4",
    "prepare_inputs": "#ff7f0e",
    "sample": "#9467bd",
    "update": "#8c564b",
    "other": "#7f7f7f",
}


def phases_figure(long: pd.DataFrame, title: str, x: str = "bucket") -> go.Figure:
    """Stacked ms per engine step by phase; the forward pass at the bottom, overhead above it."""
    fig = go.Figure()
    for phase in ("forward", "schedule", "prepare_inputs", "sample", "update", "other"):
        s = long[long["phase"] == phase]
        if s.empty:
            continue
        if x == "bucket":
            fig.add_trace(
                go.Scatter(
                    x=s[x],
                    y=s["ms"],
                    name=phase,
                    stackgroup="one",
                    mode="lines",
                    line=dict(width=0.5, color=PHASE_COLORS[phase]),
                )
            )
        else:
            fig.add_trace(go.Bar(x=s[x].astype(str), y=s["ms"], name=phase, marker_color=PHASE_COLORS[phase]))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="ms per step", rangemode="tozero")
    fig = _layout(fig, title)
    if x != "bucket":  # engines' names stand turned under the bars: the legend goes below them
        fig.update_layout(legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"), margin_b=40)
    return fig


def idle_figure(table: pd.DataFrame) -> go.Figure:
    """Device-idle fraction (1 - forward / wall) per pool over time."""
    fig = go.Figure()
    for pool, g in table.groupby("pool"):
        fig.add_trace(
            go.Scatter(x=g["bucket"], y=g["idle_fraction"], name=str(pool), mode="lines+markers", marker=dict(size=4))
        )
    fig.update_yaxes(title_text="fraction of step", range=[0, 1])
    return _layout(fig, "Device-idle fraction of each step (1 - forward / wall)")


def api_delay_figure(delay: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for col, name in (
        ("api_delay_ms", "API-server delay (TTFT - queue - prefill)"),
        ("api_output_ms", "API-server output handling per batch"),
    ):
        fig.add_trace(go.Scatter(x=delay["bucket"], y=delay[col], name=name, mode="lines+markers", marker=dict(size=4)))
    fig.update_yaxes(title_text="ms", rangemode="tozero")
    return _layout(fig, "Time outside the engine, per prefill request")
