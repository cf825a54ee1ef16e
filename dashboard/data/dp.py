"""Queries behind the DP ranks page: each engine (data-parallel rank) of a pool over time, and
which one straggles. One lagging rank stalls every rank's all-to-all, so the page puts the pool's
engines side by side. The straggler score is docs/definitions.md's (DP ranks), judged with the
alert pack's thresholds (warehouse/alerts.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from warehouse.alerts import AlertRules
from warehouse.read import Query, Window, at_resolution

from .live import counters
from .spec import drafting

KEYS = ["target", "engine"]
SIGNALS = ("waiting", "running", "kv_usage", "tokens_per_step", "step_ms", "xfer_ms", "acceptance_length")
COUNTS = [
    "tokens",
    "steps",
    "step_seconds",
    "timed_steps",
    "xfer_seconds",
    "transfers",
    "failed_transfers",
    "expired_kv",
    "drafts",
    "accepted_tokens",
]
"""What dp_steps.sql counts per step and engine, and the spec-decode drafts and accepted tokens
(warehouse/spec.py; NaN on an engine without a draft path)."""


def engine_label(target: object, engine: object) -> str:
    return f"{target} · DP {engine}"


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in (target, engine) order, engines numerically (DP 2 before DP 10)."""
    rank = pd.to_numeric(df["engine"], errors="coerce")
    return df.assign(_rank=rank).sort_values(["target", "_rank", "engine"], kind="stable").drop(columns="_rank")


def engines_over_time(q: Query, w: Window, role: str) -> pd.DataFrame:
    """Per step and engine of pool `role`: running, waiting, kv_usage (0-1), the counts of COUNTS,
    tokens_per_step, step_ms, xfer_ms (the mean NIXL KV transfer) and acceptance_length (1 +
    accepted / drafts); NaN where none was counted."""
    gauges = at_resolution(q, "dp_gauges", w, {"role": role})
    steps = counters(q, "dp_steps", w, {"role": role})
    drafted = drafting(q, w).over_time("engine", positions=False)
    drafted = drafted.loc[drafted["role"] == role, ["bucket", *KEYS, "drafts", "accepted_tokens"]]
    for frame in (gauges, steps, drafted):
        frame["bucket"] = pd.to_datetime(frame["bucket"])
        frame["engine"] = frame["engine"].astype(str)
    df = gauges.merge(steps, on=["bucket", *KEYS], how="outer").merge(drafted, on=["bucket", *KEYS], how="left")
    df["tokens_per_step"] = df["tokens"] / df["steps"].where(df["steps"] > 0)
    df["step_ms"] = 1000 * df["step_seconds"] / df["timed_steps"].where(df["timed_steps"] > 0)
    df["xfer_ms"] = 1000 * df["xfer_seconds"] / df["transfers"].where(df["transfers"] > 0)
    df["acceptance_length"] = 1 + df["accepted_tokens"] / df["drafts"].where(df["drafts"] > 0)
    df["label"] = [engine_label(t, e) for t, e in zip(df["target"], df["engine"])]
    return _ordered(df).sort_values("bucket", kind="stable").reset_index(drop=True)


def waiting_floor(rules: AlertRules) -> float:
    """The least median waiting queue a ratio is taken against: below it a near-idle pool's median
    is no yardstick, and the alert's own floor (straggler_min_waiting) still holds."""
    return rules.straggler_min_waiting / rules.straggler_factor


def straggler_scores(over_time: pd.DataFrame, rules: AlertRules) -> pd.DataFrame:
    """Per engine over the window: the mean waiting and running queues and KV use, tokens per step,
    mean step time, mean NIXL KV transfer time and mean acceptance length (from the window's sums),
    its KV transfers, failed
    transfers and expired-KV requests, the pool's median engine of each, and the score:
    max(waiting / max(median waiting, straggler_min_waiting / straggler_factor) / straggler_factor,
    step time / median step time / straggler_step_factor), the step time judged only over at least
    straggler_min_steps steps, as the alert judges it. Over 1: the engine meets the
    DPEngineStraggler condition on the window's means (the alert also holds it for
    straggler_minutes). Highest score first."""
    if over_time.empty:
        columns = [*KEYS, "label", *SIGNALS, "transfers", "failed_transfers", "expired_kv"]
        return pd.DataFrame(columns=[*columns, "waiting_ratio", "step_ratio", "score"])
    g = over_time.groupby([*KEYS, "label"], sort=False)
    out = g[["waiting", "running", "kv_usage"]].mean()
    sums = g[COUNTS].sum(min_count=1)
    out["tokens_per_step"] = sums["tokens"] / sums["steps"].where(sums["steps"] > 0)
    out["step_ms"] = 1000 * sums["step_seconds"] / sums["timed_steps"].where(sums["timed_steps"] > 0)
    out["xfer_ms"] = 1000 * sums["xfer_seconds"] / sums["transfers"].where(sums["transfers"] > 0)
    out["acceptance_length"] = 1 + sums["accepted_tokens"] / sums["drafts"].where(sums["drafts"] > 0)
    out[["transfers", "failed_transfers", "expired_kv"]] = sums[["transfers", "failed_transfers", "expired_kv"]]
    out = out.reset_index()
    out["waiting_ratio"] = out["waiting"] / max(float(out["waiting"].median()), waiting_floor(rules))
    median_step = out["step_ms"].median()
    out["step_ratio"] = out["step_ms"] / median_step if median_step > 0 else np.nan
    out.loc[~(sums["timed_steps"].to_numpy() >= rules.straggler_min_steps), "step_ratio"] = np.nan  # too few to judge
    out["score"] = pd.concat(
        [out["waiting_ratio"] / rules.straggler_factor, out["step_ratio"] / rules.straggler_step_factor], axis=1
    ).max(axis=1, skipna=True)
    return _ordered(out).sort_values("score", ascending=False, kind="stable").reset_index(drop=True)


def grid(over_time: pd.DataFrame, column: str) -> pd.DataFrame:
    """One signal as engine x step (rows in engine order, columns in time order)."""
    labels = list(dict.fromkeys(_ordered(over_time.drop_duplicates(KEYS))["label"]))
    table = over_time.pivot_table(index="label", columns="bucket", values=column, aggfunc="first", dropna=False)
    return table.reindex(index=labels)
