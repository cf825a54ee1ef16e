"""moemeter dashboard: a Streamlit multipage app over the warehouse's read-only query API.

Run with `moemeter dashboard` (or `streamlit run dashboard/app.py`); MOEMETER_API names the API.
"""

from datetime import datetime
from pathlib import Path

import httpx
import streamlit as st

from dashboard import login
from dashboard.data import alerts
from dashboard.data.live import latest_scrape_time
from dashboard.source import (
    LIVE,
    api_health,
    api_url,
    collector_warning,
    lake_uri,
    lake_watermarks,
    picked_rack,
    query,
    rack_label,
    starting_note,
    writer_warning,
)

PAGES = Path(__file__).parent / "views"  # not "pages": Streamlit would serve that folder without this script


@st.cache_data(ttl=600, show_spinner=False, max_entries=16)
def firing_at(url: str, latest: datetime) -> list[alerts.Firing]:
    """The alerts firing at the latest scrape of the API at `url`: one judgement per scrape."""
    return alerts.firing(query, latest)


def firing_now() -> list[alerts.Firing]:
    """None before the first scrape, none when the API fails (the page says what failed)."""
    try:
        latest = latest_scrape_time(query)
        return firing_at(f"lake:{picked_rack()}" if picked_rack() else api_url(), latest) if latest is not None else []
    except (httpx.HTTPError, RuntimeError):
        return []


st.set_page_config(page_title="moemeter", page_icon=":bar_chart:", layout="wide")
login.gate()
fleet = [st.Page(PAGES / "fleet.py", title="Fleet", icon=":material/dns:", default=True)] if lake_uri() else []
if fleet:  # the lake's racks, and the rack the query API serves while it answers
    racks = ([LIVE] if api_health() is not None else []) + list(lake_watermarks())
    st.sidebar.selectbox(
        "Rack", racks or [LIVE], key="rack", format_func=rack_label, help="the rack every page but Fleet reads"
    )
nav = st.navigation(
    [
        *fleet,
        st.Page(PAGES / "live.py", title="Live", icon=":material/monitor_heart:", default=not fleet),
        st.Page(PAGES / "users.py", title="Users", icon=":material/group:"),
        st.Page(PAGES / "slo.py", title="SLOs", icon=":material/verified:"),
        st.Page(PAGES / "cost.py", title="Cost", icon=":material/payments:"),
        st.Page(PAGES / "experts.py", title="Experts", icon=":material/grid_on:"),
        st.Page(PAGES / "dp.py", title="DP ranks", icon=":material/view_column:"),
        st.Page(PAGES / "spec.py", title="Speculative decoding", icon=":material/fast_forward:"),
        st.Page(PAGES / "overhead.py", title="CPU overhead", icon=":material/speed:"),
        st.Page(PAGES / "roofline.py", title="Roofline", icon=":material/stacked_line_chart:"),
    ]
)
health = api_health() or {}
if warning := writer_warning(health.get("writer")):
    st.error(warning, icon=":material/database_off:")
elif warning := collector_warning(health.get("collector")):
    st.error(warning, icon=":material/sync_problem:")
elif note := starting_note(health.get("collector")):
    st.info(note, icon=":material/hourglass_top:")
if fired := firing_now():
    st.warning(alerts.banner(fired), icon=":material/notifications_active:")
nav.run()
