"""Where the dashboard's data comes from: the query API named by MOEMETER_API, or, with a fleet's
lake (MOEMETER_LAKE, MOEMETER_LAKE_DATA) and a rack picked in the sidebar, that rack of the lake;
cached briefly.

The only Streamlit-aware data code: pages call `query()`; pure functions never cache.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import duckdb
import httpx
import pandas as pd
import streamlit as st

from warehouse.api import ApiUnreachable, LocalQuery, QueryClient
from warehouse.lake import open_reader, watermarks
from warehouse.read import Query
from warehouse.readonly import Params, QueryBusy, QueryRefused, QueryTimeout, QueryTooLarge

DEFAULT_API = "http://127.0.0.1:8431"


def api_url() -> str:
    return os.environ.get("MOEMETER_API", DEFAULT_API).rstrip("/")


@st.cache_resource(show_spinner=False)
def _client(url: str) -> QueryClient:
    """One client per API for the whole app: its connections are reused by every page's queries."""
    return QueryClient(url)


@st.cache_data(ttl=2, show_spinner=False)
def _cached(url: str, sql: str, params: Params) -> pd.DataFrame:
    return _client(url)(sql, params)


def query(sql: str, params: Params | None = None) -> pd.DataFrame:
    rack = picked_rack()
    if rack is not None:
        return _cached_lake(lake_uri(), rack, sql, params or [])
    return _cached(api_url(), sql, params or [])


LIVE = ""
"""The sidebar's key for the rack the query API serves, beside the lake's racks (no rack is named ""),
shown as `rack_label(LIVE)`."""


def rack_label(rack: str) -> str:
    """What the sidebar shows for a rack's key."""
    return rack or "live (query API)"


def lake_uri() -> str | None:
    return os.environ.get("MOEMETER_LAKE") or None


def picked_rack() -> str | None:
    """The lake's rack the pages read, None for the query API."""
    rack = st.session_state.get("rack") if lake_uri() else None
    return None if rack in (None, LIVE) else str(rack)


def _lake(uri: str, rack: str | None) -> duckdb.DuckDBPyConnection:
    return _lake_connection(uri, os.environ.get("MOEMETER_LAKE_DATA") or None, rack)


@st.cache_resource(show_spinner=False)
def _lake_connection(uri: str, data: str | None, rack: str | None) -> duckdb.DuckDBPyConnection:
    """One read-only, locked-down lake connection per rack (None: every rack, lake.<table>)."""
    return open_reader(uri, rack, data)


def lake_query(rack: str | None) -> Query:
    """A rack of the lake (None: the whole lake) through the same read layer as the query API."""
    uri = lake_uri()
    if uri is None:
        raise RuntimeError("no lake: start the dashboard with --lake")
    con = _lake(uri, rack)  # here, in the page's thread: the Fleet page reads racks from threads of its own

    def read(sql: str, params: Params | None = None) -> pd.DataFrame:
        with con.cursor() as cur:
            return LocalQuery(cur)(sql, params)

    return read


@st.cache_data(ttl=30, show_spinner=False)
def _cached_lake(uri: str | None, rack: str, sql: str, params: Params) -> pd.DataFrame:
    return lake_query(rack)(sql, params)


def lake_watermarks() -> dict[str, datetime]:
    """Each rack of the lake and how far it has published."""
    uri = lake_uri()
    return {} if uri is None else _watermarks(uri)


@st.cache_data(ttl=30, show_spinner=False)
def _watermarks(uri: str) -> dict[str, datetime]:
    with _lake(uri, None).cursor() as cur:
        return watermarks(cur)


@st.cache_data(ttl=5, show_spinner=False)
def api_health(url: str | None = None) -> dict[str, Any] | None:
    """GET /health of the query API (the writer's and the collector's state); None when it does not answer."""
    try:
        headers = QueryClient(url or api_url()).headers()
        return dict(httpx.get(f"{url or api_url()}/health", timeout=2, headers=headers).json())
    except (httpx.HTTPError, ValueError):
        return None


def writer_warning(health: dict[str, Any] | None) -> str | None:
    """The banner every page shows while the warehouse cannot store new data."""
    if not health or health.get("ok", True):
        return None
    last = health.get("last_write") or "before this run"
    return (
        f"The warehouse cannot write ({health.get('problem')}) since {health.get('since')} UTC: "
        f"{health.get('failed_writes')} rounds lost so far. Pages show what it holds, up to {last}. "
        f"Its message: {health.get('error')}"
    )


def starting_note(health: dict[str, Any] | None) -> str | None:
    """What a page says while collection has not started yet (the stack is still coming up)."""
    if not health or not health.get("starting"):
        return None
    return (
        f"Starting: the collector is {health['starting']}. Real vLLM loads its model first (a minute or two "
        "on a CPU); pages fill in from the first round."
    )


def collector_warning(health: dict[str, Any] | None) -> str | None:
    """The banner while the collector's rounds fail although the writer writes (a bad round, not a disk)."""
    if not health or health.get("ok", True):
        return None
    if not health.get("failing_since") and health.get("rollups_failing_since"):
        return (
            f"The roll-ups fail since {health['rollups_failing_since']} UTC: rounds are stored, but minutes "
            "and hours are not rolled up, so hourly pages and reports stop at that time. "
            f"Its last error: {health.get('rollup_error')}"
        )
    return (
        f"The collector's rounds fail since {health.get('failing_since')} UTC "
        f"({health.get('rounds_failed')} failed since it started): new data is not being stored. "
        f"Its last error: {health.get('last_error')}"
    )


def api_error_message(exc: BaseException, url: str | None = None) -> str:
    """What a page says when one of its queries failed: the cause and what to do, never a traceback."""
    where = url or api_url()
    if isinstance(exc, (ApiUnreachable, httpx.HTTPError)):
        return f"Cannot reach the warehouse query API at {where}: {exc}"
    if isinstance(exc, QueryTimeout):
        return f"A query of this page took too long and the warehouse stopped it ({exc}). Pick a shorter range."
    if isinstance(exc, QueryTooLarge):
        return f"A query of this page asked for more than the warehouse sends at once ({exc}). Pick a shorter range."
    if isinstance(exc, QueryBusy):
        return f"The warehouse is busy with other queries ({exc}). This page retries on its next refresh."
    if isinstance(exc, QueryRefused):
        return f"The warehouse refused a query of this page: {exc}"
    return f"The warehouse query API at {where} failed: {exc}"


def show_api_error(exc: BaseException) -> None:
    st.error(api_error_message(exc))
