"""SLO page: do requests meet their objectives, how fast is the error budget going, which tenants
miss, what does a good token cost, and where does the rack sit between throughput and
interactivity? (SRE, finance) Same numbers as `moemeter report slo` for the same window."""

from __future__ import annotations

import httpx
import streamlit as st

from dashboard.data import slo as data
from dashboard.data import users
from dashboard.figures import slo as figures
from dashboard.source import api_url, query, show_api_error
from dashboard.widgets import metric_columns, usd
from moemeter.contract import windows

COUNT = 115  # pixels: a month's 1,873,396,515 held, which the default width cut to "73396515"
TABLE = {
    "class": st.column_config.TextColumn("class"),
    "requests": st.column_config.NumberColumn(
        "held", format="localized", width=COUNT, help="requests held to the class's objective"
    ),
    "met": st.column_config.NumberColumn(
        "met", format="localized", width=COUNT, help="held requests that met their targets"
    ),
    "attainment": st.column_config.NumberColumn("attainment", format="percent"),
    "objective": st.column_config.NumberColumn("objective", format="percent"),
    "goodput_rps": st.column_config.NumberColumn("goodput req/s", format="%.3f"),
    "goodput_tps": st.column_config.NumberColumn("good tok/s", format="localized", width=COUNT),
    "usd_per_mtok_good": st.column_config.NumberColumn("$/M good tokens", format="$%.4f"),
    "budget_left": st.column_config.NumberColumn("budget left", format="percent", help="over the class's period"),
    "burn_1h": st.column_config.NumberColumn("burn 1 h", format="%.2f"),
    "burn_6h": st.column_config.NumberColumn("burn 6 h", format="%.2f"),
    "burn_5m": st.column_config.NumberColumn("burn 5 min", format="%.2f"),
    "burn_30m": st.column_config.NumberColumn("burn 30 min", format="%.2f"),
    "good_tokens": st.column_config.NumberColumn("good tokens", format="localized", width=COUNT + 30),
    "cost_usd": st.column_config.NumberColumn("cost USD", format="$%.2f"),
    "failed": st.column_config.NumberColumn("failed", format="localized", help="held requests the server failed"),
    "missed_ttft": st.column_config.NumberColumn("missed TTFT", format="localized"),
    "missed_itl": st.column_config.NumberColumn("missed ITL", format="localized"),
    "missed_e2e": st.column_config.NumberColumn("missed E2E", format="localized"),
    "burning": st.column_config.TextColumn("alert", help="page: fast burn (1 h and 5 min); ticket: slow (6 h, 30 min)"),
}


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.2f}%"


def render() -> None:
    latest = users.latest_request_time(query)
    if latest is None:
        st.info(
            "No request records yet: attainment is counted from the metering gateway's records "
            f"(`moemeter gateway`), once the collectors behind {api_url()} have read its feed."
        )
        return
    choice = (
        st.segmented_control("Time range", windows.RECENT, format_func=windows.label, default="1h", key="slo_range")
        or "1h"
    )
    asked = users.window(latest, windows.span(choice).total_seconds())
    w = data.observed(query, asked)
    report, by_tenant = data.reports(query, w)
    rows = report.rows
    held, met = int(rows["requests"].sum()), int(rows["met"].sum())
    rules = data.AlertRules()
    since = f" · counted from the first scrape, {w.start:%Y-%m-%d %H:%M:%S} UTC" if w.start != asked.start else ""
    st.caption(
        f"Last request {latest:%Y-%m-%d %H:%M:%S} UTC{since} · a request meets its class's targets (or its own, from "
        "x-slo-ttft-ms / x-slo-tpot-ms) and did not fail on the server side · budget over each class's period; "
        f"burn: page over {rules.burn_fast:g}x on 1 h and 5 min, ticket over {rules.burn_slow:g}x on 6 h and "
        "30 min (docs/definitions.md, SLOs)"
    )
    m = metric_columns(4)
    m[0].metric("Attainment", _pct(met / held if held else None), help=f"{met:,} of {held:,} held requests met")
    m[1].metric(
        "Goodput, req/s",
        "—" if not held else f"{met / w.seconds:,.2f}",
        help=f"{report.good_tokens:,} good tokens ({report.good_tokens / w.seconds:,.1f}/s)",
    )
    m[2].metric(
        "$/M good tokens",
        usd(report.usd_per_mtok_good, 4),
        help="the pools' cost over the tokens of requests that met their targets"
        if report.cost_usd is not None
        else f"no cost: {report.cost_note}",
    )
    paging = [r["class"] for r in rows.to_dict("records") if r["burning"]]
    m[3].metric("Burning", ", ".join(paging) or "none", help="classes whose burn rates cross a threshold")
    for r in rows.to_dict("records"):
        if r["burning"] == "page":
            st.error(
                f"{r['class']}: burning its error budget fast ({r['burn_1h']:.1f}x over 1 h, {r['burn_5m']:.1f}x "
                "over 5 min): MoemeterSLOFastBurn pages on this",
                icon=":material/local_fire_department:",
            )
        elif r["burning"] == "ticket":
            st.warning(f"{r['class']}: slow burn ({r['burn_6h']:.1f}x over 6 h)", icon=":material/trending_up:")

    first = ["class", "requests", "met", "attainment", "objective", "goodput_rps", "usd_per_mtok_good", "budget_left"]
    first += ["burn_1h", "burn_6h", "burning"]
    order = first + [c for c in rows.columns if c not in first and c != "tenant"]
    st.dataframe(rows[order], hide_index=True, key="slo_classes", column_config=TABLE)
    c = st.columns(2)
    objectives = {k: v.objective for k, v in report.classes.items()}
    c[0].plotly_chart(
        figures.attainment_figure(data.attainment_over_time(query, w, report), objectives), key="attainment"
    )
    c[1].plotly_chart(figures.budget_figure(data.budget_over_time(query, w, report), w.start, w.end), key="budget")
    st.plotly_chart(figures.operating_point_figure(data.operating_points(query, w)), key="operating_point")

    st.subheader("Worst tenants")
    tenants = by_tenant.rows
    tenants = tenants[tenants["requests"] > 0].sort_values(["attainment", "requests"], ascending=[True, False])
    st.dataframe(
        tenants.head(10)[["class", "tenant", *[k for k in TABLE if k not in ("class", "objective")]]],
        hide_index=True,
        key="slo_tenants",
        column_config=TABLE,
    )


st.title("SLOs")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
