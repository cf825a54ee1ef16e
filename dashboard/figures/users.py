"""Users page figures: DataFrames from dashboard.data.users in, Plotly figures out. No Streamlit."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from moemeter.contract import computed_tokens
from moemeter.contract.requests import user_of_tenant

from .live import P90_PER_USER_REFERENCE, POOL_COLORS, _layout


def tps_distribution_figure(hist: pd.DataFrame, p50: float, p90: float) -> go.Figure:
    """Requests by per-user tokens/s (log x), with P50 and P90 (the slow tail) marked."""
    fig = go.Figure(
        go.Bar(
            x=hist["tokens_per_second"],
            y=hist["requests"],
            name="requests",
            marker_color=POOL_COLORS["decode"],
            hovertemplate="%{x:.0f} tok/s: %{y} requests<extra></extra>",
        )
    )
    # On a log axis plotly.js places a shape at the data value but an annotation at log10 of it
    # (a label at x=212 sat at 10^212 and stretched the axis there), so the two are set apart.
    # The slow tail (P90, fewer tok/s) is labelled to the left of its line, P50 to the right.
    for value, name, dash, side in ((p50, "P50", "solid", "left"), (p90, "P90", "dash", "right")):
        if math.isfinite(value) and value > 0:
            fig.add_shape(
                type="line",
                x0=value,
                x1=value,
                xref="x",
                y0=0,
                y1=1,
                yref="paper",
                line=dict(color="#333333", dash=dash),
            )
            fig.add_annotation(
                x=math.log10(value),
                xref="x",
                y=1,
                yref="paper",
                yanchor="bottom",
                xanchor=side,
                text=f"{name} {value:,.0f}",
                showarrow=False,
            )
    fig.update_xaxes(type="log", title_text="per-user tokens/s (1 / mean inter-token latency)")
    fig.update_yaxes(title_text="requests")
    return _layout(fig, "Distribution of per-user tokens/s", height=340)


def tps_over_time_figure(over: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    for col, name, dash in (("tps_p50", "P50", "solid"), ("tps_p90", "P90 (slow tail)", "dash")):
        fig.add_trace(
            go.Scatter(
                x=over["bucket"],
                y=over[col],
                name=name,
                mode="lines+markers",
                marker=dict(size=4),
                line=dict(color=POOL_COLORS["decode"], dash=dash),
            )
        )
    fig.add_hline(
        y=P90_PER_USER_REFERENCE,
        line_dash="dot",
        line_color="#7f7f7f",
        annotation_text=f"write-up P90 {P90_PER_USER_REFERENCE:.0f}",
    )
    fig.update_yaxes(title_text="tokens/s", rangemode="tozero")
    return _layout(fig, "Per-user tokens/s over time")


def top_users_figure(table: pd.DataFrame) -> go.Figure:
    """Stacked bars of prompt (computed, cached) and generated tokens for the top users, each named
    with its tenant when the table has one (two tenants' users of one name are two bars)."""
    t = table.iloc[::-1]
    who = [user_of_tenant(u, g) for u, g in zip(t["user_id"], t["tenant"])] if "tenant" in t else t["user_id"]
    computed = computed_tokens(t["prompt_tokens"], t["cached_prompt_tokens"])
    fig = go.Figure()
    for values, name, color in (
        (computed, "prompt, computed", "#1f77b4"),
        (t["cached_prompt_tokens"], "prompt, cached", "#aec7e8"),
        (t["generated_tokens"], "generated", POOL_COLORS["decode"]),
    ):
        fig.add_trace(go.Bar(y=who, x=values, name=name, orientation="h", marker_color=color))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="tokens")
    return _layout(fig, "Top users by tokens", height=max(300, 22 * len(t) + 90))


def user_history_figure(hist: pd.DataFrame, user: str) -> go.Figure:
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=hist["bucket"], y=hist["generated_tokens"], name="generated tokens", marker_color=POOL_COLORS["decode"]
        )
    )
    fig.add_trace(
        go.Scatter(
            x=hist["bucket"],
            y=hist["tps_mean"],
            name="mean tokens/s",
            yaxis="y2",
            mode="lines+markers",
            line=dict(color="#333333"),
        )
    )
    fig.update_layout(
        yaxis=dict(title="tokens"), yaxis2=dict(title="tokens/s", overlaying="y", side="right", rangemode="tozero")
    )
    return _layout(fig, f"{user}: tokens and per-user tokens/s")
