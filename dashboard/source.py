"""Where the dashboard's data comes from: the query API named by MOEMETER_API, cached briefly.

The only Streamlit-aware data code: pages call `query()`; pure functions never cache.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pandas as pd
import streamlit as st

from warehouse.api import ApiUnreachable, QueryClient
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
    return _cached(api_url(), sql, params or [])


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
