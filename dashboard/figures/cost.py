"""Cost page figures: DataFrames from dashboard.data.cost in, Plotly figures out. No Streamlit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from moemeter.contract import computed_tokens

from .live import POOL_COLORS, _layout


def per_mtok_figure(over: pd.DataFrame) -> go.Figure:
    """$/M input, output and blended per step, with the tokens and GPU-hours that produced them."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=["$ per million tokens", "tokens", "GPU-hours (reserved, busy or idle)"],
    )
    for col, name, color, dash in (
        ("usd_per_mtok_input", "$/M input (computed)", POOL_COLORS["prefill"], "solid"),
        ("usd_per_mtok_output", "$/M output", POOL_COLORS["decode"], "solid"),
        ("usd_per_mtok_blended", "$/M blended", POOL_COLORS["rack"], "dot"),
    ):
        fig.add_trace(
            go.Scatter(
                x=over["bucket"],
                y=over[col],
                name=name,
                mode="lines+markers",
                marker=dict(size=4),
                line=dict(color=color, dash=dash),
                connectgaps=False,
            ),
            row=1,
            col=1,
        )
    computed = computed_tokens(over["prompt_tokens"], over["cached_prompt_tokens"])
    for y, name, color in (
        (computed, "prompt, computed", POOL_COLORS["prefill"]),
        (over["cached_prompt_tokens"], "prompt, cache hits", "#aec7e8"),
        (over["generated_tokens"], "generated", POOL_COLORS["decode"]),
    ):
        fig.add_trace(go.Bar(x=over["bucket"], y=y, name=name, marker_color=color), row=2, col=1)
    for col, name, color in (
        ("prefill_gpu_hours", "prefill GPU-h", POOL_COLORS["prefill"]),
        ("decode_gpu_hours", "decode GPU-h", POOL_COLORS["decode"]),
    ):
        fig.add_trace(go.Bar(x=over["bucket"], y=over[col], name=name, marker_color=color, opacity=0.6), row=3, col=1)
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="USD / M tokens", rangemode="tozero", row=1, col=1)
    return _layout(fig, "Cost per million tokens over time", height=640)
