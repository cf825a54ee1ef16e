"""Experts page: where are the EPLB hot spots, did the last rebalance help, what would? (MoE engineer)"""

from __future__ import annotations

import math

import httpx
import pandas as pd
import streamlit as st
import yaml

from dashboard.data import experts as data
from dashboard.data import live
from dashboard.figures import experts as figures
from dashboard.source import api_url, picked_rack, query, show_api_error
from dashboard.widgets import compact, metric_columns
from moemeter.contract import windows

RULES = data.AlertRules()


def _pct(v: float, digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _rate(v: float) -> str:
    return "—" if v is None or math.isnan(v) else compact(v)


def _won_back(tps_after: float, won: float) -> str:
    if math.isnan(tps_after):
        return "tok/s after it not measured yet"
    return "tok/s did not rise" if math.isnan(won) else f"won back in {won:,.0f} s"


def _last_rebalance(last: pd.Series) -> None:
    """What the last rebalance cost (the engine's pause, the tokens not generated meanwhile) and
    bought (tokens/s and measured balancedness, before and after)."""
    st.subheader(f"Last rebalance ({last['ts']:%H:%M:%S}): what it cost and bought")
    c = metric_columns(4)
    c[0].metric(
        "Pause", f"{last['duration_seconds']:.2f} s", f"{int(last['moved_replicas'])} replicas moved", delta_color="off"
    )
    c[1].metric("Generated tok/s: before → after", f"{_rate(last['tps_before'])} → {_rate(last['tps_after'])}")
    c[2].metric(
        "Balancedness: before → after",
        f"{_pct(last['measured_before'], 2)} → {_pct(last['measured_after'], 2)}",  # a quarter of 1280 px
        f"planned {_pct(last['planned_after'])}",
        delta_color="off",
    )
    won = last["win_back_seconds"]
    c[3].metric(
        "Tokens to win back",
        _rate(last["tokens_lost"]),
        _won_back(last["tps_after"], won),
        delta_color="off",
        help="pause x generated tokens/s before it; won back when the rise in tokens/s has made them up",
    )


def render() -> None:
    latest = live.latest_scrape_time(query)
    targets = data.eplb_targets(query)
    if latest is None or not targets:
        st.info(
            f"No expert data in the warehouse behind {api_url()} yet: it comes from instances running the moemeter "
            "plugin (or the twin's decode instance) once the collectors have scraped them."
        )
        return
    c = st.columns([2, 3])
    target = c[0].selectbox("Instance", targets, key="target")
    choice = (
        c[1].segmented_control("Time range", windows.RECENT, format_func=windows.label, default="1h", key="exp_range")
        or "1h"
    )
    w = live.recent(query, latest, choice)
    steps = data.rank_steps(query, w, target)
    bal = data.balancedness_over_time(steps)
    events = data.rebalance_cost(
        data.measured_around(data.rebalances(query, w, target), bal), data.generated_rates(query, w, target)
    )
    shares = data.expert_share(query, w, target)

    now_bal = bal[bal["bucket"] == bal["bucket"].max()] if len(bal) else bal
    worst = now_bal.nsmallest(1, "balancedness") if len(now_bal) else now_bal
    firing = data.evaluate_alerts(RULES, steps, events["ts"].max() if len(events) else None, pd.Timestamp(latest))
    m = metric_columns(5)
    m[0].metric(
        "Balancedness now (mean over layers)", _pct(now_bal["balancedness"].mean() if len(now_bal) else math.nan)
    )
    if len(worst):
        m[1].metric(
            "Worst layer now",
            f"layer {int(worst['layer'].iloc[0])}",
            f"{worst['balancedness'].iloc[0]:.3f}",
            delta_color="off",
        )
    rm = data.rank_matrix(steps[steps["bucket"] == steps["bucket"].max()]) if len(steps) else pd.DataFrame()
    loaded = rm.stack().dropna() if not rm.empty else pd.Series(dtype=float)
    if len(loaded):  # the last step may have routed no token (idle instance): no hottest rank then
        layer, rank = loaded.idxmax()
        since = data.hottest_since(steps, layer, rank)
        m[2].metric(
            "Hottest rank now",
            f"layer {layer} · rank {rank}",
            f"{rm.loc[layer, rank]:.2f}x mean" + (f" · top since {since:%H:%M:%S}" if since is not None else ""),
            delta_color="off",
        )
    if len(events):
        last = events.iloc[-1]
        m[3].metric(
            "Last rebalance",
            f"{last['ts']:%H:%M:%S}",
            f"{_pct(last['measured_before'])} → {_pct(last['measured_after'])} measured",
            delta_color="off",
        )
    m[4].metric("EPLB alerts firing", str(len(firing)))
    if len(events):
        _last_rebalance(events.iloc[-1])

    log = st.toggle(
        "Log colour scale (layer x expert)",
        key="expert_log",
        help="colour by log10 of the share: hot experts stand out among many cold ones",
    )
    h1, h2 = st.columns(2)
    if shares.empty and picked_rack() and w.period != data.HOUR:
        h1.info(
            f"The lake holds {picked_rack()}'s per-expert load by the hour: ranges that hold whole hours "
            "show them (per-minute snapshots are kept on the rack's own dashboard)."
        )
    elif shares.empty:
        h1.info("Per-expert load needs two expert snapshots in the window (the collectors take one a minute).")
    else:
        h1.plotly_chart(figures.expert_heatmap(shares, log=log), key="expert_heatmap")
        if picked_rack() and w.period != data.HOUR:
            h1.caption("From the lake's hourly load: the window's whole hours only.")
    ranks_matrix = data.rank_matrix(steps)
    if ranks_matrix.shape[1] == 1:  # balancedness is 1.0 by definition: no chart of it either
        h2.info("One EP rank: every layer's load is on it, so there is no balance across ranks to show.")
    else:
        h2.plotly_chart(figures.rank_heatmap(ranks_matrix), key="rank_heatmap")
        st.plotly_chart(figures.balancedness_figure(bal, events), key="balancedness")
        st.plotly_chart(figures.balancedness_summary_figure(bal, events), key="balancedness_summary")

    t1, t2 = st.columns(2)
    with t1:
        st.subheader("Hot experts")
        top = shares.nlargest(10, "share")
        hot = data.hot_experts(shares, data.share_trend(query, w, target, top))
        st.dataframe(
            hot,
            hide_index=True,
            key="hot",
            column_config={
                "share": st.column_config.ProgressColumn(
                    "share of layer",
                    format="%.3f",
                    min_value=0.0,
                    max_value=float(max(hot["share"].max(), 1e-9)) if len(hot) else 1.0,
                ),
                "trend": st.column_config.LineChartColumn(
                    "share per hour" if data.hourly_trend(w) else "share per snapshot"
                ),
            },
        )
    with t2:
        st.subheader("Rebalances")
        st.dataframe(events.sort_values("ts", ascending=False), hide_index=True, key="events")  # newest first

    st.subheader("Alerts")
    if firing:
        st.dataframe(pd.DataFrame([f.__dict__ for f in firing]), hide_index=True, key="alerts")
    else:
        st.success("No EPLB alert is firing.")
    rules_yaml = yaml.safe_dump(data.prometheus_rules(RULES), sort_keys=False)
    st.download_button(
        "Prometheus alerting rules (same thresholds)", rules_yaml, "moemeter-eplb.rules.yml", key="rules"
    )

    current = data.current_placement(query, w, target)
    if current is None:
        st.info("No placement snapshot stored yet.")
        return
    phy2log, ranks = current
    st.subheader("Physical placement")
    layer = st.number_input("Layer", 0, phy2log.shape[0] - 1, 0, key="layer")
    st.plotly_chart(figures.placement_figure(data.placement(query, w, target, int(layer)), ranks), key="placement")

    st.subheader("What-if")
    if shares.empty:
        st.info("The window holds no expert snapshots to plan on.")
        return
    load = data.load_matrix(shares)
    experts = load.shape[1]
    f = st.columns(3)
    redundant = f[0].slider(
        "Redundant experts", 0, 2 * experts, int(phy2log.shape[1] - experts), step=ranks, key="redundant"
    )
    policy = f[1].radio("Policy", ["vllm", "refined"], horizontal=True, key="policy")
    st.caption(
        "`vllm` is vLLM 0.32's default EPLB policy exactly: the same rank loads and replica loads as vLLM "
        "computes; which of two equally loaded experts takes which slot (or the last redundant one) follows "
        "numpy's sort on this machine, as vLLM's own does on its host. `refined` never has a higher maximum "
        "rank load."
    )
    result = data.what_if(load, phy2log, ranks, redundant, policy)
    f[2].metric(
        "Mean balancedness: current → planned",
        f"{result['current_balancedness'].mean():.3f} → {result['planned_balancedness'].mean():.3f}",
    )
    st.plotly_chart(figures.what_if_figure(result), key="what_if")


st.title("Experts")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
