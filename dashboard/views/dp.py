"""DP ranks page: does one engine of the pool lag the others? One lagging data-parallel rank
stalls every rank's all-to-all, so its queue, KV cache and step time are set beside the pool's.
(SRE on call; MoE engineer)"""

from __future__ import annotations

import httpx
import streamlit as st

from dashboard.data import dp as data
from dashboard.data import live
from dashboard.data.alerts import RULES
from dashboard.figures import dp as figures
from dashboard.source import api_url, query, show_api_error
from dashboard.widgets import metric_columns
from moemeter.contract import windows


def render() -> None:
    cols = st.columns([5, 2])
    choice = (
        cols[0].segmented_control(
            "Time range", windows.RECENT, format_func=windows.label, default="15m", key="dp_range"
        )
        or "15m"
    )
    role = cols[1].segmented_control("Pool", ["decode", "prefill"], default="decode", key="dp_pool") or "decode"
    latest = live.latest_scrape_time(query)
    if latest is None:
        st.info(f"No scrapes stored yet in the warehouse behind {api_url()}.")
        return
    w = live.recent(query, latest, choice)
    over_time = data.engines_over_time(query, w, role)
    if over_time.empty:
        st.info(f"No {role} engine was scraped in this range.")
        return
    scores = data.straggler_scores(over_time, RULES)
    floor = data.waiting_floor(RULES)
    over = scores[scores["score"] > 1]
    st.caption(
        f"{len(scores)} {role} engines · last scrape {latest:%Y-%m-%d %H:%M:%S} UTC · step {w.step_seconds}s · "
        f"straggler score: over 1 where an engine's mean waiting queue is over {RULES.straggler_factor:g}x its "
        f"pool's median engine (and at least {RULES.straggler_min_waiting:g}) or its mean step time over "
        f"{RULES.straggler_step_factor:g}x the median's (over at least {RULES.straggler_min_steps:,.0f} steps), "
        "the DPEngineStraggler alert's thresholds"
    )
    m = metric_columns(4)
    top = scores.iloc[0]
    m[0].metric("Engines over score 1", f"{len(over)} of {len(scores)}")
    m[1].metric("Highest straggler score", f"{top['score']:.2f}", help=top["label"])
    m[2].metric(
        "Its mean waiting queue",
        f"{top['waiting']:.1f}",
        help=f"{top['label']}; the pool's median engine: {scores['waiting'].median():.1f}",
    )
    m[3].metric(
        "Pool median step time", "—" if scores["step_ms"].isna().all() else f"{scores['step_ms'].median():.2f} ms"
    )

    st.subheader("Engines by straggler score")
    st.dataframe(
        scores[
            [
                "label",
                "score",
                "waiting",
                "waiting_ratio",
                "step_ms",
                "step_ratio",
                "running",
                "kv_usage",
                "tokens_per_step",
                "acceptance_length",
                "transfers",
                "failed_transfers",
                "xfer_ms",
                "expired_kv",
            ]
        ].assign(kv_usage=scores["kv_usage"] * 100),
        hide_index=True,
        height=min(38 + 35 * len(scores), 400),
        key="dp_scores",
        column_config={
            "label": st.column_config.TextColumn("engine"),
            "score": st.column_config.NumberColumn("score", format="%.2f"),
            "waiting": st.column_config.NumberColumn("waiting (mean)", format="%.1f"),
            "waiting_ratio": st.column_config.NumberColumn(
                "waiting ratio",
                format="%.1fx",
                help=f"mean waiting over the pool's median engine's, or over {floor:.2f} where the median is below",
            ),
            "step_ms": st.column_config.NumberColumn("step ms", format="%.2f"),
            "step_ratio": st.column_config.NumberColumn("step / median", format="%.2fx"),
            "running": st.column_config.NumberColumn("running (mean)", format="%.1f"),
            "kv_usage": st.column_config.NumberColumn("KV cache", format="%.0f%%"),
            "tokens_per_step": st.column_config.NumberColumn("tokens / step", format="%.1f"),
            "acceptance_length": st.column_config.NumberColumn(
                "acceptance length",
                format="%.2f",
                help="1 + accepted / drafts: tokens a request gains per step from its drafts (blank: no draft path). "
                "Low with a short queue: the drafts are rejected; a straggler's queue grows instead",
            ),
            "transfers": st.column_config.NumberColumn("KV transfers", format="%d", help="NIXL KV transfers"),
            "failed_transfers": st.column_config.NumberColumn(
                "failed", format="%d", help="NIXL KV transfers that failed (NIXLFailedTransfers)"
            ),
            "xfer_ms": st.column_config.NumberColumn("transfer ms", format="%.1f", help="mean NIXL KV transfer time"),
            "expired_kv": st.column_config.NumberColumn(
                "KV expired", format="%d", help="requests whose KV expired before decode read it (NIXLExpiredKV)"
            ),
        },
    )

    c1, c2 = st.columns(2)
    c1.plotly_chart(
        figures.engine_heatmap(data.grid(over_time, "waiting"), "Waiting requests", "requests"), key="dp_waiting"
    )
    c2.plotly_chart(
        figures.engine_heatmap(data.grid(over_time, "running"), "Running requests", "requests"), key="dp_running"
    )
    c3, c4 = st.columns(2)
    kv = data.grid(over_time, "kv_usage") * 100
    c3.plotly_chart(figures.engine_heatmap(kv, "KV-cache usage", "%", zmax=100), key="dp_kv")
    c4.plotly_chart(
        figures.engine_heatmap(data.grid(over_time, "tokens_per_step"), "Tokens per engine step", "tokens"),
        key="dp_tokens",
    )
    if over_time["acceptance_length"].notna().any():
        st.plotly_chart(
            figures.engine_heatmap(
                data.grid(over_time, "acceptance_length"),
                "Mean acceptance length (speculative decoding)",
                "tokens/step",
            ),
            key="dp_acceptance",
        )
    if over_time["step_ms"].notna().any():
        st.plotly_chart(
            figures.engine_heatmap(data.grid(over_time, "step_ms"), "Engine-step time", "ms"), key="dp_step"
        )
    else:
        st.info("No engine-step times: they come from vLLM instances running the moemeter plugin (or the twin).")
    if over_time["transfers"].fillna(0).sum() > 0:
        c5, c6 = st.columns(2)
        c5.plotly_chart(
            figures.engine_heatmap(data.grid(over_time, "xfer_ms"), "KV transfer time (NIXL, mean)", "ms"),
            key="dp_xfer",
        )
        c6.plotly_chart(
            figures.engine_heatmap(data.grid(over_time, "failed_transfers"), "Failed KV transfers (NIXL)", "transfers"),
            key="dp_failed",
        )
    else:
        st.info(f"No NIXL KV transfers counted on the {role} engines in this range (no P/D disaggregation here).")


st.title("DP ranks")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
