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
from datetime import datetime, timedelta

import pandas as pd

from warehouse.requests import HOURLY, HOURLY_ITL
from warehouse.requests import ITL_BIN_SCALE as BIN_SCALE

from .live import Query, Window

RAW_SECONDS = 6 * 3600


def hourly(w: Window) -> bool:
    return w.seconds > RAW_SECONDS


def _hours(w: Window) -> list[datetime]:
    """The parameters of HOURLY / HOURLY_ITL: the whole hours of this window."""
    return _between(
        w.start.replace(minute=0, second=0, microsecond=0), w.end.replace(minute=0, second=0, microsecond=0)
    )


def _between(start: datetime, end: datetime) -> list[datetime]:
    return [start, end, start, end]


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
        tot = q(
            f"""WITH {HOURLY}
                   SELECT sum(requests) n, count(DISTINCT user_id) users, sum(errors) errors, sum(prompt_tokens) p,
                          sum(cached_prompt_tokens) c, sum(generated_tokens) g,
                          sum(ttft_sum_seconds) / nullif(sum(requests), 0) ttft
                   FROM hourly""",
            hours,
        )
        if tot.empty or pd.isna(tot.n[0]) or not tot.n[0]:
            return None
        p50, p90 = itl_quantiles_from_histogram(q, hours[0], hours[1])
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
    df = q(
        """SELECT count(*) n, count(DISTINCT user_id) users, count(*) FILTER (WHERE outcome <> 'ok') errors,
                     sum(prompt_tokens) p, coalesce(sum(cached_prompt_tokens), 0) c, sum(generated_tokens) g,
                     quantile_cont(itl_mean_seconds, 0.5) itl50, quantile_cont(itl_mean_seconds, 0.9) itl90,
                     quantile_cont(ttft_seconds, 0.5) ttft50, quantile_cont(ttft_seconds, 0.9) ttft90
              FROM requests WHERE finished_at >= ? AND finished_at < ?""",
        [w.start, w.end],
    )
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
    df = q(
        f"""WITH {HOURLY_ITL}, h AS (SELECT bin, sum(requests) n FROM itl GROUP BY bin),
                   c AS (SELECT bin, sum(n) OVER (ORDER BY bin) cum, sum(n) OVER () total FROM h)
              SELECT min(bin) FILTER (WHERE cum >= 0.5 * total) b50, min(bin) FILTER (WHERE cum >= 0.9 * total) b90
              FROM c""",
        _between(start, end),
    )
    if df.empty or pd.isna(df.b50[0]):
        return math.nan, math.nan
    return math.exp(float(df.b50[0]) / BIN_SCALE), math.exp(float(df.b90[0]) / BIN_SCALE)


def tps_histogram(q: Query, w: Window, width: int = 5) -> pd.DataFrame:
    """Requests by per-user tokens/s, in log bins `width`% wide: tokens_per_second (bin centre), requests."""
    if hourly(w):
        df = q(
            f"""WITH {HOURLY_ITL} SELECT floor(bin / {width}) k, sum(requests)::BIGINT requests FROM itl
                   GROUP BY ALL ORDER BY k""",
            _hours(w),
        )
    else:
        df = q(
            f"""SELECT floor({BIN_SCALE} * ln(itl_mean_seconds) / {width}) k, count(*) requests FROM requests
                   WHERE finished_at >= ? AND finished_at < ? AND itl_mean_seconds > 0
                   GROUP BY ALL ORDER BY k""",
            [w.start, w.end],
        )
    if df.empty:
        return pd.DataFrame(columns=["tokens_per_second", "requests"])
    itl = ((df["k"].astype(float) + 0.5) * width / BIN_SCALE).map(math.exp)
    out = pd.DataFrame({"tokens_per_second": 1.0 / itl, "requests": df["requests"].astype(int)})
    keep = out["tokens_per_second"].map(math.isfinite) & (out["tokens_per_second"] > 0)  # a log axis takes no 0 or inf
    return out[keep].reset_index(drop=True)


