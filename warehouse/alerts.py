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


NIXL_ALERTS = {  # counter -> (alert, what), as in the Prometheus pack (warehouse/rules.py)
    "vllm:nixl_num_failed_transfers_total": ("NIXLFailedTransfers", "KV transfers failed"),
    "vllm:nixl_num_failed_notifications_total": ("NIXLFailedNotifications", "NIXL notifications failed"),
    "vllm:nixl_num_kv_expired_reqs_total": ("NIXLExpiredKV", "requests' KV blocks expired before decode read them"),
}
NIXL_MINUTES = 5.0  # the pack's increase(...[5m]) > 0
WAITING_MEAN = "2min"  # the pack's avg_over_time(vllm:num_requests_waiting[2m])


def signals_minutes(rules: AlertRules) -> float:
    """How far back evaluate_engines needs the engine signals and scrapes, minutes."""
    return max(rules.kv_minutes, rules.straggler_minutes + 2.0, rules.target_down_minutes, NIXL_MINUTES) + 1.0


def evaluate_engines(
    rules: AlertRules, signals: pd.DataFrame, nixl: pd.DataFrame, scrapes: pd.DataFrame
) -> list[Firing]:
    """The alert pack's engine and target rules over the warehouse, with its thresholds and hold
    times: a condition fires once it has held at every scrape for the rule's minutes.
    signals: ts, role, target, engine, waiting, kv_usage (engine_signals.sql);
    nixl: role, target, metric, increase, since over the last NIXL_MINUTES (nixl_faults.sql);
    scrapes: ts, target, up (scrape_runs.sql). The DP straggler is judged on the waiting queue
    (the pack also judges step time, from the plugin's histograms: not here)."""
    out: list[Firing] = []

    def held(g: pd.DataFrame, holds: np.ndarray, minutes: float) -> pd.Timestamp | None:
        since = trailing_run_start(g["ts"], holds)
        return since if since is not None and g["ts"].iloc[-1] - since >= pd.Timedelta(minutes=minutes) else None

    for target, g in scrapes.sort_values("ts").groupby("target", sort=True):
        since = held(g, ~g["up"].to_numpy(dtype=bool), rules.target_down_minutes)
        if since is not None:
            mins = (g["ts"].iloc[-1] - since).total_seconds() / 60
            out.append(
                Firing("TargetDown", str(target), mins, since, f"{target} has not answered a scrape for {mins:.0f} min")
            )
    keys = ["role", "target", "engine"]
    kv = signals.dropna(subset=["kv_usage"]).sort_values("ts")
    for (role, target, engine), g in kv.groupby(keys, sort=True):
        since = held(g, (g["kv_usage"] > rules.kv_usage_max).to_numpy(), rules.kv_minutes)
        if since is not None:
            v = float(g["kv_usage"].iloc[-1])
            out.append(
                Firing("KVCacheSaturated", f"{role} {target} engine {engine}", v, since, f"KV cache {v:.0%} full")
            )
    w = signals.dropna(subset=["waiting"]).sort_values("ts").reset_index(drop=True)
    if len(w):
        w["mean"] = pd.concat(
            [g.rolling(WAITING_MEAN, on="ts")["waiting"].mean() for _, g in w.groupby(keys, sort=False)]
        )
        median = w.groupby(["role", "ts"])["mean"].transform("median")
        w["holds"] = (w["mean"] > rules.straggler_factor * median) & (w["mean"] >= rules.straggler_min_waiting)
        for (role, target, engine), g in w.groupby(keys, sort=True):
            since = held(g, g["holds"].to_numpy(), rules.straggler_minutes)
            if since is not None:
                v = float(g["mean"].iloc[-1])
                out.append(
                    Firing(
                        "DPEngineStraggler",
                        f"{role} {target} engine {engine}",
                        v,
                        since,
                        f"{v:.1f} requests waiting (2-min mean), over {rules.straggler_factor:g}x its pool's median",
                    )
                )
    for row in nixl.itertuples(index=False):
        alert, what = NIXL_ALERTS[str(row.metric)]
        out.append(
            Firing(
                alert,
                f"{row.role} {row.target}",
                float(row.increase),
                pd.Timestamp(row.since),
                f"{row.increase:.0f} {what} in {NIXL_MINUTES:g} min",
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
