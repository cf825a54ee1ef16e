"""Queries behind the Experts page (EPLB hot spots): pure functions of a query callable.

Rank load comes from the plugin's `moemeter_expert_rank_tokens_total` increments; logical
expert load and placement from the /moemeter/experts snapshots (warehouse/experts.py).
Balancedness as docs/definitions.md defines it: mean over ranks / max over ranks of rank load, per layer.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd

# the page reads these through this module, its read layer (tests/test_layers.py)
from warehouse.alerts import AlertRules as AlertRules
from warehouse.alerts import evaluate_alerts as evaluate_alerts
from warehouse.alerts import prometheus_rules as prometheus_rules
from warehouse.alerts import trailing_run_start
from warehouse.eplb import what_if as what_if
from warehouse.read import HOUR, at_resolution, run

from .live import Query, Window, counters


def eplb_targets(q: Query) -> list[str]:
    """Targets that export per-rank expert load or expert snapshots."""
    return run(q, "expert_targets")["target"].tolist()


def rank_steps(q: Query, w: Window, target: str) -> pd.DataFrame:
    """Tokens each rank's slots received per step and layer: bucket, layer, rank, tokens (in no order)."""
    return counters(q, "expert_ranks", w, {"target": target})


def rank_matrix(steps: pd.DataFrame) -> pd.DataFrame:
    """Layer x rank load over the whole window, as a ratio to the layer's mean rank load."""
    if steps.empty:
        return pd.DataFrame()
    m = steps.groupby(["layer", "rank"])["tokens"].sum().unstack(fill_value=0.0)
    return m.div(m.mean(axis=1).replace(0, np.nan), axis=0)


def hottest_since(steps: pd.DataFrame, layer: int, rank: int) -> pd.Timestamp | None:
    """Start of the trailing run of steps in which `rank` carried the most load of `layer`."""
    s = steps[steps["layer"] == layer].sort_values(["bucket", "rank"])  # a tie goes to the lowest rank
    if s.empty:
        return None
    top = s.loc[s.groupby("bucket")["tokens"].idxmax()].sort_values("bucket")
    return trailing_run_start(top["bucket"], (top["rank"] == rank).to_numpy())


def balancedness_over_time(steps: pd.DataFrame) -> pd.DataFrame:
    """bucket, layer, balancedness (mean/max over ranks), imbalance (max/mean)."""
    if steps.empty:
        return pd.DataFrame(columns=["bucket", "layer", "balancedness", "imbalance"])
    g = steps.groupby(["bucket", "layer"])["tokens"]
    out = pd.DataFrame({"mean": g.mean(), "max": g.max()}).reset_index()
    out = out[out["max"] > 0]
    out["balancedness"] = out["mean"] / out["max"]
    out["imbalance"] = out["max"] / out["mean"]
    return out[["bucket", "layer", "balancedness", "imbalance"]]


def expert_share(q: Query, w: Window, target: str) -> pd.DataFrame:
    """layer, expert, tokens, share of the layer's tokens in the window."""
    df = at_resolution(q, "expert_share", w, {"target": target})
    if df.empty:
        return df.assign(share=pd.Series(dtype=float))
    total = df.groupby("layer")["tokens"].transform("sum")
    return df.assign(share=df["tokens"] / total.where(total > 0))


