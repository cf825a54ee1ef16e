"""Alert thresholds, one definition for the warehouse and for Prometheus: every rule of the alert
pack is judged here over the warehouse (the EPLB rules by the Experts page, the rest by every
page's banner: dashboard/data/alerts.py), and the pack's Prometheus rules (warehouse/rules.py, with
the EPLB group of this module) read their thresholds from the same `AlertRules`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moemeter.contract import POOLS
from moemeter.contract.alerts import (
    ACCEPTANCE_MINUTES,
    NIXL_ALERTS,
    NIXL_MINUTES,
    POOL_IDLE_HOLD_MINUTES,
    PREEMPTING_MINUTES,
    PREEMPTION_RATE_MINUTES,
    STEP_MEAN_MINUTES,
    WAITING_MEAN_MINUTES,
)


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
    """...or its mean engine-step time is this many times its pool's median..."""
    straggler_min_steps: float = 1000.0
    """...over at least this many steps in the 5 minutes: a mean of a few steps is noise (a prefill
    engine's steps last as long as their prompts, and a 5-min rate over a window that holds two scrapes
    a second apart is a mean of about 90 of them, up to 1.8x the pool's median on the twin)."""
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
    acceptance_length_min: float = 1.5
    """An engine's or pool's draft path is failing when its mean acceptance length (tokens per step,
    the bonus token included; 5-min rate) stays below this: at 1.5 a step buys half a token of
    drafts, where the twin's rack accepts about 2.7..."""
    acceptance_min_drafts: float = 1000.0
    """...over at least this many drafts in the 5 minutes (a mean of a few drafts is noise)..."""
    acceptance_minutes: float = 5.0
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


NIXL = {a.family: a for a in NIXL_ALERTS}
WAITING_MEAN = f"{WAITING_MEAN_MINUTES:g}min"
LOOKBACK = "5min"  # Prometheus's lookback for an instant selector (`x offset 2m` reads the sample before)
STEP_MEAN = f"{STEP_MEAN_MINUTES:g}min"
ACCEPTANCE = f"{ACCEPTANCE_MINUTES:g}min"


def signals_minutes(rules: AlertRules) -> float:
    """How far back evaluate_engines needs the engine signals and scrapes, minutes."""
    return (
        max(
            rules.kv_minutes,
            rules.straggler_minutes + 5.0,  # the 5-min step mean
            rules.target_down_minutes,
            NIXL_MINUTES,
            PREEMPTION_RATE_MINUTES + PREEMPTING_MINUTES,
            rules.idle_minutes + POOL_IDLE_HOLD_MINUTES,
            ACCEPTANCE_MINUTES + rules.acceptance_minutes,
        )
        + 1.0
    )


def _held(g: pd.DataFrame, holds: np.ndarray, minutes: float) -> pd.Timestamp | None:
    """Where the trailing run of scrapes (g sorted by ts) that meet a condition began, if it has
    lasted `minutes` by the last scrape: a condition fires once it has held at every scrape."""
    since = trailing_run_start(g["ts"], holds)
    return since if since is not None and g["ts"].iloc[-1] - since >= pd.Timedelta(minutes=minutes) else None


def _by_group_in_time(df: pd.DataFrame, keys: list[str], span: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows' order by group of `keys`, then time, then row, and a sort key along it that keeps
    the groups far enough apart for a search `span` ns back in time never to reach another."""
    code = df.groupby(keys, sort=False).ngroup().to_numpy(dtype=np.int64)
    ts = df["ts"].to_numpy(dtype="datetime64[ns]").astype(np.int64)
    order = np.lexsort((np.arange(len(ts)), ts, code))
    t = ts[order] - ts.min()
    return order, code[order] * (int(t.max()) + span + 1) + t


def _trailing(df: pd.DataFrame, keys: list[str], column: str, window: str, how: str) -> pd.Series:
    """Per group of `keys`: `column`'s sum or mean over each row's trailing `window` (t - window, t],
    as Prometheus's range functions read it (pandas' time-based rolling, for every group at once);
    NaN where the window holds no value."""
    if df.empty:
        return pd.Series(dtype=float, index=df.index)
    span = pd.Timedelta(window).value
    order, key = _by_group_in_time(df, keys, span)
    first = np.searchsorted(key, key - span, side="right")  # the first row after t - window
    values = df[column].to_numpy(dtype=float)[order]
    seen = ~np.isnan(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(seen, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(seen)])
    last = np.arange(1, len(key) + 1)
    total, n = sums[last] - sums[first], counts[last] - counts[first]
    result = np.where(n > 0, total / np.where(n > 0, n, 1) if how == "mean" else total, np.nan)
    out = np.empty(len(result))
    out[order] = result
    return pd.Series(out, index=df.index)


def _seen_before(df: pd.DataFrame, keys: list[str], window: str) -> np.ndarray:
    """Per row: whether its group of `keys` has a row at most LOOKBACK before t - window, the
    sample Prometheus's `x offset window` reads at t (its instant selectors look back that far)."""
    if df.empty:
        return np.zeros(0, dtype=bool)
    span, lookback = pd.Timedelta(window).value, pd.Timedelta(LOOKBACK).value
    order, key = _by_group_in_time(df, keys, span + lookback)
    before = np.searchsorted(key, key - span, side="right") - 1  # the last row at or before t - window
    seen = (before >= 0) & (key - key[np.maximum(before, 0)] <= span + lookback)  # and not another group's
    out = np.empty(len(seen), dtype=bool)
    out[order] = seen
    return out


