"""Speculative decoding figures: DataFrames from dashboard.data.spec in, Plotly figures out. No Streamlit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .live import POOL_COLORS, _layout, gapped

ACCEPTED, REJECTED = "#2ca02c", "#d62728"


def _per_pool(over_time: pd.DataFrame, column: str, hover: str) -> go.Figure:
    """One line per pool of `column` over time."""
    fig = go.Figure()
    for role, s in over_time.groupby("role", sort=True):
        s = gapped(s)
        fig.add_trace(
            go.Scatter(
                x=s["bucket"],
                y=s[column],
                name=str(role),
                mode="lines",
                line=dict(color=POOL_COLORS.get(str(role))),
                hovertemplate=hover + "<extra>" + str(role) + "</extra>",
            )
        )
    return fig


def acceptance_length_figure(over_time: pd.DataFrame) -> go.Figure:
    """Mean acceptance length (tokens a request gains per decode step, the bonus token included)
    per pool over time."""
    fig = _per_pool(over_time, "mean_acceptance_length", "%{y:.2f} tokens/step")
    fig.update_yaxes(title="tokens per step", rangemode="tozero")
    return _layout(fig, "Mean acceptance length", subtitle="1 + accepted / drafts: tokens per request per step")


def position_figure(rates: pd.DataFrame) -> go.Figure:
    """Per draft position: the share of drafts whose token there was accepted (with every token
    before it), one bar group per pool."""
    fig = go.Figure()
    for role, s in rates.groupby("role", sort=True):
        fig.add_trace(
            go.Bar(
                x=[f"position {p + 1}" for p in s["position"]],
                y=s["rate"],
                name=str(role),
                marker_color=POOL_COLORS.get(str(role)),
                hovertemplate="%{x}: %{y:.1%} of drafts<extra>" + str(role) + "</extra>",
            )
        )
    fig.update_yaxes(title="accepted / drafts", tickformat=".0%", range=[0, 1])
    fig = _layout(fig, "Acceptance per draft position", subtitle="each position's token accepted, of all drafts")
    return fig.update_layout(hovermode="closest", barmode="group")


def drafted_figure(over_time: pd.DataFrame, step_seconds: int) -> go.Figure:
    """Each pool's draft tokens per step of the window, stacked as accepted and rejected."""
    fig = go.Figure()
    for role, s in over_time.groupby("role", sort=True):
        s = gapped(s)
        for column, name, color in (
            ("accepted_tokens", "accepted", ACCEPTED),
            ("rejected_tokens", "rejected", REJECTED),
        ):
            fig.add_trace(
                go.Scatter(
                    x=s["bucket"],
                    y=s[column],
                    name=f"{role}: {name}",
                    mode="lines",
                    stackgroup=str(role),
                    line=dict(color=color, width=1),
                    hovertemplate="%{y:,.0f} tokens<extra>" + f"{role}: {name}" + "</extra>",
                )
            )
    fig.update_yaxes(title=f"draft tokens per {step_seconds:,} s", rangemode="tozero")
    return _layout(
        fig, "Drafted tokens: accepted and rejected", subtitle=f"draft tokens in each {step_seconds:,} s step"
    )


def rejected_share_figure(over_time: pd.DataFrame) -> go.Figure:
    """The rejected drafts' share of the positions the target model verified, per pool over time."""
    fig = _per_pool(over_time, "rejected_share", "%{y:.1%}")
    fig.update_yaxes(title="share of verified positions", tickformat=".0%", rangemode="tozero")
    return _layout(fig, "Decode compute on rejected drafts", subtitle="rejected / (generated + rejected)")