def tps_over_time(q: Query, w: Window) -> pd.DataFrame:
    """bucket, tps_p50, tps_p90, requests: per-user tokens/s quantiles per step."""
    if hourly(w):
        df = q(
            f"""WITH {HOURLY_ITL}, h AS (SELECT ts, bin, sum(requests) requests FROM itl GROUP BY ALL),
                  c AS (SELECT ts, bin, sum(requests) OVER (PARTITION BY ts ORDER BY bin) cum,
                               sum(requests) OVER (PARTITION BY ts) total FROM h)
                  SELECT ts bucket, min(bin) FILTER (WHERE cum >= 0.5 * total) b50,
                         min(bin) FILTER (WHERE cum >= 0.9 * total) b90, max(total)::BIGINT requests
                  FROM c GROUP BY ts ORDER BY ts""",
            _hours(w),
        )
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
    df = q(
        """SELECT time_bucket(to_seconds(?::BIGINT), finished_at) bucket, quantile_cont(itl_mean_seconds, 0.5) i50,
                     quantile_cont(itl_mean_seconds, 0.9) i90, count(*) requests
              FROM requests WHERE finished_at >= ? AND finished_at < ? AND itl_mean_seconds > 0
              GROUP BY ALL ORDER BY bucket""",
        [w.step_seconds, w.start, w.end],
    )
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
    """Top users of the window: tokens, requests, errors, per-user tokens/s (mean over requests;
    P90 slow tail from per-request rows only), TTFT. `order`: tokens | generated_tokens | requests."""
    if order not in ("tokens", "generated_tokens", "requests", "errors"):
        raise ValueError(f"cannot order users by {order!r}")
    if hourly(w):
        df = q(
            f"""WITH {HOURLY}
                   SELECT user_id, string_agg(DISTINCT tenant, ', ') tenant, sum(requests)::BIGINT requests,
                          sum(errors)::BIGINT errors, sum(prompt_tokens)::BIGINT prompt_tokens,
                          sum(cached_prompt_tokens)::BIGINT cached_prompt_tokens,
                          sum(generated_tokens)::BIGINT generated_tokens,
                          sum(prompt_tokens + generated_tokens)::BIGINT tokens,
                          sum(timed) / nullif(sum(itl_sum_seconds), 0) tps_mean, NULL::DOUBLE tps_p90,
                          sum(ttft_sum_seconds) / nullif(sum(requests), 0) ttft_p50, NULL::DOUBLE ttft_p90
                   FROM hourly GROUP BY user_id
                   ORDER BY {order} DESC, user_id LIMIT ?""",
            [*_hours(w), limit],
        )
    else:
        df = q(
            f"""SELECT user_id, string_agg(DISTINCT tenant, ', ') tenant, count(*) requests,
                          count(*) FILTER (WHERE outcome <> 'ok') errors, sum(prompt_tokens)::BIGINT prompt_tokens,
                          coalesce(sum(cached_prompt_tokens), 0)::BIGINT cached_prompt_tokens,
                          sum(generated_tokens)::BIGINT generated_tokens,
                          sum(prompt_tokens + generated_tokens)::BIGINT tokens,
                          count(itl_mean_seconds) / nullif(sum(itl_mean_seconds), 0) tps_mean,
                          1 / quantile_cont(itl_mean_seconds, 0.9) tps_p90,
                          quantile_cont(ttft_seconds, 0.5) ttft_p50, quantile_cont(ttft_seconds, 0.9) ttft_p90
                   FROM requests WHERE finished_at >= ? AND finished_at < ? GROUP BY user_id
                   ORDER BY {order} DESC, user_id LIMIT ?""",
            [w.start, w.end, limit],
        )
    return df.reindex(columns=USER_COLUMNS)


def find_users(q: Query, text: str, limit: int = 50) -> list[str]:
    """User ids containing `text` (case-insensitive), most active first, from all the history kept."""
    df = q(
        """SELECT user_id FROM requests_1h WHERE user_id ILIKE ? GROUP BY user_id
              UNION SELECT user_id FROM requests WHERE user_id ILIKE ? GROUP BY user_id
              ORDER BY user_id LIMIT ?""",
        [f"%{text}%", f"%{text}%", limit],
    )
    return [str(u) for u in df["user_id"]]


def user_history(q: Query, w: Window, user: str) -> pd.DataFrame:
    """bucket, requests, errors, prompt_tokens, generated_tokens, tps_mean for one user."""
    if hourly(w):
        return q(
            f"""WITH {HOURLY}
                    SELECT ts bucket, sum(requests)::BIGINT requests, sum(errors)::BIGINT errors,
                           sum(prompt_tokens)::BIGINT prompt_tokens, sum(generated_tokens)::BIGINT generated_tokens,
                           sum(timed) / nullif(sum(itl_sum_seconds), 0) tps_mean
                    FROM hourly WHERE user_id = ? GROUP BY ts ORDER BY ts""",
            [*_hours(w), user],
        )
    return q(
        """SELECT time_bucket(to_seconds(?::BIGINT), finished_at) bucket, count(*) requests,
                       count(*) FILTER (WHERE outcome <> 'ok') errors, sum(prompt_tokens)::BIGINT prompt_tokens,
                       sum(generated_tokens)::BIGINT generated_tokens,
                       count(itl_mean_seconds) / nullif(sum(itl_mean_seconds), 0) tps_mean
                FROM requests WHERE user_id = ? AND finished_at >= ? AND finished_at < ? GROUP BY ALL ORDER BY bucket""",
        [w.step_seconds, user, w.start, w.end],
    )


def user_requests(q: Query, user: str, end: datetime, limit: int = 200) -> pd.DataFrame:
    """The user's latest requests (kept for the raw retention), newest first."""
    return q(
        """SELECT finished_at, request_id, tenant, model, outcome, status, prompt_tokens, cached_prompt_tokens,
                       generated_tokens, ttft_seconds, 1 / itl_mean_seconds AS tokens_per_second, e2e_seconds
                FROM requests WHERE user_id = ? AND finished_at < ? ORDER BY finished_at DESC LIMIT ?""",
        [user, end, limit],
    )


def latest_request_time(q: Query) -> datetime | None:
    df = q("SELECT max(finished_at) ts FROM requests", None)
    ts = df["ts"].iloc[0] if len(df) else None
    return None if ts is None or pd.isna(ts) else pd.Timestamp(ts).to_pydatetime()


def window(latest: datetime, seconds: float) -> Window:
    """The `seconds` up to and including the latest request: [latest - seconds, latest + 1 us), so the
    table and the costs beside it (warehouse/cost.py) count the same requests."""
    end = latest + timedelta(microseconds=1)
    return Window.between(end - timedelta(seconds=seconds), end)
