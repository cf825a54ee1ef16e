"""EPLB alert rules fire on exactly the conditions they name, here and as Prometheus rules."""

from __future__ import annotations

import pandas as pd
import yaml

from warehouse.alerts import AlertRules, evaluate_alerts, prometheus_rules

NOW = pd.Timestamp("2026-11-30 12:30:00")


def steps(
    minutes: int, hot_rank: int | None = None, factor: float = 2.0, layers: int = 2, ranks: int = 4
) -> pd.DataFrame:
    rows = []
    for i in range(minutes):
        bucket = NOW - pd.Timedelta(minutes=minutes - i)
        for layer in range(layers):
            for rank in range(ranks):
                rows.append((bucket, layer, rank, 100.0 * (factor if (rank == hot_rank and layer == 1) else 1.0)))
    return pd.DataFrame(rows, columns=["bucket", "layer", "rank", "tokens"])


def test_a_rank_hot_for_the_whole_span_fires_with_since():
    firing = evaluate_alerts(AlertRules(), steps(15, hot_rank=2), NOW, NOW)
    hot = [f for f in firing if f.rule == "EPLBRankHot"]
    assert [f.subject for f in hot] == ["layer 1 rank 2"]
    assert hot[0].value == 2.0 / 1.25  # 200 against a mean of (200 + 3 x 100) / 4
    assert hot[0].since == NOW - pd.Timedelta(minutes=15)
    unbalanced = [f for f in firing if f.rule == "EPLBLayerUnbalanced"]
    assert [f.subject for f in unbalanced] == ["layer 1"]  # 125 / 200 = 0.625 < 0.7


def test_nothing_fires_when_balanced_or_too_short_to_judge():
    assert evaluate_alerts(AlertRules(), steps(15), NOW, NOW) == []
    assert evaluate_alerts(AlertRules(), steps(5, hot_rank=2), NOW, NOW) == []  # 5 of the 10 minutes


def test_no_rebalance_for_too_long():
    firing = evaluate_alerts(AlertRules(), steps(15), NOW - pd.Timedelta(minutes=20), NOW)
    assert [f.rule for f in firing] == ["EPLBNoRebalance"]
    assert firing[0].value == 1200.0


def test_prometheus_rules_use_the_same_thresholds():
    rules = AlertRules(hot_rank_factor=1.8, hot_rank_minutes=5, min_balancedness=0.6)
    doc = yaml.safe_load(yaml.safe_dump(prometheus_rules(rules)))
    by_name = {r["alert"]: r for r in doc["groups"][0]["rules"]}
    assert set(by_name) == {"EPLBRankHot", "EPLBLayerUnbalanced", "EPLBNoRebalance"}
    assert by_name["EPLBRankHot"]["expr"].endswith("> 1.8") and by_name["EPLBRankHot"]["for"] == "5m"
    assert "moemeter_expert_rank_tokens_total" in by_name["EPLBRankHot"]["expr"]
    assert "< 0.6" in by_name["EPLBLayerUnbalanced"]["expr"]
    assert "> 900" in by_name["EPLBNoRebalance"]["expr"]


# ---------------------------------------------------------------- the engine and target rules
def signals(minutes: float, every: float = 10.0, engines: int = 4, **per_engine: dict[int, float]) -> pd.DataFrame:
    """Scrapes of one decode pool every `every` s for `minutes` up to NOW: waiting 2 and KV 0.5 on
    each engine, but the values of `per_engine` (column -> {engine: value})."""
    n = int(minutes * 60 / every) + 1
    rows = []
    for i in range(n):
        ts = NOW - pd.Timedelta(seconds=every * (n - 1 - i))
        for e in range(engines):
            waiting = per_engine.get("waiting", {}).get(e, 2.0)
            kv = per_engine.get("kv_usage", {}).get(e, 0.5)
            rows.append((ts, "decode", "decode-0", str(e), waiting, kv))
    return pd.DataFrame(rows, columns=["ts", "role", "target", "engine", "waiting", "kv_usage"])


NO_NIXL = pd.DataFrame(columns=["role", "target", "metric", "increase", "since"])
NO_SCRAPES = pd.DataFrame({"ts": pd.Series(dtype="datetime64[ns]"), "target": [], "up": pd.Series(dtype=bool)})


