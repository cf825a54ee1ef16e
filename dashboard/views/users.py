"""Users page: per-user throughput (P90 per-user tokens/s), who uses the rack, and one user's history
(SRE on call, finance). Data: the metering gateway's request records."""

from __future__ import annotations

import math

import httpx
import streamlit as st

from dashboard.data import users as data
from dashboard.figures import users as figures
from dashboard.source import api_url, query, show_api_error
from dashboard.widgets import compact, metric_columns, request_columns
from moemeter.contract import windows
from moemeter.contract.requests import user_of_tenant

ORDERS = {"tokens": "tokens", "generated tokens": "generated_tokens", "requests": "requests", "errors": "errors"}


def _fmt(value: float, digits: int = 0, unit: str = "") -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}{unit}"


def _user_costs(start, end):  # type: ignore[no-untyped-def]
    """tenant, user_id, cost_usd for the window from the cost model; None when the pools counted nothing."""
    from dashboard.data import cost

    try:
        r = cost.cost_report(query, cost.pools(query, start, end), start, end)
    except (cost.NoData, ValueError):
        return None
    return r.users[["tenant", "user", "cost_usd"]].rename(columns={"user": "user_id"})


def render() -> None:
    latest = data.latest_request_time(query)
    if latest is None:
        st.info(
            "No request records yet. They come from the metering gateway (`moemeter gateway`, role `gateway` "
            f"in the targets file) once the collectors behind {api_url()} have read its feed."
        )
        return
    choice = (
        st.segmented_control("Time range", windows.RECENT, format_func=windows.label, default="1h", key="users_range")
        or "1h"
    )
    w = data.window(latest, windows.span(choice).total_seconds())
    s = data.summary(query, w)
    if s is None:
        st.info(f"No requests finished in the last {choice} before {latest:%Y-%m-%d %H:%M:%S} UTC.")
        return
    how = (
        "exact, from each request" if s.exact else "from hourly sums through the last whole hour; quantiles within 0.5%"
    )
    st.caption(
        f"Last request {latest:%Y-%m-%d %H:%M:%S} UTC · {how} · per-user tokens/s = 1 / a request's mean "
        "inter-token latency; P90 is the slow tail (docs/definitions.md)"
    )
    m = metric_columns(6)
    m[0].metric("P90 per-user tokens/s", _fmt(s.tps_p90, 1), help="1 / the 90th percentile of mean inter-token latency")
    m[1].metric("P50 per-user tokens/s", _fmt(s.tps_p50, 1))
    m[2].metric("TTFT p50" if s.exact else "TTFT mean", _fmt(s.ttft_p50 * 1000, 0, " ms"))
    m[3].metric("Requests", _fmt(s.requests), help=f"{s.errors:,} failed ({s.errors / s.requests:.2%})")
    m[4].metric("Users", _fmt(s.users))
    cache = s.cached_prompt_tokens / s.prompt_tokens if s.prompt_tokens else math.nan
    m[5].metric(
        "Tokens in / out",
        f"{compact(s.prompt_tokens)} / {compact(s.generated_tokens)}",
        help=f"{s.prompt_tokens:,} prompt / {s.generated_tokens:,} generated tokens; prefix-cache hits: "
        f"{_fmt(cache * 100, 1, '%')} of prompt tokens",
    )

    c = st.columns(2)
    c[0].plotly_chart(figures.tps_distribution_figure(data.tps_histogram(query, w), s.tps_p50, s.tps_p90), key="dist")
    c[1].plotly_chart(figures.tps_over_time_figure(data.tps_over_time(query, w)), key="over_time")

    st.subheader("Top users")
    order = st.segmented_control("By", [*ORDERS, "cost"], default="tokens", key="users_order") or "tokens"
    costs = _user_costs(w.start, w.end)
    if order == "cost" and costs is not None:
        table = data.users_table(query, w, limit=10_000).merge(costs, on=["tenant", "user_id"], how="left")
        table = table.sort_values(["cost_usd", "user_id", "tenant"], ascending=[False, True, True]).head(25)
    else:
        table = data.users_table(query, w, limit=25, order=ORDERS.get(order, "tokens"))
        if costs is not None:
            table = table.merge(costs, on=["tenant", "user_id"], how="left")
    st.caption(
        (
            "Cost: each user's share of the pools' cost at the price sheet (computed prompt tokens of prefill, "
            "generated tokens of decode; the Cost page has the method). "
            if costs is not None
            else "No cost for this window (no pool counters). "
        )
        + "Latency columns are per-request quantiles (means in hourly views)."
    )
    left, right = st.columns([2, 3])
    left.plotly_chart(figures.top_users_figure(table.head(15)), key="top_users")
    right.dataframe(
        table,
        hide_index=True,
        key="users_table",
        column_config=request_columns(),
    )

    st.subheader("One user")
    text = st.text_input("Search users", key="user_search", placeholder="user id or tenant, or part of one")
    if text:
        found = data.find_users(query, text)
        if not found:
            st.info(f"No user matches {text!r}.")
            return
        tenant, user = st.selectbox("User", found, key="user_pick", format_func=lambda tu: user_of_tenant(tu[1], tu[0]))
        hist = data.user_history(query, w, tenant, user)
        if hist.empty:
            st.info(f"{user_of_tenant(user, tenant)} sent nothing in the last {choice}.")
        else:
            st.plotly_chart(figures.user_history_figure(hist, user_of_tenant(user, tenant)), key="user_history")
        st.dataframe(
            data.user_requests(query, tenant, user, w.end),
            hide_index=True,
            key="user_requests",
            column_config=request_columns(),
        )


st.title("Users")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