def evaluate_engines(
    rules: AlertRules, signals: pd.DataFrame, nixl: pd.DataFrame, scrapes: pd.DataFrame
) -> list[Firing]:
    """The alert pack's engine, pool and target rules over the warehouse, with its thresholds and
    hold times: a condition fires once it has held at every scrape for the rule's minutes.
    signals: ts, role, target, engine, waiting, kv_usage, preemptions, step_seconds, steps, tokens,
    drafts, accepted (engine_signals.sql: the counters' increases since the scrape before);
    nixl: role, target, metric, increase, since over the last NIXL_MINUTES (nixl_faults.sql);
    scrapes: ts, target, role, up (scrape_runs.sql)."""
    signals = signals.sort_values("ts", kind="stable").reset_index(drop=True)
    return [
        *_targets(rules, scrapes),
        *_idle(rules, signals, scrapes),
        *_kv(rules, signals),
        *_preempting(rules, signals),
        *_stragglers(rules, signals),
        *_acceptance(rules, signals),
        *_nixl(nixl),
    ]


ENGINE = ["role", "target", "engine"]


def _subject(key: tuple[object, ...]) -> str:
    role, target, engine = key
    return f"{role} {target} engine {engine}"


def _targets(rules: AlertRules, scrapes: pd.DataFrame) -> list[Firing]:
    out = []
    for target, g in scrapes.sort_values("ts").groupby("target", sort=True):
        since = _held(g, ~g["up"].to_numpy(dtype=bool), rules.target_down_minutes)
        if since is not None:
            mins = (g["ts"].iloc[-1] - since).total_seconds() / 60
            out.append(
                Firing("TargetDown", str(target), mins, since, f"{target} has not answered a scrape for {mins:.0f} min")
            )
    return out


def _idle(rules: AlertRules, signals: pd.DataFrame, scrapes: pd.DataFrame) -> list[Firing]:
    """PoolIdle: a pool whose targets are up and whose engines counted no token for idle_minutes,
    held 1 minute; judged only once its token counters were read that long."""
    out: list[Firing] = []
    for pool in POOLS:
        seen = scrapes[scrapes["role"] == pool]
        tokens = signals[(signals["role"] == pool) & signals["tokens"].notna()]
        if seen.empty or tokens.empty:
            continue
        first = tokens["ts"].min()
        per_ts = tokens.groupby("ts", as_index=False)["tokens"].sum()
        per_ts["up"] = per_ts["ts"].map(seen.groupby("ts")["up"].any()).fillna(False).astype(bool)
        per_ts["window"] = per_ts.rolling(f"{rules.idle_minutes:g}min", on="ts")["tokens"].sum()
        judged = per_ts[per_ts["ts"] >= first + pd.Timedelta(minutes=rules.idle_minutes)]
        if judged.empty:
            continue
        since = _held(judged, ((judged["window"] == 0) & judged["up"]).to_numpy(), POOL_IDLE_HOLD_MINUTES)
        if since is not None:
            what = f"the {pool} pool is up and produced no token in {rules.idle_minutes:g} min"
            out.append(Firing("PoolIdle", pool, 0.0, since, what))
    return out