def hot_experts(shares: pd.DataFrame, trend: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """Top n (layer, expert) by share of their layer, with their share per snapshot (trend)."""
    if shares.empty:
        return pd.DataFrame(columns=["layer", "expert", "share", "trend"])
    top = shares.nlargest(n, "share")[["layer", "expert", "share"]].reset_index(drop=True)
    mine = trend.merge(top[["layer", "expert"]], on=["layer", "expert"])
    series = {k: g.sort_values("ts")["share"].round(4).tolist() for k, g in mine.groupby(["layer", "expert"])}
    top["trend"] = [series.get((r.layer, r.expert), []) for r in top.itertuples()]
    return top


HOURLY_TREND = timedelta(days=1)
"""From this window up a hot expert's trend has a point per hour, not per snapshot: 24 points or
more, read from the hourly load (a day of snapshots is 22 M rows on the reference rack)."""


def hourly_trend(w: Window) -> bool:
    """Whether `share_trend` gives a point per hour for this window (else per snapshot)."""
    return w.period == HOUR or w.end - w.start >= HOURLY_TREND


def share_trend(q: Query, w: Window, target: str, experts: pd.DataFrame | None = None) -> pd.DataFrame:
    """ts, layer, expert, share of its layer at each snapshot, or in each hour (`hourly_trend`);
    only for `experts` (rows of layer, expert) when given, so a day of snapshots is not read back
    for ten sparklines."""
    layers = keys = None
    if experts is not None:  # (layer, expert) as one key: layer * 2^20 + expert; totals only for their layers
        layers = sorted({int(r.layer) for r in experts.itertuples()})
        keys = [int(r.layer) * 1048576 + int(r.expert) for r in experts.itertuples()]
    params = {"target": target, "layers": layers, "keys": keys, "hourly": hourly_trend(w)}
    return at_resolution(q, "expert_trend", w, params)


def rebalances(q: Query, w: Window, target: str) -> pd.DataFrame:
    """One row per rebalance: ts, duration, moved replicas, mean planned-on balancedness before and planned."""
    return run(q, "rebalances", {"start": w.start, "end": w.end, "target": target})


def _around(events: pd.DataFrame, per: pd.DataFrame, minutes: float) -> tuple[np.ndarray, np.ndarray]:
    """Means of `per`'s rows (index: step start; columns sum and count) in the steps that end
    before each event and in those that start after it, `minutes` each side; a step that
    straddles the event counts for neither."""
    per = per.sort_index()
    span = pd.Timedelta(minutes=minutes)
    step = per.index.to_series().diff().min() if len(per) > 1 else pd.Timedelta(0)
    starts = per.index.to_numpy()
    # Prefix sums over the sorted steps: the mean of the rows of steps [i, j) in O(1) per event.
    total = np.concatenate([[0.0], per["sum"].cumsum().to_numpy()])
    count = np.concatenate([[0], per["count"].cumsum().to_numpy()])
    ts = events["ts"].to_numpy(dtype="datetime64[ns]")
    step_ns, span_ns = np.timedelta64(step.value, "ns"), np.timedelta64(span.value, "ns")

    def mean(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        n = count[j] - count[i]
        return np.where(n > 0, (total[j] - total[i]) / np.maximum(n, 1), np.nan)

    # before: steps that end in (ts - span, ts]; after: steps that start in [ts, ts + span)
    before = mean(
        np.searchsorted(starts, ts - span_ns - step_ns, "right"), np.searchsorted(starts, ts - step_ns, "right")
    )
    after = mean(np.searchsorted(starts, ts, "left"), np.searchsorted(starts, ts + span_ns, "left"))
    return before, after


def measured_around(events: pd.DataFrame, bal: pd.DataFrame, minutes: float = 0.5) -> pd.DataFrame:
    """Measured mean balancedness (over layers and steps) in the steps that end before each event
    and in those that start after it, `minutes` each side; a step that straddles the event counts
    for neither."""
    if events.empty:
        return events.assign(measured_before=pd.Series(dtype=float), measured_after=pd.Series(dtype=float))
    before, after = _around(events, bal.groupby("bucket")["balancedness"].agg(["sum", "count"]), minutes)
    return events.assign(measured_before=before, measured_after=after)


def generated_rates(q: Query, w: Window, target: str) -> pd.DataFrame:
    """bucket, generated_per_s: the tokens `target` generated per second, per step."""
    return counters(q, "target_generated", w, {"target": target})


def rebalance_cost(events: pd.DataFrame, rates: pd.DataFrame, minutes: float = 0.5) -> pd.DataFrame:
    """What each rebalance cost and bought: generated tokens/s before and after it (as
    measured_around measures balancedness), the tokens its pause cost (pause x tokens/s before:
    vLLM's synchronous rearrangement stops the engine) and the seconds the gain in tokens/s takes
    to win them back (NaN when tokens/s did not rise)."""
    if events.empty or rates.empty:
        nan = pd.Series(np.nan, index=events.index, dtype=float)
        return events.assign(tps_before=nan, tps_after=nan, tokens_lost=nan, win_back_seconds=nan)
    per = rates.set_index("bucket")["generated_per_s"].to_frame("sum").assign(count=1)
    before, after = _around(events, per, minutes)
    lost = events["duration_seconds"].to_numpy(dtype=float) * before
    gain = after - before
    win_back = np.where(gain > 0, lost / np.where(gain > 0, gain, 1.0), np.nan)
    return events.assign(tps_before=before, tps_after=after, tokens_lost=lost, win_back_seconds=win_back)


def placement(q: Query, w: Window, target: str, layer: int) -> pd.DataFrame:
    """The placement in force at the window's end for one layer: slot, rank, expert, replicas."""
    df = run(q, "placement", {"target": target, "layer": layer, "end": w.end})[["slot", "rank", "expert"]]
    return df.assign(replicas=df.groupby("expert")["slot"].transform("count")) if len(df) else df


def current_placement(q: Query, w: Window, target: str) -> tuple[np.ndarray, int] | None:
    """[layers, slots] placement at the window's end, and the number of ranks."""
    df = run(q, "placement", {"target": target, "layer": None, "end": w.end})
    if df.empty:
        return None
    m = np.zeros((int(df["layer"].max()) + 1, int(df["slot"].max()) + 1), dtype=np.int64)
    m[df["layer"].to_numpy(), df["slot"].to_numpy()] = df["expert"].to_numpy()
    return m, int(df["rank"].max()) + 1


def load_matrix(shares: pd.DataFrame) -> np.ndarray:
    """[layers, experts] tokens from expert_share's rows."""
    m = shares.pivot_table(index="layer", columns="expert", values="tokens", aggfunc="sum").fillna(0.0)
    return m.to_numpy()
