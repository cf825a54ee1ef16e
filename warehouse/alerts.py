"""Alert thresholds, one definition for the warehouse and for Prometheus: the EPLB hot-spot rules
are evaluated here over the warehouse and exported as a Prometheus rules group; the rest of the
alert pack (warehouse/rules.py) reads its thresholds from the same `AlertRules`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class AlertRules:
    hot_rank_factor: float = 1.5
    """A rank is hot when its load in a layer exceeds this many times the layer's mean rank load."""
    hot_rank_minutes: float = 10.0
    """...for at least this long, minutes."""
    min_balancedness: float = 0.7
    """A layer is unbalanced when its balancedness (mean/max rank load) is below this."""
    unbalanced_minutes: float = 10.0
    """...for at least this long, minutes."""
    max_rebalance_gap_seconds: float = 900.0
    """No EPLB rebalance for longer than this, seconds (3x the default interval)."""

    burn_fast: float = 14.4
    """Fast burn of the SLO sheet's default class (warehouse/slo.py holds the objectives and targets):
    2% of a 30-day budget in one hour (over 1 h and 5 min), as in Google's SRE workbook."""
    burn_slow: float = 6.0
    """Slow burn: 5% of a 30-day budget in six hours (over 6 h and 30 min)."""
    kv_usage_max: float = 0.95
    """An engine's KV cache is saturated when its usage stays above this..."""
    kv_minutes: float = 5.0
    """...for this long, minutes."""
    preemptions_per_minute: float = 1.0
    """Preempted requests per minute and engine that warn (the rate over 10 minutes, held 5)."""
    straggler_factor: float = 3.0
    """A DP engine straggles when its waiting queue is this many times its pool's median..."""
    straggler_min_waiting: float = 4.0
    """...and at least this many requests long, on average over 2 minutes (an idle pool has no stragglers)."""
    straggler_step_factor: float = 1.5
    """...or its mean engine-step time is this many times its pool's median."""
    straggler_minutes: float = 5.0
    """...for this long, minutes."""
    target_down_minutes: float = 2.0
    """A target that failed its scrapes this long is down."""
    idle_minutes: float = 15.0
    """A pool whose engines are up and produced no token for this long is idle."""
    cost_spike_factor: float = 2.0
    """$/M tokens of a pool over the last hour at least this many times its 24-hour figure..."""
    cost_spike_minutes: float = 30.0
    """...for this long, minutes."""


@dataclass(frozen=True)
class Firing:
    rule: str
    subject: str  # e.g. "layer 7 rank 12"
    value: float
    since: pd.Timestamp | None
    message: str


def evaluate_alerts(
    rules: AlertRules, rank_steps: pd.DataFrame, last_rebalance: pd.Timestamp | None, now: pd.Timestamp
) -> list[Firing]:
    """rank_steps: bucket, layer, rank, tokens (one row per step, layer and rank)."""
    out: list[Firing] = []
    if not rank_steps.empty:
        df = rank_steps.copy()
        layer_mean = df.groupby(["bucket", "layer"])["tokens"].transform("mean")
        df["ratio"] = df["tokens"] / layer_mean.where(layer_mean > 0)
        end = df["bucket"].max()

        def trailing(frame: pd.DataFrame, minutes: float) -> pd.DataFrame | None:
            """The last `minutes` of steps, or None when the data does not span them yet."""
            span = frame[frame["bucket"] > end - pd.Timedelta(minutes=minutes)]
            step = frame["bucket"].drop_duplicates().sort_values().diff().min()
            ok = pd.notna(step) and span["bucket"].max() - span["bucket"].min() + step >= pd.Timedelta(minutes=minutes)
            return span if ok else None

        # hot rank: every step of the trailing span above the factor
        span = trailing(df, rules.hot_rank_minutes)
        if span is not None:
            hot = span.groupby(["layer", "rank"])["ratio"].min()
            for (layer, rank), ratio in hot[hot > rules.hot_rank_factor].sort_values(ascending=False).items():
                since = _since(
                    df[(df["layer"] == layer) & (df["rank"] == rank)], "ratio", lambda r: r > rules.hot_rank_factor
                )
                out.append(
                    Firing(
                        "EPLBRankHot",
                        f"layer {layer} rank {rank}",
                        float(ratio),
                        since,
                        f"rank {rank} carries at least {ratio:.2f}x the mean load of layer {layer}",
                    )
                )
        g = df.groupby(["bucket", "layer"])["tokens"]
        top = g.max()
        bal = (g.mean() / top.where(top > 0)).fillna(1.0).rename("balancedness").reset_index()
        span_b = trailing(bal, rules.unbalanced_minutes)
        if span_b is not None:
            worst = span_b.groupby("layer")["balancedness"].max()
            for layer, b in worst[worst < rules.min_balancedness].sort_values().items():
                since = _since(bal[bal["layer"] == layer], "balancedness", lambda v: v < rules.min_balancedness)
                out.append(
                    Firing(
                        "EPLBLayerUnbalanced",
                        f"layer {layer}",
                        float(b),
                        since,
                        f"layer {layer} balancedness stayed below {rules.min_balancedness} (best {b:.2f})",
                    )
                )
    if last_rebalance is not None:
        gap = (now - last_rebalance).total_seconds()
        if gap > rules.max_rebalance_gap_seconds:
            out.append(
                Firing(
                    "EPLBNoRebalance",
                    "instance",
                    gap,
                    last_rebalance,
                    f"no EPLB rebalance for {gap / 60:.0f} min (expected within {rules.max_rebalance_gap_seconds / 60:.0f})",
                )
            )
    return out