POOL_RETIRED_HOURS = 24.0
"""A pool no target of which was scraped for this long is taken as retired, not absent."""


def evaluate_absent(rules: AlertRules, last_scraped: pd.DataFrame, latest: pd.Timestamp) -> list[Firing]:
    """PoolAbsent: a pool of the rack none of whose targets was scraped for target_down_minutes.
    last_scraped: role, last_scraped over the POOL_RETIRED_HOURS up to `latest`
    (pools_last_scraped.sql). Prometheus's absent() also fires for a pool the rack never had; the
    warehouse knows the rack, and judges only the pools it scraped in that time."""
    out = []
    for row in last_scraped.itertuples(index=False):
        gone = pd.Timestamp(latest) - pd.Timestamp(row.last_scraped)
        if gone >= pd.Timedelta(minutes=rules.target_down_minutes):
            mins = gone.total_seconds() / 60
            what = f"no {row.role} target scraped for {mins:.0f} min"
            out.append(Firing("PoolAbsent", str(row.role), mins, pd.Timestamp(row.last_scraped), what))
    return out


def _kv(rules: AlertRules, signals: pd.DataFrame) -> list[Firing]:
    out = []
    kv = signals.dropna(subset=["kv_usage"])
    for key, g in kv.groupby(ENGINE, sort=True):
        since = _held(g, (g["kv_usage"] > rules.kv_usage_max).to_numpy(), rules.kv_minutes)
        if since is not None:
            v = float(g["kv_usage"].iloc[-1])
            out.append(Firing("KVCacheSaturated", _subject(key), v, since, f"KV cache {v:.0%} full"))
    return out


def _preempting(rules: AlertRules, signals: pd.DataFrame) -> list[Firing]:
    out = []
    p = signals.dropna(subset=["preemptions"]).reset_index(drop=True)
    p["per_minute"] = _trailing(p, ENGINE, "preemptions", f"{PREEMPTION_RATE_MINUTES:g}min", "sum") / (
        PREEMPTION_RATE_MINUTES
    )
    for key, g in p.groupby(ENGINE, sort=True):
        since = _held(g, (g["per_minute"] > rules.preemptions_per_minute).to_numpy(), PREEMPTING_MINUTES)
        if since is not None:
            v = float(g["per_minute"].iloc[-1])
            out.append(Firing("EnginePreempting", _subject(key), v, since, f"{v:.1f} preemptions per minute"))
    return out


def _acceptance(rules: AlertRules, signals: pd.DataFrame) -> list[Firing]:
    """SpecAcceptanceLow: the mean acceptance length over ACCEPTANCE_MINUTES below
    acceptance_length_min, over at least acceptance_min_drafts drafts, held acceptance_minutes; per
    engine, and per pool (its engines' drafts and accepted tokens summed at each scrape)."""
    if "drafts" not in signals:  # signals of a warehouse that read no draft path
        return []
    s = signals.dropna(subset=["drafts"]).reset_index(drop=True)
    pools = s.groupby(["ts", "role"], as_index=False)[["drafts", "accepted"]].sum()
    out = []
    for frame, keys, subject in ((s, ENGINE, _subject), (pools, ["role"], lambda key: f"{key[0]} pool")):
        frame = frame.reset_index(drop=True)
        drafts = _trailing(frame, keys, "drafts", ACCEPTANCE, "sum")
        frame["length"] = 1.0 + _trailing(frame, keys, "accepted", ACCEPTANCE, "sum") / drafts.where(drafts > 0)
        frame["holds"] = (frame["length"] < rules.acceptance_length_min) & (drafts >= rules.acceptance_min_drafts)
        for key, g in frame.groupby(keys, sort=True):
            since = _held(g, g["holds"].to_numpy(), rules.acceptance_minutes)
            if since is not None:
                v = float(g["length"].iloc[-1])
                what = (
                    f"mean acceptance length {v:.2f} tokens per step (5-min rate), under "
                    f"{rules.acceptance_length_min:g}: its drafts are rejected"
                )
                out.append(
                    Firing("SpecAcceptanceLow", subject(key if isinstance(key, tuple) else (key,)), v, since, what)
                )
    return out


