"""Queries behind the Live page: pure functions of a query callable and a time window.

`q(sql, params) -> DataFrame` is the warehouse's query API (or a local connection in tests).
Every number follows docs/definitions.md; see docs/metrics.md for the families.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from moemeter.contract import DEFAULT_INTERVAL, computed_tokens, windows
from warehouse.read import Query, Window, at_resolution, increases, run, run_time

LATENCY_FAMILIES = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
)


# ------------------------------------------------------------------------ targets
def targets(q: Query, w: Window | None = None) -> pd.DataFrame:
    """Every target ever stored, or with a window those scraped in it: the ones in service then (a
    stack observed before, into the same database, is not counted in this one's pools)."""
    if w is None:
        return run(q, "targets")
    return run(q, "targets_in", {"start": w.start, "end": w.end})


def scrape_interval(q: Query) -> float:
    """Seconds between scrape rounds, from what the collector stored (`serve --interval 30` gives 30);
    the default interval before there are two rounds."""
    df = run(q, "scrape_interval")
    seconds = df["seconds"].iloc[0] if len(df) else None
    return DEFAULT_INTERVAL if seconds is None or pd.isna(seconds) or seconds <= 0 else float(seconds)


def latest_scrape_time(q: Query) -> datetime | None:
    return run_time(q, "latest_scrape", "ts")


def recent(q: Query, latest: datetime, key: str) -> Window:
    """The window a page's time-range picker names (a key of moemeter/contract/windows.py), up to
    and including the latest scrape, at the scrape interval stored."""
    return Window.ending(latest, windows.span(key).total_seconds(), scrape_interval(q))


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
        out["prefill computed"] = computed_tokens(prompt, cached) / gpus["prefill"]
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
def queue_and_kv(q: Query, w: Window) -> pd.DataFrame:
    """Running and waiting requests (sum over engines) and KV-cache use (mean, max) per pool."""
    return at_resolution(q, "live_gauges", w)


# --------------------------------------------------------------------------- GPUs
def gpus_latest(q: Query, since: datetime) -> pd.DataFrame:
    """Each GPU's latest utilisation, power, memory and temperature (NULL where DCGM had none)."""
    return run(q, "gpus_latest", {"since": since})


def gpus_over_time(q: Query, w: Window) -> pd.DataFrame:
    """Mean GPU utilisation and total rack power per step."""
    return at_resolution(q, "gpus_over_time", w)


# ------------------------------------------------------------------------- health
def scrape_health(q: Query, w: Window) -> pd.DataFrame:
    """Per target: up at the last scrape, its duration, samples and error; failures in the window;
    inputs refused or repaired in the window (samples, records, snapshots) and the latest reason."""
    return run(q, "scrape_health", {"start": w.start, "end": w.end})


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
