"""Where the dashboard's data comes from: the query API named by MOEMETER_API, cached briefly.

The only Streamlit-aware data code: pages call `query()`; pure functions never cache.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
import streamlit as st

from warehouse.api import QueryClient

DEFAULT_API = "http://127.0.0.1:8431"


def api_url() -> str:
    return os.environ.get("MOEMETER_API", DEFAULT_API).rstrip("/")


@st.cache_data(ttl=2, show_spinner=False)
def _cached(url: str, sql: str, params: tuple[Any, ...]) -> pd.DataFrame:
    return QueryClient(url)(sql, list(params))


def query(sql: str, params: list[Any] | None = None) -> pd.DataFrame:
    return _cached(api_url(), sql, tuple(params or ()))