def _stragglers(rules: AlertRules, signals: pd.DataFrame) -> list[Firing]:
    """DPEngineStraggler, on either signal the pack judges: the waiting queue's 2-min mean over
    straggler_factor x its pool's median (and at least straggler_min_waiting), or the mean engine
    step over 5 min over straggler_step_factor x its pool's median (over at least straggler_min_steps steps)."""
    out = []
    w = signals.dropna(subset=["waiting"]).reset_index(drop=True)
    w["mean"] = _trailing(w, ENGINE, "waiting", WAITING_MEAN, "mean")
    # a mean over less than its window is a moment's queue: judged once the engine was scraped
    # WAITING_MEAN before (the pack's `and on (...) vllm:num_requests_waiting offset 2m`)
    w.loc[~_seen_before(w, ENGINE, WAITING_MEAN), "mean"] = np.nan
    median = w.groupby(["role", "ts"])["mean"].transform("median")
    w["holds"] = (w["mean"] > rules.straggler_factor * median) & (w["mean"] >= rules.straggler_min_waiting)
    for key, g in w.groupby(ENGINE, sort=True):
        since = _held(g, g["holds"].to_numpy(), rules.straggler_minutes)
        if since is not None:
            v = float(g["mean"].iloc[-1])
            what = f"{v:.1f} requests waiting (2-min mean), over {rules.straggler_factor:g}x its pool's median"
            out.append(Firing("DPEngineStraggler", _subject(key), v, since, what))
    s = signals.dropna(subset=["steps"]).reset_index(drop=True)
    seconds = _trailing(s, ENGINE, "step_seconds", STEP_MEAN, "sum")
    steps = _trailing(s, ENGINE, "steps", STEP_MEAN, "sum")
    s["mean"] = seconds / steps.where(steps > 0)
    median = s.groupby(["role", "ts"])["mean"].transform("median")
    s["holds"] = (s["mean"] > rules.straggler_step_factor * median) & (steps >= rules.straggler_min_steps)
    for key, g in s.groupby(ENGINE, sort=True):
        since = _held(g, g["holds"].to_numpy(), rules.straggler_minutes)
        if since is not None:
            v = float(g["mean"].iloc[-1])
            what = (
                f"{1000 * v:.0f} ms per engine step (5-min mean), over {rules.straggler_step_factor:g}x its pool's"
                " median: every rank's all-to-all waits for it"
            )
            out.append(Firing("DPEngineStraggler", _subject(key), v, since, what))
    return out


def _nixl(nixl: pd.DataFrame) -> list[Firing]:
    return [
        Firing(
            NIXL[str(row.metric)].alert,
            f"{row.role} {row.target}",
            float(row.increase),
            pd.Timestamp(row.since),
            f"{row.increase:.0f} {NIXL[str(row.metric)].what} in {NIXL_MINUTES:g} min",
        )
        for row in nixl.itertuples(index=False)
    ]


BURN_HOLD_MINUTES = {"fast": 2, "slow": 15}  # the pack's `for` of MoemeterSLOFastBurn and SlowBurn
BURN_LOOKBACK_MINUTES = 6 * 60 + BURN_HOLD_MINUTES["slow"] + 1
"""How far back evaluate_burn needs the per-minute SLO counts, minutes: the slow burn's 6 hours at
each minute it must have held."""


@dataclass(frozen=True)
class Objective:
    """What evaluate_burn needs of an SLO class: the share of requests to meet its targets, and the
    period its error budget covers."""

    objective: float
    period_days: float