def fired(sig: pd.DataFrame, nixl: pd.DataFrame = NO_NIXL, scrapes: pd.DataFrame = NO_SCRAPES) -> list:
    from warehouse.alerts import evaluate_engines

    return [(f.rule, f.subject) for f in evaluate_engines(AlertRules(), sig, nixl, scrapes)]


def test_a_full_kv_cache_fires_after_its_5_minutes_and_not_before():
    from warehouse.alerts import evaluate_engines

    assert fired(signals(5, kv_usage={3: 0.97})) == [("KVCacheSaturated", "decode decode-0 engine 3")]
    assert fired(signals(4.9, kv_usage={3: 0.97})) == []  # held 4 min 50 s
    assert fired(signals(10, kv_usage={3: 0.95})) == []  # at the threshold is not above it
    [f] = evaluate_engines(AlertRules(), signals(6, kv_usage={3: 0.97}), NO_NIXL, NO_SCRAPES)
    assert f.since == NOW - pd.Timedelta(minutes=6) and f.value == 0.97


def test_a_dp_straggler_is_judged_on_its_2_minute_mean_against_the_pools_median():
    # engine 1 waits 20 (median of 2, 2, 2, 20 is 2: 20 > 3 x 2 and >= 4) for 8 min: its 2-min mean
    # is 20 from the first scrape on, held 5 min from then
    assert fired(signals(8, waiting={1: 20.0})) == [("DPEngineStraggler", "decode decode-0 engine 1")]
    assert fired(signals(4.5, waiting={1: 20.0})) == []  # not held 5 min yet
    # 3 x the median but under 4 requests: a short queue is no straggler
    assert fired(signals(8, waiting={0: 1.0, 1: 3.5, 2: 1.0, 3: 1.0})) == []
    # half the pool waiting long: the median rises with them, nobody straggles
    assert fired(signals(8, waiting={0: 20.0, 1: 20.0, 2: 20.0})) == []


def test_a_straggler_that_recovered_stops_firing_once_its_2_minute_mean_falls():
    sig = signals(10, waiting={1: 20.0})
    recovered = sig["engine"].eq("1") & (sig["ts"] > NOW - pd.Timedelta(minutes=1))
    sig.loc[recovered, "waiting"] = 2.0
    # 2-min mean at NOW over (NOW - 2 min, NOW]: 7 scrapes at 20, 5 at 2 -> 12.5: still over 3 x 2
    assert fired(sig) == [("DPEngineStraggler", "decode decode-0 engine 1")]
    sig.loc[sig["engine"].eq("1") & (sig["ts"] > NOW - pd.Timedelta(minutes=2)), "waiting"] = 2.0
    assert fired(sig) == []


def test_nixl_faults_fire_per_target_with_their_count():
    from warehouse.alerts import evaluate_engines

    nixl = pd.DataFrame(
        [("decode", "decode-0", "vllm:nixl_num_failed_transfers_total", 7.0, NOW - pd.Timedelta(minutes=3))],
        columns=["role", "target", "metric", "increase", "since"],
    )
    [f] = evaluate_engines(AlertRules(), signals(1), nixl, NO_SCRAPES)
    assert (f.rule, f.subject, f.value) == ("NIXLFailedTransfers", "decode decode-0", 7.0)
    assert f.message == "7 KV transfers failed in 5 min"


def test_a_target_down_for_2_minutes_fires_and_one_back_up_does_not():
    ts = [NOW - pd.Timedelta(seconds=10 * k) for k in range(14, -1, -1)]  # 2 min 20 s of scrapes
    down = pd.DataFrame({"ts": ts, "target": "decode-1", "up": [True] * 2 + [False] * 13})  # down from NOW - 2 min
    back = pd.DataFrame({"ts": ts, "target": "decode-2", "up": [False] * 14 + [True]})
    short = pd.DataFrame({"ts": ts, "target": "decode-3", "up": [True] * 4 + [False] * 11})  # 1 min 40 s
    assert fired(signals(1), scrapes=pd.concat([down, back, short])) == [("TargetDown", "decode-1")]
