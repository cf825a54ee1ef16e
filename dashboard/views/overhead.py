"""CPU overhead page: how much of each engine step is not the forward pass, per pool and engine,
and did a deploy change it? (performance engineer)"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import httpx
import streamlit as st

from dashboard.data import live
from dashboard.data import overhead as data
from dashboard.figures import overhead as figures
from dashboard.source import api_url, query, show_api_error
from dashboard.widgets import metric_columns
from moemeter.contract import windows


def _ms(v: float) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.3f} ms"


def render() -> None:
    latest = live.latest_scrape_time(query)
    choice = (
        st.segmented_control("Time range", windows.RECENT, format_func=windows.label, default="15m", key="ovh_range")
        or "15m"
    )
    if latest is None:
        st.info(f"No scrapes stored yet in the warehouse behind {api_url()}.")
        return
    w = live.recent(query, latest, choice)
    steps = data.step_time(query, w)
    if steps.empty:
        st.info(
            "No step-phase data in this window: it comes from vLLM instances running the moemeter plugin "
            "(or the twin) once the collectors have scraped them twice."
        )
        return
    stacks = ", ".join(sorted(s for s in live.targets(query)["stack"].dropna().unique() if s)) or "unnamed stack"
    st.caption(f"Observing **{stacks}** · step {w.step_seconds}s · CPU overhead = step wall time − forward")
    whole = data.per_step(steps.assign(bucket=0), by=("pool",))
    cols = metric_columns(max(1, 2 * len(whole)))
    for i, r in enumerate(whole.itertuples()):
        cols[2 * i].metric(
            f"{r.pool}: CPU overhead", _ms(r.overhead), help=f"CPU overhead per engine step, of {_ms(r.wall)} wall"
        )
        cols[2 * i + 1].metric(f"{r.pool}: device idle", f"{r.idle_fraction:.1%}")
    over_time = data.per_step(steps)
    pools = sorted(over_time["pool"].unique())
    charts = st.columns(max(1, len(pools)))
    for col, pool in zip(charts, pools):
        col.plotly_chart(
            figures.phases_figure(
                data.long_phases(over_time[over_time["pool"] == pool]), f"{pool}: time per engine step by phase"
            ),
            key=f"phases_{pool}",
        )
    st.plotly_chart(figures.idle_figure(over_time), key="idle")

    st.subheader("Per engine")
    pool = st.selectbox("Pool", pools, key="ovh_pool")
    engines = data.per_step(steps[steps["pool"] == pool].assign(bucket=0), by=("target", "engine"))
    engines["engine_key"] = engines["target"] + "/" + engines["engine"].astype(str)
    long = engines.melt(id_vars=["engine_key"], value_vars=[*data.PHASES, "other"], var_name="phase", value_name="ms")
    st.plotly_chart(figures.phases_figure(long, f"{pool}: ms per step by engine", x="engine_key"), key="engines")
    st.caption("Milliseconds per engine step over the window, by phase; idle = 1 - forward / wall.")
    ms = {p: st.column_config.NumberColumn(p, format="%.3f") for p in (*data.PHASES, "other", "wall", "overhead")}
    st.dataframe(
        engines.drop(columns=["engine_key"]).assign(idle_fraction=engines["idle_fraction"] * 100),
        hide_index=True,
        key="engine_table",
        column_config={
            **ms,
            "idle_fraction": st.column_config.NumberColumn("idle", format="%.1f%%"),
            "steps": st.column_config.NumberColumn("steps", format="compact"),
        },
    )

    st.plotly_chart(figures.api_delay_figure(data.api_server_delay(query, w)), key="api_delay")

    st.subheader("Before / after")
    c = st.columns(2)
    mid = latest - windows.span(choice) / 2
    a = c[0].slider(
        "Window A (UTC)",
        min_value=latest - timedelta(days=7),
        max_value=latest,
        value=(latest - windows.span(choice), mid),
        format="MM-DD HH:mm",
        key="win_a",
    )
    b = c[1].slider(
        "Window B (UTC)",
        min_value=latest - timedelta(days=7),
        max_value=latest,
        value=(mid, latest),
        format="MM-DD HH:mm",
        key="win_b",
    )
    table = data.compare(query, _pair(a), _pair(b))
    st.dataframe(
        table,
        hide_index=True,
        key="compare",
        column_config={
            "A_ms": st.column_config.NumberColumn("A ms/step", format="%.3f"),
            "B_ms": st.column_config.NumberColumn("B ms/step", format="%.3f"),
            "change_pct": st.column_config.NumberColumn("change", format="%+.1f%%"),
        },
    )


def _pair(v: tuple[datetime, datetime]) -> tuple[datetime, datetime]:
    return (v[0], v[1])


st.title("CPU overhead")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
