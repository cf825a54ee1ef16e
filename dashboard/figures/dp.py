"""DP ranks page figures: engine x time heatmaps from dashboard.data.dp. No Streamlit."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from .live import _layout


def engine_heatmap(grid: pd.DataFrame, title: str, unit: str, zmax: float | None = None) -> go.Figure:
    """Engines down (in DP-rank order), steps across; a perceptually uniform scale, so the one
    engine that runs apart from its pool stands out as a row."""
    if grid.empty:
        return _layout(go.Figure(), title)
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(dtype=float),
            x=list(grid.columns),
            y=list(grid.index),
            colorscale="Viridis",
            zmin=None if zmax is None else 0,
            zmax=zmax,
            colorbar=dict(title=unit),
            hovertemplate="%{y}<br>%{x}: %{z:,.2f} " + unit + "<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", type="category")
    _layout(fig, title, height=max(320, 9 * len(grid) + 120))
    return fig.update_layout(hovermode="closest")  # one cell, not a whole column