def evaluate_burn(
    rules: AlertRules, per_minute: pd.DataFrame, classes: dict[str, Objective], latest: pd.Timestamp
) -> list[Firing]:
    """The pack's SLO burn alerts per class, from the requests each minute held to it and those
    that met it (slo_burn.sql: back, class, held, met; back 0 the minute up to the latest scrape).
    Burn over a window = the share of held requests that missed / (1 - objective). Fast burn: over
    1 h and over 5 min above burn_fast at each of the last 2 minutes; slow: 6 h and 30 min above
    burn_slow at each of the last 15. A window that held no request has no burn: it does not fire.
    `since` is where the condition began, looked for over the last 15 minutes only."""
    out: list[Firing] = []
    points = BURN_HOLD_MINUTES["slow"] + 1
    size = BURN_LOOKBACK_MINUTES + 1
    for name, g in per_minute.groupby("class", sort=True):
        if name not in classes:
            continue
        c = classes[str(name)]
        g = g[g["back"] < size]
        held = np.zeros(size)
        missed = np.zeros(size)
        np.add.at(held, g["back"].to_numpy(dtype=int), g["held"].to_numpy(dtype=float))
        np.add.at(missed, g["back"].to_numpy(dtype=int), (g["held"] - g["met"]).to_numpy(dtype=float))
        for kind, long, short, limit, alert in (
            ("fast", 60, 5, rules.burn_fast, "MoemeterSLOFastBurn"),
            ("slow", 360, 30, rules.burn_slow, "MoemeterSLOSlowBurn"),
        ):
            over_long, over_short = (
                _ratio(_window_sums(missed, m, points), _window_sums(held, m, points)) / (1 - c.objective)
                for m in (long, short)
            )
            holds = (over_long > limit) & (over_short > limit)
            run = int(np.argmin(holds)) if not holds.all() else points  # minutes held, newest first
            if run <= BURN_HOLD_MINUTES[kind]:
                continue
            v, v_short = float(over_long[0]), float(over_short[0])
            out.append(
                Firing(
                    alert,
                    f"class {name}",
                    v,
                    pd.Timestamp(latest) - pd.Timedelta(minutes=run - 1),
                    f"burns its error budget {v:.1f}x too fast over {long // 60} h ({v_short:.1f}x over {short} min):"
                    f" at that rate a {c.period_days:g}-day budget lasts {c.period_days / v:.1f} days",
                )
            )
    return out


COST_WINDOWS_MINUTES = (60, 24 * 60)  # the pack's $/M over 1 h and over 24 h


def cost_lookback_minutes(rules: AlertRules) -> float:
    """How far back evaluate_cost needs the pools' tokens and cost per minute."""
    return COST_WINDOWS_MINUTES[1] + rules.cost_spike_minutes + 1


def evaluate_cost(rules: AlertRules, per_minute: pd.DataFrame, latest: pd.Timestamp) -> list[Firing]:
    """CostPerTokenSpike per pool: its $/M tokens over the last hour over cost_spike_factor x its
    figure over 24 hours, at every whole minute of the last cost_spike_minutes.
    per_minute: bucket (the minute's start), pool, tokens (the pool's $/M measure: computed prompt
    tokens for prefill, generated for decode), usd (the pool's GPU cost in that minute); a minute
    not observed has no row and is neither cost nor tokens, so before 24 hours are read the longer
    figure is over the time read. No $/M where a window counted no token: it does not fire."""
    out: list[Firing] = []
    end = pd.Timestamp(latest).floor("min")
    short, long = COST_WINDOWS_MINUTES
    points = int(rules.cost_spike_minutes) + 1
    size = long + points
    for pool, g in per_minute.groupby("pool", sort=True):
        back = ((end - pd.to_datetime(g["bucket"])) // pd.Timedelta(minutes=1)).to_numpy(dtype=int) - 1
        keep = (back >= 0) & (back < size)
        tokens, usd = np.zeros(size), np.zeros(size)
        np.add.at(tokens, back[keep], g["tokens"].to_numpy(dtype=float)[keep])
        np.add.at(usd, back[keep], g["usd"].to_numpy(dtype=float)[keep])
        per_mtok = {
            w: _ratio(_window_sums(usd, w, points), _window_sums(tokens, w, points) / 1e6) for w in COST_WINDOWS_MINUTES
        }
        holds = per_mtok[short] > rules.cost_spike_factor * per_mtok[long]  # NaN compares false
        if not holds.all():
            continue
        v, day = float(per_mtok[short][0]), float(per_mtok[long][0])
        out.append(
            Firing(
                "CostPerTokenSpike",
                str(pool),
                v,
                None,
                f"${v:.2f} per M tokens over the last hour, {v / day:.1f}x its 24-hour ${day:.2f}"
                f" (held {rules.cost_spike_minutes:g} min)",
            )
        )
    return out


def _window_sums(per_minute: np.ndarray, minutes: int, points: int) -> np.ndarray:
    """Sums over the `minutes` that end j minutes before the latest (per_minute[0] the latest
    minute), for j in range(points)."""
    c = np.concatenate([[0.0], np.cumsum(per_minute)])
    j = np.arange(points)
    return c[np.minimum(j + minutes, len(per_minute))] - c[j]


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, NaN where b is 0: a window with nothing under it has no figure."""
    return np.where(b > 0, a / np.where(b > 0, b, 1.0), np.nan)


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
