"""Experts page figures: DataFrames from dashboard.data.experts in, Plotly figures out."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .live import _layout


def _whole_ticks(fig: go.Figure, axis: str, count: int) -> None:
    """Integer ticks only (layers, experts, ranks), at most ~20 of them: never 0.5."""
    fig.update_layout({f"{axis}axis": dict(tickmode="linear", tick0=0, dtick=max(1, -(-count // 20)))})


def expert_heatmap(shares: pd.DataFrame, log: bool = False) -> go.Figure:
    """Layer x logical expert: share of the layer's tokens, on Viridis (perceptually uniform, so
    equal steps of colour are equal steps of share); `log` colours by log10 of the share, for hot
    experts among many cold ones (an expert with no tokens is then left blank)."""
    if shares.empty:
        return _layout(go.Figure(), "Layer x expert: share of tokens")
    m = shares.pivot_table(index="layer", columns="expert", values="share", aggfunc="sum").fillna(0.0)
    pct = m.to_numpy() * 100
    colorbar: dict[str, object] = dict(title="% of layer")
    z = pct
    if log:
        with np.errstate(divide="ignore"):
            z = np.where(pct > 0, np.log10(np.where(pct > 0, pct, 1.0)), np.nan)
        finite = z[np.isfinite(z)]
        if finite.size:
            decades = np.arange(np.floor(finite.min()), np.ceil(finite.max()) + 1)
            colorbar.update(tickvals=decades.tolist(), ticktext=[f"{10**d:g}%" for d in decades])
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(m.columns),
            y=list(m.index),
            colorscale="Viridis",
            colorbar=colorbar,
            customdata=pct,
            hovertemplate="layer %{y} expert %{x}: %{customdata:.2f}%<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="logical expert")
    fig.update_yaxes(title_text="layer", autorange="reversed")
    _whole_ticks(fig, "x", m.shape[1])
    _whole_ticks(fig, "y", m.shape[0])
    title = "Layer x expert: share of the layer's tokens" + (" (log colour)" if log else "")
    return _layout(fig, title, height=460)


def rank_heatmap(matrix: pd.DataFrame) -> go.Figure:
    """Layer x rank: load as a multiple of the layer's mean rank load (1.0 = even)."""
    if matrix.empty:
        return _layout(go.Figure(), "Layer x rank load")
    fig = go.Figure(
        go.Heatmap(
            z=matrix.to_numpy(),
            x=list(matrix.columns),
            y=list(matrix.index),
            colorscale="RdBu_r",
            zmid=1.0,
            colorbar=dict(title="x mean"),
            hovertemplate="layer %{y} rank %{x}: %{z:.2f}x mean<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="EP rank")
    fig.update_yaxes(title_text="layer", autorange="reversed")
    _whole_ticks(fig, "x", matrix.shape[1])
    _whole_ticks(fig, "y", matrix.shape[0])
    return _layout(fig, "Layer x rank: load / layer mean", height=460)


def _rebalance_lines(fig: go.Figure, events: pd.DataFrame, dense: int = 40) -> None:
    """A dashed vertical line per EPLB rebalance, all set in one layout update (one `add_vline`
    per event copies every shape so far: 288 rebalances, a day's, took 14 s per figure). Past
    `dense` events, lines would hide the data: one tick per rebalance along the top instead."""
    ts = list(events.get("ts", []))
    if len(ts) <= dense:
        fig.update_layout(
            shapes=[
                dict(
                    type="line",
                    xref="x",
                    yref="paper",
                    x0=t,
                    x1=t,
                    y0=0,
                    y1=1,
                    line=dict(color="black", dash="dash", width=1.5),
                )
                for t in ts
            ]
        )
        return
    fig.add_trace(
        go.Scatter(
            x=ts,
            y=[1.0] * len(ts),
            yaxis="y3",
            mode="markers",
            name="EPLB rebalance",
            marker=dict(symbol="line-ns-open", size=12, color="black"),
            hovertemplate="rebalance at %{x}<extra></extra>",
        )
    )
    fig.update_layout(yaxis3=dict(overlaying="y", range=[0, 1.02], visible=False, fixedrange=True))


def balancedness_figure(bal: pd.DataFrame, events: pd.DataFrame) -> go.Figure:
    """Layer x time heatmap of balancedness, rebalances as vertical lines."""
    if bal.empty:
        return _layout(go.Figure(), "Balancedness per layer over time")
    m = bal.pivot_table(index="layer", columns="bucket", values="balancedness")
    fig = go.Figure(
        go.Heatmap(
            z=m.to_numpy(),
            x=list(m.columns),
            y=list(m.index),
            colorscale="RdYlGn",
            zmin=0.5,
            zmax=1.0,
            colorbar=dict(title="mean/max"),
            hovertemplate="layer %{y} at %{x}: %{z:.3f}<extra></extra>",
        )
    )
    _rebalance_lines(fig, events)
    # The layer axis only: the rebalance ticks' own axis keeps its fixed range (reversed and
    # autoranged, it put the ticks across the middle layer).
    fig.update_layout(yaxis=dict(title_text="layer", autorange="reversed"))
    _whole_ticks(fig, "y", len(m.index))
    return _layout(fig, "Balancedness per layer over time (black: EPLB rebalances)", height=460)


def balancedness_summary_figure(bal: pd.DataFrame, events: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    if not bal.empty:
        g = bal.groupby("bucket")
        fig.add_trace(
            go.Scatter(
                x=list(g.groups),
                y=g["balancedness"].mean(),
                name="mean over layers",
                mode="lines+markers",
                marker=dict(size=4),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=list(g.groups),
                y=g["balancedness"].min(),
                name="worst layer",
                mode="lines+markers",
                marker=dict(size=4),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=list(g.groups),
                y=g["imbalance"].max(),
                name="max/mean (worst layer)",
                mode="lines",
                yaxis="y2",
                line=dict(dash="dot"),
            )
        )
    _rebalance_lines(fig, events)
    fig.update_layout(
        yaxis=dict(title="balancedness", range=[0, 1.05]),
        yaxis2=dict(title="max/mean", overlaying="y", side="right", rangemode="tozero"),
    )
    return _layout(fig, "Balancedness and imbalance")


def placement_figure(pl: pd.DataFrame, ranks: int) -> go.Figure:
    """Rank x slot grid of the logical expert each slot holds; redundant replicas marked *."""
    if pl.empty:
        return _layout(go.Figure(), "Physical placement")
    per_rank = len(pl) // ranks
    expert = pl["expert"].to_numpy().reshape(ranks, per_rank)
    text = np.where(
        pl["replicas"].to_numpy().reshape(ranks, per_rank) > 1, np.char.add(expert.astype(str), "*"), expert.astype(str)
    )
    redundant = (pl["replicas"].to_numpy().reshape(ranks, per_rank) > 1).astype(float)
    fig = go.Figure(
        go.Heatmap(
            z=redundant,
            text=text,
            texttemplate="%{text}",
            x=[f"slot {i}" for i in range(per_rank)],
            y=[f"rank {r}" for r in range(ranks)],
            colorscale=[[0, "#f0f0f0"], [1, "#fdae6b"]],
            showscale=False,
            hovertemplate="%{y} %{x}: expert %{text}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "Physical placement (expert id per slot; * = replicated expert)", height=max(360, 14 * ranks))


def what_if_figure(df: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=df["layer"], y=df["current_balancedness"], name="current placement", mode="lines+markers")
    )
    fig.add_trace(go.Scatter(x=df["layer"], y=df["planned_balancedness"], name="planned", mode="lines+markers"))
    fig.update_xaxes(title_text="layer")
    _whole_ticks(fig, "x", len(df))
    fig.update_yaxes(title_text="balancedness", range=[0, 1.05])
    return _layout(fig, "What-if: predicted balancedness per layer on the observed load")
