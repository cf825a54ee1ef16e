"""Speculative decoding page: what a decode step buys: how many drafted tokens the target model
accepts, per pool, engine and draft position, what the rejected ones cost. (performance engineer,
finance)"""

from __future__ import annotations

import math

import httpx
import pandas as pd
import streamlit as st

from dashboard.data import cost as cost_data
from dashboard.data import dp, live
from dashboard.data import spec as data
from dashboard.figures import dp as dp_figures
from dashboard.figures import spec as figures
from dashboard.source import api_url, query, show_api_error
from dashboard.widgets import metric_columns
from moemeter.contract import windows


def _pct(v: float | None) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def _usd(v: float | None) -> str:
    return "—" if v is None else f"${v:,.4f}"


ENGINE_COLUMNS = {
    "label": st.column_config.TextColumn("engine"),
    "mean_acceptance_length": st.column_config.NumberColumn(
        "tokens/step", format="%.2f", help="mean acceptance length: 1 + accepted / drafts"
    ),
    "acceptance_rate": st.column_config.NumberColumn("acceptance", format="percent", help="accepted / draft tokens"),
    "drafts": st.column_config.NumberColumn("drafts", format="localized"),
    "draft_tokens": st.column_config.NumberColumn("draft tokens", format="localized"),
    "accepted_tokens": st.column_config.NumberColumn("accepted", format="localized"),
    "rejected_share": st.column_config.NumberColumn(
        "rejected share", format="percent", help="share of the engine's decode compute spent on rejected drafts"
    ),
}
COUNTED = ["drafts", "draft_tokens", "accepted_tokens"]  # whole counts the window's edges prorate: shown rounded


def render() -> None:
    latest = live.latest_scrape_time(query)
    choice = (
        st.segmented_control("Time range", windows.RECENT, format_func=windows.label, default="15m", key="spec_range")
        or "15m"
    )
    if latest is None:
        st.info(f"No scrapes stored yet in the warehouse behind {api_url()}.")
        return
    w = live.recent(query, latest, choice)
    drafting = data.drafting(query, w)
    if drafting.empty:
        st.info(
            "No speculative decoding in this window: vLLM exports `vllm:spec_decode_*` only from instances "
            "started with a speculative config (`--speculative-config`), once the collectors have scraped them twice."
        )
        return
    pools = drafting.window("pool")
    decode = pools[pools["role"] == "decode"]
    head = decode.iloc[0] if len(decode) else pools.iloc[0]
    split = _cost_split(w, drafting)
    st.caption(
        f"step {w.step_seconds}s · mean acceptance length = 1 + accepted / drafts (vLLM's convention) · "
        "the rejected drafts' share of decode compute is an estimate: " + data.REJECTED_BASIS
    )
    m = metric_columns(5)
    m[0].metric("Mean acceptance length", f"{head.mean_acceptance_length:.2f}", help="tokens per request per step")
    m[1].metric("Acceptance rate", _pct(head.acceptance_rate), help="accepted / draft tokens")
    m[2].metric("Draft tokens", f"{head.draft_tokens:,.0f}", help=f"{head.accepted_tokens:,.0f} accepted")
    m[3].metric("Decode compute on rejected drafts", _pct(head.rejected_share))
    parts = split.parts() if split else {}
    m[4].metric(
        "Decode $/M output: rejected drafts",
        _usd(parts.get("rejected_drafts")),
        help=f"of {_usd(parts.get('usd_per_mtok_output'))}/M output tokens; "
        f"{_usd(parts.get('accepted_output'))} pays for accepted output",
    )
    over_time = drafting.over_time("pool")
    c1, c2 = st.columns(2)
    c1.plotly_chart(figures.acceptance_length_figure(over_time), key="spec_length")
    c2.plotly_chart(figures.position_figure(data.position_rates(pools)), key="spec_positions")
    c3, c4 = st.columns(2)
    c3.plotly_chart(figures.drafted_figure(over_time, w.step_seconds), key="spec_drafted")
    c4.plotly_chart(figures.rejected_share_figure(over_time), key="spec_rejected")

    st.subheader("Per engine")
    engines = drafting.window("engine")
    engines["label"] = [dp.engine_label(t, e) for t, e in zip(engines["target"], engines["engine"])]
    engines = engines.sort_values("mean_acceptance_length", kind="stable").round({c: 0 for c in COUNTED})
    st.caption(
        "Lowest acceptance first: an engine whose drafts are rejected emits fewer tokens a step while its queue "
        "stays short; a straggler's queue grows (DP ranks page)."
    )
    st.dataframe(engines[list(ENGINE_COLUMNS)], hide_index=True, column_config=ENGINE_COLUMNS, key="spec_engines")
    grid = dp.grid(_engine_steps(drafting), "mean_acceptance_length")
    st.plotly_chart(
        dp_figures.engine_heatmap(grid, "Mean acceptance length per engine", "tokens/step"), key="spec_heatmap"
    )
    st.caption(
        "Per tenant: not shown. vLLM counts drafts per engine, not per request, and its request output carries "
        "no acceptance, so the gateway cannot attribute accepted or rejected drafts to a tenant without guessing."
    )


def _engine_steps(drafting: data.Drafting) -> pd.DataFrame:
    steps = drafting.over_time("engine", positions=False)
    steps["label"] = [dp.engine_label(t, e) for t, e in zip(steps["target"], steps["engine"])]
    return steps


def _cost_split(w: live.Window, drafting: data.Drafting) -> data.CostSplit | None:
    """The decode pool's cost over the window at the price sheet in force (the Cost page's), split by
    the window's drafts (read once, for the whole page)."""
    try:
        report = cost_data.cost_report(query, cost_data.pools(query, w.start, w.end), w.start, w.end)
    except (cost_data.NoData, ValueError):
        return None
    return drafting.cost_split(report.decode.cost_usd, report.generated_tokens)


st.title("Speculative decoding")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
