"""Fleet page figures: the racks side by side. DataFrames from dashboard.data.fleet in, Plotly out."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .live import POOL_COLORS, _layout


def racks_figure(lines: pd.DataFrame) -> go.Figure:
    """$/M input and output per rack, and each rack's tokens/s per GPU: which rack costs most per
    million tokens, and whether it is because it serves fewer."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["$ per million tokens", "tokens/s per GPU (rack)"])
    for col, name, color in (
        ("usd_per_mtok_input", "$/M input (computed)", POOL_COLORS["prefill"]),
        ("usd_per_mtok_output", "$/M output", POOL_COLORS["decode"]),
    ):
        fig.add_trace(go.Bar(x=lines["rack"], y=lines[col], name=name, marker_color=color), row=1, col=1)
    fig.add_trace(
        go.Bar(
            x=lines["rack"],
            y=lines["tokens_per_second_per_gpu"],
            name="tokens/s per GPU",
            marker_color=POOL_COLORS["rack"],
        ),
        row=1,
        col=2,
    )
    fig.update_xaxes(type="category")
    _layout(fig, "Racks", height=360)
    fig.update_layout(hovermode="closest", barmode="group")
    return fig
