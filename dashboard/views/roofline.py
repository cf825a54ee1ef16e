"""Roofline page: how close does each pool and engine run to its GPU's compute and bandwidth roofs?
vLLM's estimated FLOPs and bytes per GPU against the GPU sheet's dense peaks: MFU, MBU and
arithmetic intensity. (performance engineer; capacity planning)"""

from __future__ import annotations

import math

import httpx
import pandas as pd
import streamlit as st

from dashboard.data import live
from dashboard.data import roofline as data
from dashboard.figures import roofline as figures
from dashboard.source import api_url, query, show_api_error
from dashboard.widgets import metric_columns
from moemeter.contract import POOLS, windows

AS_SHEET = "sheet"
# the table's columns: a pool's GPU is in the caption, not on each of the rack's 74 rows
COLUMNS = ("label", "precision", "tflops", "gbytes", "intensity", "mfu_pct", "mbu_pct", "rejected")


def _precision_label(key: str) -> str:
    return "the model's (GPU sheet)" if key == AS_SHEET else key.upper()


def _pct(v: float) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:,.2f}%"


def _share(v: float) -> str:
    return "—" if v is None or math.isnan(v) else f"{100 * v:.1f}%"


def _si(v: float, unit: str) -> str:
    if v is None or math.isnan(v):
        return "—"
    for size, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(v) >= size:
            return f"{v / size:,.2f} {prefix}{unit}"
    return f"{v:,.0f} {unit}"


def render() -> None:
    cols = st.columns([5, 2])
    choice = (
        cols[0].segmented_control(
            "Time range", windows.RECENT, format_func=windows.label, default="15m", key="roof_range"
        )
        or "15m"
    )
    picked = cols[1].selectbox(
        "MFU against the peak at",
        [AS_SHEET, *data.PRECISIONS],
        format_func=_precision_label,
        key="roof_precision",
        help="The sheet's precision for the served model (warehouse/gpu_sheets/default.toml), or another",
    )
    precision = None if picked == AS_SHEET else picked
    latest = live.latest_scrape_time(query)
    if latest is None:
        st.info(f"No scrapes stored yet in the warehouse behind {api_url()}.")
        return
    w = live.recent(query, latest, choice)
    engines = data.engines(query, w)
    if engines.empty:
        st.info("No prefill or decode engine exported vLLM's estimated FLOPs and bytes in this range.")
        return
    models = data.gpu_models(query, w)
    targets = live.targets(query, w)
    gpus = {role: data.pool_gpu(models, targets, role) for role in POOLS}
    measured = data.measured(engines, gpus, precision)
    if data.estimates_missing(measured):
        st.warning(
            "vLLM counted no FLOPs in this range: its estimates are off. Start vLLM with `--enable-mfu-metrics` "
            "(vllm:estimated_flops_per_gpu_total and the bytes counters then move)."
        )
        return
    pools = data.pools(measured)
    for role in POOLS:
        g = gpus[role]
        if g.model is not None and g.spec is None:
            st.warning(
                f"The {role} pool runs on {g.model!r}, which the GPU sheet has no entry for: MFU and MBU need its "
                "peaks (add a [[gpu]] entry with their sources to warehouse/gpu_sheets/default.toml)."
            )
    by_gpu: dict[str, list[str]] = {}
    for role, g in gpus.items():
        if g.spec is not None and (engines["role"] == role).any():
            peaks = ", ".join(f"{p.upper()} {_si(v, 'FLOP/s')}" for p, v in g.spec.peaks.items())
            text = f"{g.model} ({g.how}): {peaks}, HBM {_si(g.spec.hbm_bytes_per_second, 'B/s')}"
            by_gpu.setdefault(text, []).append(role)
    st.caption(
        f"Last scrape {latest:%Y-%m-%d %H:%M:%S} UTC · step {w.step_seconds}s · "
        + " · ".join(f"{' and '.join(roles)}: {text}" for text, roles in by_gpu.items())
        + " · dense peaks, vLLM's *estimated* FLOPs and bytes (docs/definitions.md, Roofline)"
    )

    cards = metric_columns(2 * len(pools))
    for i, r in enumerate(pools.itertuples()):
        peak = r.flops_per_second / r.mfu if r.mfu and r.mfu > 0 else math.nan
        cards[2 * i].metric(
            f"{r.role} MFU" + (f" ({str(r.precision).upper()})" if r.precision else ""),
            _pct(r.mfu),
            help=f"{_si(r.flops_per_second, 'FLOP/s')} per GPU of a {_si(peak, 'FLOP/s')} dense peak",
        )
        cards[2 * i + 1].metric(
            f"{r.role} MBU", _pct(r.mbu), help=f"{_si(r.bytes_per_second, 'B/s')} per GPU read and written"
        )

    points = pd.concat(
        [
            pools.assign(kind="pool", label=pools["role"] + " pool (GPU-weighted mean)"),
            measured.assign(kind="engine"),
        ],
        ignore_index=True,
    )
    assumed = pools.set_index("role")["precision"].to_dict()
    roofs = data.all_roofs(gpus, assumed, data.intensity_range(points, [g.spec for g in gpus.values() if g.spec]))
    st.plotly_chart(figures.roofline(points, roofs), key="roof_chart")

    over_time = data.pools(data.measured(data.engines_over_time(query, w), gpus, precision))
    st.plotly_chart(figures.utilisation_over_time(over_time), key="roof_over_time")

    st.subheader("Pools and engines")
    table = pd.concat([pools.assign(label=pools["role"] + " pool"), measured], ignore_index=True)
    table = table.assign(
        tflops=table["flops_per_second"] / 1e12,
        gbytes=table["bytes_per_second"] / 1e9,
        mfu_pct=table["mfu"] * 100,
        mbu_pct=table["mbu"] * 100,
        rejected=[_share(v) for v in table[data.REJECTED_SHARE]],  # "—": no speculative decoding, not 0
        precision=table["precision"].str.upper(),
    )
    st.dataframe(
        table[[*COLUMNS]],
        hide_index=True,
        height=min(38 + 35 * len(table), 520),
        key="roof_table",
        column_config={
            "label": st.column_config.TextColumn("pool / engine"),
            "precision": st.column_config.TextColumn(
                "MFU at", help="the precision whose dense peak MFU divides by, on the pool's GPU (caption above)"
            ),
            "tflops": st.column_config.NumberColumn("TFLOP/s per GPU", format="%,.1f"),
            "gbytes": st.column_config.NumberColumn("GB/s per GPU", format="%,.1f", help="read + written"),
            "intensity": st.column_config.NumberColumn("FLOP/byte", format="%,.0f"),
            "mfu_pct": st.column_config.NumberColumn("MFU", format="%.2f%%"),
            "mbu_pct": st.column_config.NumberColumn("MBU", format="%.3f%%"),
            "rejected": st.column_config.TextColumn(
                "rejected drafts' share",
                alignment="right",
                help="share of decode compute spent on draft tokens the target model rejected: "
                "(draft - accepted) / (generated + draft - accepted); — where the engine does no speculative decoding",
            ),
        },
    )
    with st.expander("Where the roofs and the precision come from"):
        for role, g in gpus.items():
            if g.spec is None or not (engines["role"] == role).any():
                continue
            served = engines.loc[engines["role"] == role, "model_name"].dropna()
            a = data.SHEET.assumed(str(served.iloc[0]) if len(served) else None, g.spec, precision)
            st.markdown(f"**{role}: {g.spec.model}, MFU at {a.precision.upper()}.** {a.reason}")
            st.markdown("\n".join(f"- `{k}`: {v}" for k, v in g.spec.sources.items()))


st.title("Roofline")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
