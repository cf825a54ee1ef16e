"""Fleet page: the racks of the lake side by side (finance, SRE, MoE engineer): which rack costs most
per million tokens, which serves its users slowest, which has the worst EPLB balance. The numbers
are each rack's own (`moemeter report cost --lake`); the sidebar's rack opens its pages."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import pandas as pd
import streamlit as st

from dashboard.data import fleet as data
from dashboard.figures import fleet as figures
from dashboard.source import lake_query, lake_uri, lake_watermarks, show_api_error
from dashboard.widgets import metric_columns, usd
from moemeter.contract import windows

BEHIND = timedelta(minutes=5)  # a rack this far behind the newest drags the window back: say so


@st.cache_data(ttl=60, show_spinner="Reading every rack of the lake…")
def _lines(racks: tuple[str, ...], start: datetime, end: datetime) -> pd.DataFrame:
    return data.fleet_lines({r: lake_query(r) for r in racks}, start, end)


def render() -> None:
    st.title("Fleet")
    marks = lake_watermarks()
    if not marks:
        st.info(f"No rack has published to the lake {lake_uri()} yet: `moemeter serve --lake` publishes a rack.")
        return
    choice = (
        st.segmented_control("Window (UTC)", windows.FLEET, format_func=windows.label, default="24h", key="fleet_span")
        or "24h"
    )
    w = data.FleetWindow.ending(marks, windows.span(choice))
    assert w is not None
    st.caption(
        f"{w.start:%Y-%m-%d %H:%M} .. {w.end:%Y-%m-%d %H:%M} UTC, ending a minute before the rack that has "
        "published least; a rack first seen later counts from then (unobserved time is not observed cost). "
        "Per-user tokens/s counts the closed hours in the window. SLO alerts: the classes burning their "
        "error budget at the window's end (the alert pack's burn rules); engine, scrape and cost alerts "
        "are judged on each rack's own dashboard (the lake holds no raw samples)."
    )
    newest = max(marks.values())
    if behind := [f"{r} (through {t:%Y-%m-%d %H:%M})" for r, t in marks.items() if newest - t > BEHIND]:
        st.warning(
            f"Publishing behind by over {BEHIND.total_seconds() / 60:.0f} min: {', '.join(behind)}. The window "
            "ends where the least-published rack ends, so every rack is compared over the same time; its "
            "`serve --lake` log or GET /health (`lake`) says why."
        )
    try:
        lines = _lines(tuple(marks), w.start, w.end)
    except data.QueryError as exc:
        show_api_error(exc)
        return
    cost, idle = float(lines["cost_usd"].sum()), float(lines["idle_cost_usd"].sum())
    cards = metric_columns(3)
    cards[0].metric("Racks", f"{len(lines)}", help=", ".join(lines["rack"]))
    cards[1].metric("Fleet cost", usd(cost), help="the sum of the racks' costs over the window")
    cards[2].metric("Idle cost", usd(idle), help="GPU-hours of engines that produced no token, at their price")
    if len(burning := lines[lines["slo_alerts"] != ""]):  # the table's last columns scroll on a laptop
        st.warning(
            "SLO error budgets burning at the window's end: "
            + "; ".join(f"**{r.rack}**: {r.slo_alerts}" for r in burning.itertuples())
        )
    table = lines.assign(published_through=[marks[r] for r in lines["rack"]])
    st.dataframe(
        table,
        hide_index=True,
        use_container_width=True,
        column_config={
            "rack": "Rack",
            "gpus": st.column_config.NumberColumn("GPUs", format="%d"),
            "tokens_per_second_per_gpu": st.column_config.NumberColumn("tok/s per GPU", format="%,.0f"),
            "p90_user_tokens_per_second": st.column_config.NumberColumn("P90 user tok/s", format="%.0f"),
            "usd_per_mtok_input": st.column_config.NumberColumn("$/M input", format="$%.4f"),
            "usd_per_mtok_output": st.column_config.NumberColumn("$/M output", format="$%.4f"),
            "cost_usd": st.column_config.NumberColumn("Cost", format="$%,.2f"),
            "idle_cost_usd": st.column_config.NumberColumn("Idle cost", format="$%,.2f"),
            "worst_balancedness": st.column_config.NumberColumn("Worst balancedness", format="%.2f"),
            "slo_alerts": st.column_config.TextColumn("SLO alerts"),
            "published_through": st.column_config.DatetimeColumn("Published through", format="YYYY-MM-DD HH:mm"),
        },
    )
    st.plotly_chart(figures.racks_figure(lines), use_container_width=True)
    st.caption("Open a rack's pages: pick it as the sidebar's Rack, then any page.")


try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
