"""Small helpers shared by the pages' controls."""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta
from typing import Any

import streamlit as st


def day_span(picked: object, fallback: date) -> tuple[datetime, datetime]:
    """Whole UTC days from a date-range picker's value: [first day 00:00, last day + 1 day).

    While someone is choosing, `st.date_input` returns a tuple of one date (only the start picked),
    or none; a lone date or nothing falls back sensibly instead of failing the page.
    """
    days = [d for d in (picked if isinstance(picked, tuple | list) else [picked]) if isinstance(d, date)]
    first, last = (days[0], days[-1]) if days else (fallback, fallback)
    first, last = min(first, last), max(first, last)
    return datetime.combine(first, datetime.min.time()), datetime.combine(last, datetime.min.time()) + timedelta(days=1)


def metric_columns(n: int, per_row: int = 4) -> list[Any]:
    """`n` slots for metric cards in rows of at most `per_row`, balanced (7 -> 4 + 3): seven in
    one row cut labels and values to "Rack tok/s per GPU (lo…" at 1280 px."""
    rows = max(1, math.ceil(n / per_row))
    width = math.ceil(n / rows)
    slots: list[Any] = []
    while len(slots) < n:
        slots += st.columns(width)
    return slots[:n]


def usd(v: float | None, digits: int = 2) -> str:
    """Dollars, the sign before the $ (−$3.59, not $-3.59); `digits` only below $100 (per-token
    prices of cents): $718.74, not $718.7375."""
    if v is None:
        return "—"
    digits = 2 if abs(v) >= 100 else digits
    return f"{'−' if v < 0 else ''}${abs(v):,.{digits}f}"


def usd_card(v: float | None) -> str:
    """Dollars for a metric card, which cuts a value past about ten characters at 1280 px ("$1,660,61…"
    for a month's cost): from a million up in millions ($1.661M); the card's help gives `usd(v)`."""
    if v is not None and abs(v) >= 1e6:
        return f"{'−' if v < 0 else ''}${abs(v) / 1e6:,.3f}M"
    return usd(v)


def compact(n: float) -> str:
    """A count in at most ~6 characters: 20,384,912 -> 20.4M (the exact figure goes in the card's help)."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:,.0f}"


REFRESH_SECONDS = 5  # the Live page refreshes at most this often: the collector's default interval
# Slower where a render takes long (one shared core: 5-8 s of queries and figures), so the browser,
# the collector and the twin get the rest of the machine.
REFRESH_STEPS = (REFRESH_SECONDS, 10, 15, 30, 60)


def refresh_every(render_seconds: float, now: int) -> int:
    """The refresh interval: at least twice the last render's time. Faster again only once a render
    takes under a quarter of the faster interval, so it does not flap (each change reruns the page)."""
    need = next((s for s in REFRESH_STEPS if s >= 2 * render_seconds), REFRESH_STEPS[-1])
    return need if need > now or render_seconds <= need / 4 else now


def request_columns() -> dict[str, Any]:
    """Column headings and formats of the tables of users and requests (Users, Cost): words and
    units, counts with thousands separators, never the warehouse's column names."""
    count = "localized"
    return {
        "user": st.column_config.TextColumn("user"),
        "user_id": st.column_config.TextColumn("user"),
        "tenant": st.column_config.TextColumn("tenant"),
        "requests": st.column_config.NumberColumn("requests", format=count),
        "errors": st.column_config.NumberColumn("errors", format=count),
        "tokens": st.column_config.NumberColumn("tokens", format=count),
        "prompt_tokens": st.column_config.NumberColumn("prompt tokens", format=count),
        "cached_prompt_tokens": st.column_config.NumberColumn("cached prompt tokens", format=count),
        "computed_prompt_tokens": st.column_config.NumberColumn("computed prompt tokens", format=count),
        "generated_tokens": st.column_config.NumberColumn("generated tokens", format=count),
        "tps_mean": st.column_config.NumberColumn("tok/s mean", format="%.1f"),
        "tps_p90": st.column_config.NumberColumn("tok/s P90", format="%.1f"),
        "ttft_p50": st.column_config.NumberColumn("TTFT p50 s", format="%.3f"),
        "ttft_p90": st.column_config.NumberColumn("TTFT p90 s", format="%.3f"),
        "cost_usd": st.column_config.NumberColumn("cost USD", format="dollar"),
        "finished_at": st.column_config.DatetimeColumn("finished (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "request_id": st.column_config.TextColumn("request id"),
        "ttft_seconds": st.column_config.NumberColumn("TTFT s", format="%.3f"),
        "tokens_per_second": st.column_config.NumberColumn("tok/s", format="%.1f"),
        "e2e_seconds": st.column_config.NumberColumn("end-to-end s", format="%.3f"),
    }