def trailing_run_start(buckets: pd.Series, holds: np.ndarray) -> pd.Timestamp | None:
    """First bucket of the trailing run where `holds` is true (buckets sorted); None if the last is false."""
    if not len(holds) or not holds[-1]:
        return None
    i = len(holds) - 1
    while i > 0 and holds[i - 1]:
        i -= 1
    return pd.Timestamp(buckets.iloc[i])


def _since(series: pd.DataFrame, column: str, condition) -> pd.Timestamp | None:  # type: ignore[no-untyped-def]
    """Start of the trailing run of steps where the condition holds."""
    s = series.sort_values("bucket")
    return trailing_run_start(s["bucket"], s[column].map(condition).to_numpy())


def prometheus_rules(rules: AlertRules) -> dict[str, object]:
    """The EPLB rules as a Prometheus alerting-rules file (YAML-serialisable); the whole pack with
    them is warehouse/rules.py's."""
    return {"groups": [eplb_group(rules)]}


def eplb_group(rules: AlertRules) -> dict[str, object]:
    """The EPLB hot-spot rules as one Prometheus rules group."""
    rate = "sum by (model_name, layer, engine) (rate(moemeter_expert_rank_tokens_total[5m]))"
    mean = f"avg by (model_name, layer) ({rate})"
    return {
        "name": "moemeter-eplb",
        "rules": [
            {
                "alert": "EPLBRankHot",
                "expr": f"{rate} / on (model_name, layer) group_left {mean} > {rules.hot_rank_factor:g}",
                "for": f"{rules.hot_rank_minutes:g}m",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": "EPLB hot spot: rank {{ $labels.engine }} of layer {{ $labels.layer }} carries "
                    '{{ $value | printf "%.2f" }}x the layer\'s mean load'
                },
            },
            {
                "alert": "EPLBLayerUnbalanced",
                "expr": f"avg_over_time(moemeter_eplb_balancedness[5m]) < {rules.min_balancedness:g}",
                "for": f"{rules.unbalanced_minutes:g}m",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": 'Layer {{ $labels.layer }} balancedness {{ $value | printf "%.2f" }} (mean/max rank load)'
                },
            },
            {
                "alert": "EPLBNoRebalance",
                # the gap first: `and` keeps its left side's value, which the summary shows
                "expr": f"time() - moemeter_eplb_last_rebalance_timestamp_seconds > {rules.max_rebalance_gap_seconds:g}"
                " and moemeter_eplb_last_rebalance_timestamp_seconds > 0",
                "labels": {"severity": "info"},
                "annotations": {"summary": "No EPLB rebalance for {{ $value | humanizeDuration }}"},
            },
        ],
    }
