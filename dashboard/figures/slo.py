"""SLO page figures: DataFrames from dashboard.data.slo in, Plotly figures out. No Streamlit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .live import P90_PER_USER_REFERENCE, RACK_PER_GPU_REFERENCE, SINGLE_USER_REFERENCE, _layout, gapped

CLASS_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#17becf")


def class_color(name: str, classes: list[str]) -> str:
    """One colour per class on every chart of the page: by its place among the classes in effect."""
    return CLASS_COLORS[sorted(classes).index(name) % len(CLASS_COLORS)] if name in classes else "#7f7f7f"


def attainment_figure(over: pd.DataFrame, objectives: dict[str, float]) -> go.Figure:
    """Attainment per step and class (percent), each class's objective as a dotted line of its colour."""
    fig = go.Figure()
    for name, df in over.groupby("class", sort=True):
        color = class_color(name, list(objectives))
        label = name or "(no class)"
        df = gapped(df.assign(pct=100 * df["attainment"]))
        fig.add_trace(
            go.Scatter(
                x=df["bucket"],
                y=df["pct"],
                name=label,
                mode="lines+markers",
                line=dict(color=color),
                customdata=df[["met", "held"]],
                hovertemplate=f"{label}: %{{y:.2f}}% (%{{customdata[0]}} of %{{customdata[1]}})<extra></extra>",
            )
        )
        if name in objectives:
            fig.add_hline(
                y=100 * objectives[name],
                line=dict(color=color, dash="dot"),
                annotation_text=f"{label} objective {100 * objectives[name]:g}%",
                annotation_position="bottom left",
            )
    fig.update_yaxes(title_text="met / held, %", rangemode="tozero")
    return _layout(fig, "Attainment per class", subtitle="requests that met every target of their class")


def operating_point_figure(points: pd.DataFrame) -> go.Figure:
    """The rack on the throughput-interactivity plane: tokens/s per GPU against P90 per-user tokens/s,
    one point per step (coloured by the decode pool's mean acceptance length where it drafts), the
    latest highlighted, the write-up's published points for reference."""
    fig = go.Figure()
    if len(points):
        length = points["acceptance_length"] if "acceptance_length" in points else pd.Series(dtype=float)
        drafting = bool(length.notna().any())
        text = [f"{b:%m-%d %H:%M}" for b in pd.to_datetime(points["bucket"])]
        if drafting:  # each step coloured by the decode pool's mean acceptance length
            text = [f"{t}, acceptance length {v:.2f}" for t, v in zip(text, length, strict=True)]
        fig.add_trace(
            go.Scatter(
                x=points["tps_per_user"],
                y=points["tps_per_gpu"],
                mode="markers",
                name="this rack, per step",
                marker=dict(
                    color=length if drafting else "#9ecae1",
                    colorscale="Viridis" if drafting else None,
                    colorbar=dict(title="acceptance<br>length", x=1.02) if drafting else None,
                    showscale=drafting,
                    size=7,
                ),
                text=text,
                hovertemplate="%{text}: %{y:,.0f} tok/s/GPU at P90 %{x:,.1f} tok/s/user<extra></extra>",
            )
        )
        last = points.iloc[-1]
        at = (
            f", acceptance length {last['acceptance_length']:.2f}"
            if drafting and pd.notna(last["acceptance_length"])
            else ""
        )
        fig.add_trace(
            go.Scatter(
                x=[last["tps_per_user"]],
                y=[last["tps_per_gpu"]],
                mode="markers",
                name=f"latest ({pd.Timestamp(last['bucket']):%H:%M}{at})",
                marker=dict(color="#08519c", size=14, symbol="diamond"),
                hovertemplate="latest: %{y:,.0f} tok/s/GPU at P90 %{x:,.1f} tok/s/user<extra></extra>",
            )
        )
    fig.add_trace(  # a trace, not an annotation: on log axes plotly places annotations at log10 of x
        go.Scatter(
            x=[P90_PER_USER_REFERENCE],
            y=[RACK_PER_GPU_REFERENCE],
            mode="markers+text",
            name="write-up: 954,000 tok/s/GPU at P90 196",
            marker=dict(color="#d62728", size=12, symbol="star"),
            text=["write-up"],
            textposition="bottom center",
            hovertemplate="write-up: %{y:,.0f} tok/s/GPU at P90 %{x:.0f} tok/s/user<extra></extra>",
        )
    )
    fig.add_vline(x=SINGLE_USER_REFERENCE, line=dict(color="#d62728", dash="dot"))
    fig.add_trace(  # the line's legend entry (a shape has none)
        go.Scatter(
            x=[None],
            y=[None],
            mode="lines",
            line=dict(color="#d62728", dash="dot"),
            name=f"write-up: {SINGLE_USER_REFERENCE:.0f} tok/s for a single user",
        )
    )
    fig.update_xaxes(type="log", title_text="P90 per-user tokens/s (interactivity)")
    fig.update_yaxes(type="log", title_text="rack tokens/s per GPU (logical)")
    fig = _layout(fig, "Operating point", height=420, subtitle="throughput against interactivity, per step")
    fig.update_layout(hovermode="closest")
    return fig


def budget_figure(over: pd.DataFrame, start: object = None, end: object = None) -> go.Figure:
    """Error budget left per class (percent of its period's budget) at each whole hour and at the
    window's end, over the window [start, end); at 0 the budget is spent, below it overspent. A
    class with nothing held over its period has no line."""
    fig = go.Figure()
    classes = sorted(set(over["class"]))
    for name, df in over.groupby("class", sort=True):
        df = df.dropna(subset=["budget_left"]).sort_values("ts")
        if df.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=df["ts"],
                y=100 * df["budget_left"].astype(float),
                name=name,
                mode="lines+markers",
                line=dict(color=class_color(name, classes)),
                hovertemplate=f"{name}: %{{y:.1f}}% of the budget left<extra></extra>",
            )
        )
    fig.add_hline(y=0, line=dict(color="#d62728", dash="dot"), annotation_text="budget spent")
    fig.update_yaxes(title_text="budget left, %")
    if start is not None and end is not None:
        fig.update_xaxes(range=[start, end])
    return _layout(fig, "Error budget left per class", subtitle="over each class's period, at each whole hour")
