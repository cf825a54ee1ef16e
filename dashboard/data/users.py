"""Queries behind the Users page: per-user throughput, tokens and latency from the gateway's records.

docs/definitions.md: per-user tokens/s of a request = 1 / its mean inter-token latency (ITL); "P90 per-user
tokens/s" is the slow tail, 1 / (90th percentile over requests of mean ITL). Windows up to
RAW_SECONDS read the per-request rows (exact quantiles); longer ones read the hourly sums and the
hourly ITL histogram (bins of 1%: quantiles within 0.5%), through the last whole hour, plus the
records stored since the last hourly roll-up (a request is rolled up by when it was stored and
counted in the hour it finished, so one stored late counts at once, not an hour later).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from warehouse.read import request_hours, run, run_time
from warehouse.requests import ITL_BIN_SCALE as BIN_SCALE

from .live import Query, Window

RAW_SECONDS = 6 * 3600


def hourly(w: Window) -> bool:
    return w.seconds > RAW_SECONDS


def _hours(w: Window) -> dict[str, Any]:
    """The hourly tables' parameters for this window's hours (its start's hour through its end's)."""
    return request_hours(
        w.start.replace(minute=0, second=0, microsecond=0), w.end.replace(minute=0, second=0, microsecond=0)
    )


def _span(w: Window) -> dict[str, Any]:
    return {"start": w.start, "end": w.end, "step_us": w.step_seconds * 1_000_000, "bin_scale": BIN_SCALE}


def _tps(itl: float | None) -> float:
    return 1.0 / itl if itl and itl > 0 and not math.isnan(itl) else math.nan


@dataclass(frozen=True)
class Summary:
    requests: int
    users: int
    errors: int
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    tps_p50: float  # per-user tokens/s, median request
    tps_p90: float  # per-user tokens/s, the slow tail (docs/definitions.md)
    ttft_p50: float  # seconds; the mean over the window when read from hourly sums
    ttft_p90: float  # seconds; NaN from hourly sums
    exact: bool  # quantiles from per-request rows (else from the 1% histogram)


def summary(q: Query, w: Window) -> Summary | None:
    if hourly(w):
        hours = _hours(w)
        tot = run(q, "users_summary_hourly", hours)
        if tot.empty or pd.isna(tot.n[0]) or not tot.n[0]:
            return None
        p50, p90 = itl_quantiles_from_histogram(q, hours["finished_from"], hours["finished_until"])
        r = tot.iloc[0]
        return Summary(
            int(r.n),
            int(r.users),
            int(r.errors),
            int(r.p),
            int(r.c),
            int(r.g),
            _tps(p50),
            _tps(p90),
            float(r.ttft) if pd.notna(r.ttft) else math.nan,
            math.nan,
            exact=False,
        )
    df = run(q, "users_summary", _span(w))
    if df.empty or not df.n[0]:
        return None
    r = df.iloc[0]
    nan = lambda v: float(v) if pd.notna(v) else math.nan  # noqa: E731
    return Summary(
        int(r.n),
        int(r.users),
        int(r.errors),
        int(r.p),
        int(r.c),
        int(r.g),
        _tps(nan(r.itl50)),
        _tps(nan(r.itl90)),
        nan(r.ttft50),
        nan(r.ttft90),
        exact=True,
    )


def itl_quantiles_from_histogram(q: Query, start: datetime, end: datetime) -> tuple[float, float]:
    """Median and 90th percentile of mean ITL (seconds) from the hourly 1% histogram."""
    df = run(q, "users_itl_quantiles_hourly", request_hours(start, end))
    if df.empty or pd.isna(df.b50[0]):
        return math.nan, math.nan
    return math.exp(float(df.b50[0]) / BIN_SCALE), math.exp(float(df.b90[0]) / BIN_SCALE)


def tps_histogram(q: Query, w: Window, width: int = 5) -> pd.DataFrame:
    """Requests by per-user tokens/s, in log bins `width`% wide: tokens_per_second (bin centre), requests."""
    if hourly(w):
        df = run(q, "users_tps_histogram_hourly", {**_hours(w), "width": width})
    else:
        df = run(q, "users_tps_histogram", {**_span(w), "width": width})
    if df.empty:
        return pd.DataFrame(columns=["tokens_per_second", "requests"])
    itl = ((df["k"].astype(float) + 0.5) * width / BIN_SCALE).map(math.exp)
    out = pd.DataFrame({"tokens_per_second": 1.0 / itl, "requests": df["requests"].astype(int)})
    keep = out["tokens_per_second"].map(math.isfinite) & (out["tokens_per_second"] > 0)  # a log axis takes no 0 or inf
    return out[keep].reset_index(drop=True)


def tps_over_time(q: Query, w: Window) -> pd.DataFrame:
    """bucket, tps_p50, tps_p90, requests: per-user tokens/s quantiles per step."""
    if hourly(w):
        df = run(q, "users_tps_over_time_hourly", _hours(w))
        if df.empty:
            return pd.DataFrame(columns=["bucket", "tps_p50", "tps_p90", "requests"])
        return pd.DataFrame(
            {
                "bucket": df["bucket"],
                "tps_p50": [math.exp(-b / BIN_SCALE) for b in df["b50"]],
                "tps_p90": [math.exp(-b / BIN_SCALE) for b in df["b90"]],
                "requests": df["requests"],
            }
        )
    df = run(q, "users_tps_over_time", _span(w))
    if df.empty:
        return pd.DataFrame(columns=["bucket", "tps_p50", "tps_p90", "requests"])
    return pd.DataFrame(
        {"bucket": df["bucket"], "tps_p50": 1.0 / df["i50"], "tps_p90": 1.0 / df["i90"], "requests": df["requests"]}
    )


USER_COLUMNS = [
    "user_id",
    "tenant",
    "requests",
    "errors",
    "prompt_tokens",
    "cached_prompt_tokens",
    "generated_tokens",
    "tokens",
    "tps_mean",
    "tps_p90",
    "ttft_p50",
    "ttft_p90",
]


def users_table(q: Query, w: Window, limit: int = 50, order: str = "tokens") -> pd.DataFrame:
    """Top users (user_id of tenant) of the window: tokens, requests, errors, per-user tokens/s (mean over requests;
    P90 slow tail from per-request rows only), TTFT. `order`: tokens | generated_tokens | requests."""
    if order not in ("tokens", "generated_tokens", "requests", "errors"):
        raise ValueError(f"cannot order users by {order!r}")
    if hourly(w):
        df = run(q, "users_table_hourly", {**_hours(w), "order": order, "limit": limit})
    else:
        df = run(q, "users_table", {**_span(w), "order": order, "limit": limit})
    return df.reindex(columns=USER_COLUMNS)


def find_users(q: Query, text: str, limit: int = 50) -> list[tuple[str, str]]:
    """(tenant, user id) of the users whose id or tenant contains `text` (case-insensitive), by user
    id, from all the history kept. A user is named within its tenant: two tenants' users of one
    name are two users."""
    df = run(q, "users_find", {"text": text, "limit": limit})
    return [(str(t), str(u)) for t, u in zip(df["tenant"], df["user_id"])]


def user_history(q: Query, w: Window, tenant: str, user: str) -> pd.DataFrame:
    """bucket, requests, errors, prompt_tokens, generated_tokens, tps_mean for one user of a tenant."""
    if hourly(w):
        return run(q, "users_history_hourly", {**_hours(w), "tenant": tenant, "user": user})
    return run(q, "users_history", {**_span(w), "tenant": tenant, "user": user})


def user_requests(q: Query, tenant: str, user: str, end: datetime, limit: int = 200) -> pd.DataFrame:
    """The latest requests of a user of a tenant (kept for the raw retention), newest first."""
    return run(q, "users_requests", {"tenant": tenant, "user": user, "end": end, "limit": limit})


def latest_request_time(q: Query) -> datetime | None:
    return run_time(q, "latest_request", "ts")


def window(latest: datetime, seconds: float) -> Window:
    """The `seconds` up to and including the latest request, so the table and the costs beside it
    (warehouse/cost.py) count the same requests."""
    return Window.ending(latest, seconds)
