"""Queries behind the Live page: pure functions of a query callable and a time window.

`q(sql, params) -> DataFrame` is the warehouse's query API (or a local connection in tests).
Every number follows docs/definitions.md; see docs/metrics.md for the families.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from collectors import DEFAULT_INTERVAL
from warehouse.read import Query, increases

RANGES = {"5 min": 300, "15 min": 900, "1 h": 3600, "6 h": 6 * 3600, "24 h": 86400, "7 d": 7 * 86400}
POINTS = 120  # points per chart
LATENCY_FAMILIES = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
)
ROLLUP_SECONDS = 60  # steps of whole minutes read the per-minute rollups


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    step_seconds: int

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @classmethod
    def ending(cls, end: datetime, seconds: float, scrape_interval: float = DEFAULT_INTERVAL) -> Window:
        """A window of `seconds` up to `end`, with a step that gives ~POINTS points and never
        less than two scrape intervals (so every step holds at least one increase)."""
        return cls.between(end - timedelta(seconds=seconds), end, scrape_interval)

    @classmethod
    def between(cls, start: datetime, end: datetime, scrape_interval: float = DEFAULT_INTERVAL) -> Window:
        step = max(int(2 * scrape_interval), int((end - start).total_seconds() // POINTS))
        for unit in (3600, ROLLUP_SECONDS):  # whole hours or minutes, so the rollups serve it
            if step >= unit:
                step = -(-step // unit) * unit
                break
        return cls(start, end, step)

    @property
    def tables(self) -> dict[str, str]:
        """Raw tables for steps under a minute, the per-minute or per-hour rollups otherwise
        (same columns). A rollup row is stamped with its period's start, so the window's first
        period counts whole."""
        for unit, suffix, width in ((3600, "1h", "1 HOUR"), (ROLLUP_SECONDS, "1m", "1 MINUTE")):
            if self.step_seconds >= unit and self.step_seconds % unit == 0:
                return {
                    "smp": f"samples_{suffix}",
                    "max": "x.max",
                    "after": f">= time_bucket(INTERVAL {width}, ?::TIMESTAMP)",
                    "exp": "expert_load_1h" if suffix == "1h" else "expert_load",
                }
        return {
            "smp": "samples",
            "max": "x.value",
            "after": "> ?::TIMESTAMP",
            "exp": "expert_load",
        }


# ------------------------------------------------------------------------ targets
def targets(q: Query, w: Window | None = None) -> pd.DataFrame:
    """Every target ever stored, or with a window those scraped in it: the ones in service then (a
    stack observed before, into the same database, is not counted in this one's pools)."""
    if w is None:
        return q("SELECT name, url, role, gpus, stack, hostname, last_seen FROM targets ORDER BY role, name", None)
    return q(
        """SELECT name, url, role, gpus, stack, hostname, last_seen FROM targets
                WHERE name IN (SELECT DISTINCT target FROM scrapes WHERE ts > ?::TIMESTAMP AND ts <= ?::TIMESTAMP)
                ORDER BY role, name""",
        [w.start, w.end],
    )


# The collector's interval as stored: the median gap between a target's scrapes in the last 15 min.
SCRAPE_INTERVAL_SQL = """
SELECT median(epoch(ts) - epoch(prev)) AS seconds
FROM (SELECT ts, lag(ts) OVER (PARTITION BY target ORDER BY ts) AS prev FROM scrapes
      WHERE ts > (SELECT max(ts) FROM scrapes) - INTERVAL 15 MINUTE)
WHERE prev IS NOT NULL
"""


def scrape_interval(q: Query) -> float:
    """Seconds between scrape rounds, from what the collector stored (`serve --interval 30` gives 30);
    the default interval before there are two rounds."""
    df = q(SCRAPE_INTERVAL_SQL, None)
    seconds = df["seconds"].iloc[0] if len(df) else None
    return DEFAULT_INTERVAL if seconds is None or pd.isna(seconds) or seconds <= 0 else float(seconds)


def latest_scrape_time(q: Query) -> datetime | None:
    df = q("SELECT max(ts) AS ts FROM scrapes", None)
    ts = df["ts"].iloc[0] if len(df) else None
    return None if ts is None or pd.isna(ts) else pd.Timestamp(ts).to_pydatetime()


def pool_gpus(tgts: pd.DataFrame) -> dict[str, int]:
    """GPUs per pool from the targets file; the rack is every GPU its exporters report."""
    by_role = tgts.groupby("role")["gpus"].sum().to_dict() if len(tgts) else {}
    prefill, decode = int(by_role.get("prefill", 0)), int(by_role.get("decode", 0))
    rack = int(by_role.get("gpu", 0)) or prefill + decode
    return {"prefill": prefill, "decode": decode, "rack": rack}


# ------------------------------------------------------------------------- tokens
def counters(q: Query, statement: str, w: Window, params: dict[str, Any] | None = None) -> pd.DataFrame:
    """A counter statement of warehouse/sql over the window, per step, through the read layer."""
    return increases(q, statement, w.start, w.end, w.step_seconds, params)


def token_rates(q: Query, w: Window) -> pd.DataFrame:
    """Per bucket and pool: prompt, cached-prompt and generated tokens per second."""
    return counters(q, "live_tokens", w)


def tokens_per_gpu(rates: pd.DataFrame, gpus: dict[str, int]) -> pd.DataFrame:
    """docs/definitions.md tokens/s per GPU, long form: bucket, series, value.

    prefill logical = prompt tokens (cache hits included) / prefill GPUs; prefill computed =
    (prompt - cached) / prefill GPUs; decode = generated / decode GPUs (its prompt tokens came
    by KV transfer and are not counted again); rack = (prefill prompt + decode generated) / all GPUs.
    """
    cols = ["bucket", "series", "value"]
    if rates.empty:
        return pd.DataFrame(columns=cols)
    wide = rates.pivot_table(
        index="bucket", columns="role", values=["prompt_per_s", "cached_per_s", "generated_per_s"], aggfunc="sum"
    ).fillna(0.0)

    def col(metric: str, role: str) -> pd.Series:
        key = (metric, role)
        return wide[key] if key in wide.columns else pd.Series(0.0, index=wide.index)

    prompt, cached = col("prompt_per_s", "prefill"), col("cached_per_s", "prefill")
    generated = col("generated_per_s", "decode")
    out = {}
    if gpus["prefill"]:
        out["prefill logical"] = prompt / gpus["prefill"]
        out["prefill computed"] = (prompt - cached) / gpus["prefill"]
    if gpus["decode"]:
        out["decode"] = generated / gpus["decode"]
    if gpus["rack"]:
        out["rack logical"] = (prompt + generated) / gpus["rack"]
    df = pd.DataFrame(out)
    df.index.name = "bucket"
    return df.reset_index().melt(id_vars="bucket", var_name="series", value_name="value")[cols]


# --------------------------------------------------------------------- histograms
def histograms_counts(q: Query, w: Window, families: list[str]) -> dict[str, pd.DataFrame]:
    """Per vLLM histogram family: its bucket increases, summed over engines, per step and pool
    (bucket, role, le, count); all families in one pass over the increments, not one each."""
    df = counters(q, "live_histograms", w, {"families": [f"{f}_bucket" for f in families]})
    cols = ["bucket", "role", "le", "count"]
    return {f: df.loc[df["metric"] == f"{f}_bucket", cols].reset_index(drop=True) for f in families}


def histogram_quantile(quantile: float, les: np.ndarray, cumulative: np.ndarray) -> float:
    """Prometheus histogram_quantile: linear interpolation inside the bucket holding the rank."""
    order = np.argsort(les)
    les, cumulative = np.asarray(les, float)[order], np.asarray(cumulative, float)[order]
    if les.size < 2 or not np.isinf(les[-1]) or cumulative[-1] <= 0:
        return float("nan")
    cumulative = np.maximum.accumulate(cumulative)  # guard against ragged increases
    rank = quantile * cumulative[-1]
    b = int(np.searchsorted(cumulative, rank, side="left"))
    if b >= les.size - 1:  # in the +Inf bucket: the highest finite bound
        return float(les[-2])
    lower = 0.0 if b == 0 else les[b - 1]
    prev = 0.0 if b == 0 else cumulative[b - 1]
    upper, count = les[b], cumulative[b] - prev
    if count <= 0:
        return float(upper)
    return float(lower + (upper - lower) * (rank - prev) / count)


def quantiles_over_time(counts: pd.DataFrame, quantiles: tuple[float, ...]) -> pd.DataFrame:
    """Long form: bucket, role, quantile, value (NaN where nothing was observed)."""
    rows = []
    for (bucket, role), g in counts.groupby(["bucket", "role"], sort=True):
        for qt in quantiles:
            rows.append((bucket, role, qt, histogram_quantile(qt, g["le"].to_numpy(), g["count"].to_numpy())))
    return pd.DataFrame(rows, columns=["bucket", "role", "quantile", "value"])


def quantile_overall(counts: pd.DataFrame, quantile: float, role: str) -> float:
    """One quantile over the whole window for one pool."""
    g = counts[counts["role"] == role].groupby("le")["count"].sum()
    return histogram_quantile(quantile, g.index.to_numpy(), g.to_numpy()) if len(g) else float("nan")


def per_user_tokens_per_second(tpot_counts: pd.DataFrame) -> pd.DataFrame:
    """docs/definitions.md P90 per-user throughput: 1 / (P90 over requests of mean inter-token latency),
    from the decode pool's request_time_per_output_token histogram (prefill requests emit one token)."""
    dec = tpot_counts[tpot_counts["role"] == "decode"]
    out = quantiles_over_time(dec, (0.9,))
    out["value"] = 1.0 / out["value"]
    return out[["bucket", "value"]]


# ------------------------------------------------------------------------ gauges
GAUGE_SQL = """
WITH per_ts AS (
    SELECT x.ts, s.role,
           sum(x.value) FILTER (WHERE s.metric = 'vllm:num_requests_running') AS running,
           sum(x.value) FILTER (WHERE s.metric = 'vllm:num_requests_waiting') AS waiting,
           avg(x.value) FILTER (WHERE s.metric = 'vllm:kv_cache_usage_perc') AS kv_mean,
           max({max}) FILTER (WHERE s.metric = 'vllm:kv_cache_usage_perc') AS kv_max
    FROM {smp} x JOIN series_targets s USING (series_id)
    WHERE x.ts {after} AND x.ts <= ?::TIMESTAMP AND s.role IN ('prefill', 'decode')
      AND s.metric IN ('vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc')
    GROUP BY ALL
)
SELECT time_bucket(to_seconds(?::BIGINT), ts) AS bucket, role,
       avg(running) AS running, avg(waiting) AS waiting, avg(kv_mean) AS kv_mean, max(kv_max) AS kv_max
FROM per_ts GROUP BY ALL ORDER BY bucket, role
"""


def queue_and_kv(q: Query, w: Window) -> pd.DataFrame:
    """Running and waiting requests (sum over engines) and KV-cache use (mean, max) per pool."""
    return q(GAUGE_SQL.format(**w.tables), [w.start, w.end, w.step_seconds])


# --------------------------------------------------------------------------- GPUs
GPU_LATEST_SQL = """
WITH last AS (SELECT target, max(ts) AS ts FROM scrapes WHERE up GROUP BY target)
SELECT s.target, s.hostname, json_extract_string(s.labels, '$.gpu')::INTEGER AS gpu,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_pct,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_POWER_USAGE') AS power_watts,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_FB_USED') AS fb_used_mib,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_GPU_TEMP') AS temp_c,
       max(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_MEMORY_TEMP') AS memory_temp_c,
       max(x.ts) AS ts
FROM samples x JOIN series_targets s USING (series_id) JOIN last l ON l.target = s.target AND l.ts = x.ts
WHERE s.role = 'gpu' AND x.ts >= (SELECT min(ts) FROM last) AND x.ts > ?::TIMESTAMP
GROUP BY ALL ORDER BY s.target, gpu
"""


def gpus_latest(q: Query, since: datetime) -> pd.DataFrame:
    """Each GPU's latest utilisation, power, memory and temperature (NULL where DCGM had none)."""
    return q(GPU_LATEST_SQL, [since])


GPU_TIME_SQL = """
SELECT time_bucket(to_seconds(?::BIGINT), x.ts) AS bucket,
       avg(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_pct,
       sum(x.value) FILTER (WHERE s.metric = 'DCGM_FI_DEV_POWER_USAGE')
         / count(DISTINCT x.ts) AS power_watts
FROM {smp} x JOIN series_targets s USING (series_id)
WHERE x.ts {after} AND x.ts <= ?::TIMESTAMP AND s.role = 'gpu'
  AND s.metric IN ('DCGM_FI_DEV_GPU_UTIL', 'DCGM_FI_DEV_POWER_USAGE')
GROUP BY ALL ORDER BY bucket
"""


def gpus_over_time(q: Query, w: Window) -> pd.DataFrame:
    """Mean GPU utilisation and total rack power per step."""
    return q(GPU_TIME_SQL.format(**w.tables), [w.step_seconds, w.start, w.end])


# ------------------------------------------------------------------------- health
HEALTH_SQL = """
WITH s AS (
    SELECT target, arg_max(up, ts) AS up, max(ts) AS last_scrape,
           -- _null: the last scrape's own values, NULL included (arg_max skips NULLs: a recovered
           -- target showed its old error beside up)
           arg_max_null(duration_seconds, ts) AS duration_seconds, arg_max_null(samples, ts) AS samples,
           arg_max_null(error, ts) AS error,
           count(*) FILTER (WHERE NOT up) AS failures, count(*) AS scrapes
    FROM scrapes WHERE ts > ?::TIMESTAMP AND ts <= ?::TIMESTAMP GROUP BY target),
r AS (
    SELECT target, sum(count) AS refused, arg_max(kind || ': ' || reason, ts) AS last_refusal
    FROM rejected WHERE ts > ?::TIMESTAMP AND ts <= ?::TIMESTAMP GROUP BY target)
SELECT s.*, coalesce(r.refused, 0)::BIGINT AS refused, r.last_refusal
FROM s LEFT JOIN r USING (target) ORDER BY up, target
"""


def scrape_health(q: Query, w: Window) -> pd.DataFrame:
    """Per target: up at the last scrape, its duration, samples and error; failures in the window;
    inputs refused or repaired in the window (samples, records, snapshots) and the latest reason."""
    return q(HEALTH_SQL, [w.start, w.end, w.start, w.end])


# ---------------------------------------------------------------------- headline
@dataclass(frozen=True)
class Headline:
    rack_tokens_per_gpu: float
    prefill_computed_per_gpu: float
    decode_tokens_per_gpu: float
    p90_user_tokens_per_s: float
    ttft_p90_seconds: float
    itl_p50_seconds: float
    targets_up: int
    targets_total: int


def headline(
    tpg: pd.DataFrame,
    ttft: pd.DataFrame,
    itl: pd.DataFrame,
    tpot: pd.DataFrame,
    health: pd.DataFrame,
    last_buckets: int = 3,
) -> Headline:
    """The numbers on top of the page, over the last few complete steps."""

    def recent(series: str) -> float:
        s = tpg[tpg["series"] == series].sort_values("bucket")
        s = s.iloc[:-1] if len(s) > 1 else s  # the newest step is still filling
        return float(s["value"].tail(last_buckets).mean()) if len(s) else float("nan")

    def recent_counts(df: pd.DataFrame) -> pd.DataFrame:
        buckets = sorted(df["bucket"].unique())[-(last_buckets + 1) :]
        return df[df["bucket"].isin(buckets)]

    tp = quantile_overall(recent_counts(tpot), 0.9, "decode") if len(tpot) else float("nan")
    return Headline(
        rack_tokens_per_gpu=recent("rack logical"),
        prefill_computed_per_gpu=recent("prefill computed"),
        decode_tokens_per_gpu=recent("decode"),
        p90_user_tokens_per_s=1.0 / tp if tp and tp > 0 else float("nan"),
        ttft_p90_seconds=quantile_overall(recent_counts(ttft), 0.9, "prefill") if len(ttft) else float("nan"),
        itl_p50_seconds=quantile_overall(recent_counts(itl), 0.5, "decode") if len(itl) else float("nan"),
        targets_up=int(health["up"].sum()) if len(health) else 0,
        targets_total=len(health),
    )
