"""Live page: is the rack healthy right now, and which pool is the bottleneck? (SRE on call)"""

from __future__ import annotations

import math
import time
from datetime import datetime

import httpx
import streamlit as st

from dashboard.data import live as data
from dashboard.data import spec
from dashboard.figures import live as figures
from dashboard.figures import spec as spec_figures
from dashboard.source import api_url, query, show_api_error
from dashboard.widgets import REFRESH_SECONDS, day_span, metric_columns, refresh_every
from moemeter.contract import windows


def _fmt(value: float, unit: str = "", digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}{unit}"


def _window_controls() -> tuple[str, datetime | None, datetime | None, bool]:
    cols = st.columns([5, 2.5, 1.5])  # at 1280 px: every range button and "Auto-refresh" in full
    choice = cols[0].segmented_control(
        "Time range", [*windows.RECENT, "custom"], format_func=windows.label, default="15m", key="range"
    )
    start = end = None
    if choice == "custom":
        today = datetime.utcnow().date()
        start, end = day_span(cols[1].date_input("From / to (UTC)", (today, today), key="custom_dates"), today)
    auto = cols[2].toggle("Auto-refresh", value=True, key="auto")
    return choice or "15m", start, end, auto


def render(choice: str, start: datetime | None, end: datetime | None) -> None:
    latest = data.latest_scrape_time(query)
    if latest is None:
        st.info(f"No scrapes stored yet in the warehouse behind {api_url()}: waiting for the first collector round.")
        return
    interval = data.scrape_interval(query)
    if choice == "custom" and start and end:
        w = data.Window.between(start, end, interval)
    else:
        w = data.Window.ending(latest, windows.span("15m" if choice == "custom" else choice).total_seconds(), interval)
    tgts = data.targets(query, w)
    gpus = data.pool_gpus(tgts)
    stacks = ", ".join(sorted(s for s in tgts["stack"].dropna().unique() if s)) or "unnamed stack"
    st.caption(
        f"Observing **{stacks}** · {gpus['prefill']} prefill + {gpus['decode']} decode GPUs "
        f"({gpus['rack']} in the rack) · last scrape {latest:%Y-%m-%d %H:%M:%S} UTC · scrapes every {round(interval, 1):g}s · step {w.step_seconds}s"
    )

    tpg = data.tokens_per_gpu(data.token_rates(query, w), gpus)
    ttft, itl, tpot = data.histograms_counts(query, w, list(data.LATENCY_FAMILIES)).values()
    health = data.scrape_health(query, w)
    head = data.headline(tpg, ttft, itl, tpot, health)

    m = metric_columns(7)
    m[0].metric("Rack tok/s per GPU (logical)", _fmt(head.rack_tokens_per_gpu))
    m[1].metric("Prefill computed tok/s per GPU", _fmt(head.prefill_computed_per_gpu))
    m[2].metric("Decode tok/s per GPU", _fmt(head.decode_tokens_per_gpu))
    m[3].metric("P90 per-user tok/s", _fmt(head.p90_user_tokens_per_s))
    m[4].metric("Prefill TTFT p90", _fmt(head.ttft_p90_seconds * 1000, " ms"))
    m[5].metric("Decode ITL p50", _fmt(head.itl_p50_seconds * 1000, " ms", 2))
    m[6].metric("Targets up", f"{head.targets_up}/{head.targets_total}")

    st.plotly_chart(figures.tokens_per_gpu_figure(tpg), key="tokens_per_gpu")
    c1, c2 = st.columns(2)
    c1.plotly_chart(
        figures.latency_figure(data.quantiles_over_time(ttft, (0.5, 0.9, 0.99)), "Time to first token (per pool)"),
        key="ttft",
    )
    c2.plotly_chart(
        figures.latency_figure(
            data.quantiles_over_time(itl[itl["role"] == "decode"], (0.5, 0.9, 0.99)), "Inter-token latency (decode)"
        ),
        key="itl",
    )
    c3, c4 = st.columns(2)
    c3.plotly_chart(figures.per_user_figure(data.per_user_tokens_per_second(tpot)), key="per_user")
    gauges = data.queue_and_kv(query, w)
    drafting = spec.drafting(query, w)
    if drafting.empty:  # no speculative config: the KV cache takes the place beside per-user speed
        c4.plotly_chart(figures.kv_figure(gauges), key="kv")
    else:  # per-user speed is acceptance length over step time: the two side by side
        c4.plotly_chart(
            spec_figures.acceptance_length_figure(drafting.over_time("pool", positions=False)), key="acceptance"
        )
        st.plotly_chart(figures.kv_figure(gauges), key="kv")
    st.plotly_chart(figures.queue_figure(gauges), key="queue")

    latest_gpus = data.gpus_latest(query, w.start)
    if latest_gpus.empty:  # the local CPU stack, or a rack whose dcgm-exporters are not targets
        st.info(
            "No GPU exporter (dcgm-exporter) among the targets scraped in this range: no per-GPU utilisation, "
            "power or memory to show."
        )
    else:
        g1, g2 = st.columns(2)
        g1.plotly_chart(
            figures.gpu_heatmap(latest_gpus, "util_pct", f"GPU utilisation ({len(latest_gpus)} GPUs)", "%"),
            key="gpu_util",
        )
        g2.plotly_chart(figures.gpu_heatmap(latest_gpus, "power_watts", "GPU power", "W"), key="gpu_power")
        st.plotly_chart(figures.gpu_time_figure(data.gpus_over_time(query, w)), key="gpu_time")

    st.subheader("Scrape health")
    st.dataframe(
        health,
        hide_index=True,
        key="health",
        column_config={
            "up": st.column_config.CheckboxColumn("up"),
            "duration_seconds": st.column_config.NumberColumn("duration s", format="%.3f"),
            "refused": st.column_config.NumberColumn(
                "refused",
                help="Samples, request records and snapshots refused or repaired "
                "in this range; the rest of each round was stored",
            ),
            "last_refusal": st.column_config.TextColumn("last refusal"),
        },
    )


st.title("Live")
choice, start, end, auto = _window_controls()


every = st.session_state.setdefault("live_refresh_every", REFRESH_SECONDS)


@st.fragment(run_every=every if auto else None)
def live_body() -> None:
    began = time.monotonic()
    try:
        render(choice, start, end)
    except (httpx.HTTPError, RuntimeError) as exc:
        show_api_error(exc)
    took = time.monotonic() - began
    slower = refresh_every(took, every)
    if auto and slower != every:  # a fragment's interval is set when the page runs whole
        st.session_state["live_refresh_every"] = slower
        st.rerun()
    if auto and every > REFRESH_SECONDS:
        st.caption(f"Refreshing every {every} s, not {REFRESH_SECONDS}: the page took {took:.1f} s to render here.")


live_body()
