"""Cost page: what did a window cost, per million input and output tokens, per customer, and what
margin did the token prices leave? (finance) Same numbers as `moemeter report cost`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import streamlit as st

from dashboard.data import cost as data
from dashboard.data import spec
from dashboard.figures import cost as figures
from dashboard.source import api_url, picked_rack, query, show_api_error
from dashboard.widgets import day_span, metric_columns, request_columns, usd_card
from dashboard.widgets import usd as _usd
from moemeter.contract import windows

BASIS_LABELS = {
    "allocation": "every reserved GPU-hour charged",
    "usage": "busy GPU time charged, idle and unobserved apart",
}

# The daily statement's headings and formats (its CSV keeps the column names finance scripts read).
DAILY_COLUMNS = {
    "day": st.column_config.TextColumn("day (UTC)"),
    "gpus_avg": st.column_config.NumberColumn("GPUs (mean)", format="%.2f"),
    "gpus_peak": st.column_config.NumberColumn("GPUs (peak)", format="localized"),
    "gpu_hours": st.column_config.NumberColumn("GPU-hours", format="%.1f"),
    "cost_usd": st.column_config.NumberColumn("cost USD", format="dollar"),
    "input_tokens": st.column_config.NumberColumn("input tokens", format="localized"),
    "cache_hit_share": st.column_config.NumberColumn("cache hits", format="percent"),
    "output_tokens": st.column_config.NumberColumn("output tokens", format="localized"),
    "usd_per_mtok_input": st.column_config.NumberColumn("$/M input", format="$%.4f"),
    "usd_per_mtok_output": st.column_config.NumberColumn("$/M output", format="$%.4f"),
    "idle_cost_usd": st.column_config.NumberColumn("idle cost USD", format="dollar"),
    "cache_savings_usd": st.column_config.NumberColumn("cache savings USD", format="dollar"),
    "revenue_usd": st.column_config.NumberColumn("revenue USD", format="dollar"),
    "margin_usd": st.column_config.NumberColumn("margin USD", format="dollar"),
    "margin_pct": st.column_config.NumberColumn("margin %", format="%.2f%%"),
    "note": st.column_config.TextColumn("note"),
}


def _window(latest: datetime) -> tuple[datetime, datetime, bool]:
    """The window picked, or the one in the URL (?from=ISO&to=ISO, e.g. linked from a report);
    True when it came from the URL (then it is costed exactly as `moemeter report cost` would)."""
    qp = st.query_params
    if "from" in qp and "to" in qp:
        try:
            return _utc(qp["from"]), _utc(qp["to"]), True
        except ValueError:
            st.warning(f"Ignoring the window in the URL: from={qp['from']!r} to={qp['to']!r} are not ISO 8601 times.")
    today = latest.replace(hour=0, minute=0, second=0, microsecond=0)
    first = data.first_count(query)
    default = "yesterday" if first is not None and first < today else "today"  # a new install has no yesterday
    choice = (
        st.segmented_control(
            "Window (UTC)", windows.CALENDAR, format_func=windows.label, default=default, key="cost_window"
        )
        or default
    )
    if choice == "24h":
        return latest - windows.span("24h"), latest, False
    if choice != "custom":
        return (*windows.calendar(choice, latest), False)
    d = st.columns([2, 3])[0].date_input(
        "From / to", (today.date() - timedelta(days=1), today.date() - timedelta(days=1)), key="cost_dates"
    )
    return (*day_span(d, today.date()), False)


def _utc(text: str) -> datetime:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t


def render() -> None:
    latest = data.latest_count(query)
    if latest is None:
        st.info(f"No scrapes stored yet in the warehouse behind {api_url()}.")
        return
    start, end, explicit = _window(latest)
    first = data.first_count(query)
    if not explicit and first is not None and start < first < end:  # unobserved time is not observed cost
        st.info(
            f"moemeter first saw the rack at {first:%Y-%m-%d %H:%M:%S} UTC, so this window counts from then: "
            f"the {(first - start).total_seconds() / 3600:,.1f} h before it were not observed and are not "
            "charged here."
        )
        start = first
    sheet = data.price_sheet(query)
    latest_price = max(sheet.gpu or data.default_sheet().gpu, key=lambda p: p.effective).usd_per_gpu_hour
    with st.expander("What if", expanded=False):
        c = st.columns(3)
        what_if = c[0].toggle(
            "Another GPU-hour price",
            key="whatif_on",
            help="Replaces the price sheet's GPU prices, every pool, the whole window, in this view only",
        )
        price = c[1].number_input(
            "GPU-hour price, USD",
            min_value=0.0,
            value=float(latest_price),
            step=0.5,
            key="whatif_price",
            disabled=not what_if,
        )
        util = c[2].slider(
            "Utilisation: tokens served x",
            0.1,
            3.0,
            1.0,
            0.1,
            key="whatif_util",
            help="The same GPUs serving this many times the tokens: $/M tokens divide by it",
        )
    if what_if:
        sheet = data.with_gpu_price(sheet, price)
    basis = (
        st.segmented_control(
            "Cost basis",
            data.BASES,
            default=data.BASES[0],
            key="cost_basis",
            help="allocation: every reserved GPU-hour is charged to the tokens and users that ran; usage: only "
            "busy GPU time is, and idle and unobserved time are lines of their own (docs/definitions.md, Cost "
            "bases). The bill is the same on both.",
        )
        or data.BASES[0]
    )
    pools = data.pools(query, start, end)
    if not pools["prefill"] and not pools["decode"]:
        st.info(
            f"No prefill or decode instance was scraped between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} "
            "UTC: there is nothing to cost in this window. Pick another window."
        )
        return
    try:
        r = data.cost_report(query, pools, start, end, sheet, basis=basis)
    except data.NoData as exc:
        st.info(f"{exc}. Pick another window.")
        return
    except ValueError as exc:
        st.warning(str(exc))
        return
    d = r.as_json()
    pf, dc, tot = d["pools"]["prefill"], d["pools"]["decode"], d["total"]
    sources = "; ".join(d["price_sheet"]["gpu_price_sources"])
    st.caption(
        f"{start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} UTC · price sheet **{d['price_sheet']['name']}** "
        f"({sources}) · per-user method: {d['method']} (share of computed prompt tokens, of generated tokens) "
        f"· cost basis **{basis}**: {BASIS_LABELS[basis]}"
    )

    if r.first_count and r.last_count:
        counted = (r.last_count - r.first_count).total_seconds() + 0.0
        if counted < 0.9 * (end - start).total_seconds():
            st.warning(
                f"Tokens were counted only from {r.first_count:%Y-%m-%d %H:%M} to {r.last_count:%H:%M} UTC of this "
                "window; GPU-hours are reserved for all of it, so $/M tokens include time nothing was observed."
            )

    def scaled(v: float | None) -> float | None:
        return None if v is None else v / util

    m = metric_columns(8)
    m[0].metric(
        "Cost",
        usd_card(tot["cost_usd"]),
        help=f"{_usd(tot['cost_usd'])}: {pf['gpu_hours'] + dc['gpu_hours']:,.1f} GPU-hours",
    )
    charged = "prefill cost" if basis == "allocation" else "prefill busy cost"
    m[1].metric(
        "$/M input",
        _usd(scaled(pf["usd_per_mtok_input"]), 4),
        help=f"{charged} / {pf['computed_prompt_tokens']:,} computed prompt tokens; "
        f"{pf['cached_prompt_tokens']:,} cache hits apart",
    )
    m[2].metric(
        "$/M output",
        _usd(scaled(dc["usd_per_mtok_output"]), 4),
        help=f"decode {'cost' if basis == 'allocation' else 'busy cost'} / {dc['generated_tokens']:,} generated tokens",
    )
    m[3].metric("$/M blended", _usd(scaled(tot["usd_per_mtok_blended"]), 4), help=f"{tot['tokens']:,} tokens")
    m[4].metric(
        "Revenue", usd_card(tot["revenue_usd"]), help=f"{_usd(tot['revenue_usd'])}: tokens at the token price sheet"
    )
    m[5].metric("Margin", usd_card(tot["margin_usd"]), help=_usd(tot["margin_usd"]))
    idle = pf["idle_cost_usd"] + dc["idle_cost_usd"]
    m[6].metric(
        "Idle cost",
        usd_card(idle),
        help=f"{_usd(idle)}: GPU-hours in scrape intervals when a pool's token counters did not move; "
        + ("charged to the users with the rest" if basis == "allocation" else "charged to no user on this basis"),
    )
    m[7].metric(
        "Cache savings",
        usd_card(tot["cache_savings_usd"]),
        help=f"{_usd(tot['cache_savings_usd'])}: {pf['cached_prompt_tokens']:,} cached prompt tokens at the $/M "
        "input: what the prefill pool would have charged to compute them",
    )

    split = spec.cost_split(query, start, end, dc["charged_usd"], dc["generated_tokens"])
    parts = split.parts() if split else {}
    if split is not None and parts.get("rejected_drafts") is not None:
        st.caption(
            f"Of {_usd(scaled(parts['usd_per_mtok_output']), 4)}/M output tokens, "
            f"{_usd(scaled(parts['accepted_output']), 4)} pays for accepted output and "
            f"{_usd(scaled(parts['rejected_drafts']), 4)} ({split.rejected_share:.1%} of decode compute) for "
            "drafts the target model verified and rejected. An estimate: " + spec.REJECTED_BASIS + "."
        )

    step = timedelta(days=1) if end - start > timedelta(days=2) else timedelta(hours=1)
    over = data.over_time(query, pools, sheet, start, end, step, r)
    for col in ("usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended"):
        over[col] = over[col].map(scaled)
    st.plotly_chart(figures.per_mtok_figure(over), key="per_mtok")

    st.subheader("Per user")
    users = r.users.drop(columns=[], errors="ignore")
    if users.empty:
        st.info("No per-user records in this window: they come from the metering gateway's request feed.")
    else:
        st.dataframe(
            users,
            hide_index=True,
            key="cost_users",
            column_config=request_columns(),
        )
        st.download_button(
            "Download per-user costs (CSV)",
            users.to_csv(index=False).encode(),
            file_name=f"moemeter-users-{start:%Y%m%d%H%M}-{end:%Y%m%d%H%M}.csv",
            mime="text/csv",
        )

    st.subheader("Daily statement")
    day_from = data.statement_from(start, end, first, explicit)  # the first day from when the rack was first seen
    daily = data.daily_statement(query, pools, day_from, end, sheet, basis=basis)
    if day_from == first and len(daily) and "note" in daily:
        daily.loc[0, "note"] = f"from {first:%H:%M:%S} UTC, when moemeter first saw the rack"
    st.dataframe(daily, hide_index=True, key="daily", column_config=DAILY_COLUMNS)
    st.download_button(
        "Download the daily statement (CSV)",
        daily.to_csv(index=False).encode(),
        file_name=f"moemeter-daily-{start:%Y%m%d}-{end:%Y%m%d}.csv",
        mime="text/csv",
        key="dl_daily",
    )
    rack = data.host_rack(picked_rack())
    st.download_button(
        f"Download FOCUS 1.2 cost and usage, by tenant, {basis} basis (CSV)",
        lambda: data.focus_csv(query, pools, start, end, rack, sheet, basis),
        file_name=f"moemeter-focus-{rack}-{basis}-{start:%Y%m%d%H%M}-{end:%Y%m%d%H%M}.csv",
        mime="text/csv",
        key="dl_focus",
        on_click="ignore",
        help="The rows `moemeter report focus --by tenant` writes for this window: GPU-hours busy, idle and "
        "unobserved per hour and pool at the price in force, tokens per kind, each tenant's share "
        "(docs/definitions.md, FOCUS export). For a FinOps tool.",
    )


st.title("Cost")
try:
    render()
except (httpx.HTTPError, RuntimeError) as exc:
    show_api_error(exc)
