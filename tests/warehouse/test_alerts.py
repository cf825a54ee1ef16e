"""EPLB alert rules fire on exactly the conditions they name, here and as Prometheus rules."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from warehouse.alerts import AlertRules, Objective, evaluate_alerts, prometheus_rules

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
DEFAULTS = {"waiting": 2.0, "kv_usage": 0.5, "preemptions": 0.0, "step_seconds": 0.5, "steps": 100.0, "tokens": 1000.0}
"""Each engine's gauges at a scrape, and what its counters added since the scrape before."""


def signals(
    minutes: float, every: float = 10.0, engines: int = 4, role: str = "decode", **per_engine: dict[int, float]
) -> pd.DataFrame:
    """Scrapes of one pool every `every` s for `minutes` up to NOW: each engine at DEFAULTS, but the
    values of `per_engine` (column -> {engine: value})."""
    n = int(minutes * 60 / every) + 1
    rows = []
    for i in range(n):
        ts = NOW - pd.Timedelta(seconds=every * (n - 1 - i))
        for e in range(engines):
            values = [per_engine.get(c, {}).get(e, d) for c, d in DEFAULTS.items()]
            rows.append((ts, role, f"{role}-0", str(e), *values))
    return pd.DataFrame(rows, columns=["ts", "role", "target", "engine", *DEFAULTS])


def scrapes_of(sig: pd.DataFrame, up: bool = True) -> pd.DataFrame:
    """A scrape of each target at each of the signals' scrape times."""
    return sig[["ts", "target", "role"]].drop_duplicates().assign(up=up).reset_index(drop=True)


NO_NIXL = pd.DataFrame(columns=["role", "target", "metric", "increase", "since"])
NO_SCRAPES = pd.DataFrame(
    {"ts": pd.Series(dtype="datetime64[ns]"), "target": [], "role": [], "up": pd.Series(dtype=bool)}
)


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
    from warehouse.alerts import evaluate_engines

    # engine 1 waits 20 (median of 2, 2, 2, 20 is 2: 20 > 3 x 2 and >= 4) for 8 min: its 2-min mean
    # is judged once the engine was scraped 2 min before (the pack's `offset 2m`), held 5 min from then
    assert fired(signals(8, waiting={1: 20.0})) == [("DPEngineStraggler", "decode decode-0 engine 1")]
    [f] = evaluate_engines(AlertRules(), signals(7, waiting={1: 20.0}), NO_NIXL, NO_SCRAPES)
    assert (f.rule, f.subject, f.since) == (
        "DPEngineStraggler",
        "decode decode-0 engine 1",
        NOW - pd.Timedelta(minutes=5),
    )
    # judged for 4.5 min, not held 5 min yet; a mean of its first scrapes alone is the moment's queue
    # (seen in the alert pack's run on the twin: one engine's 18, the rest idle, at the first scrape)
    assert fired(signals(6.5, waiting={1: 20.0})) == []
    # 3 x the median but under 4 requests: a short queue is no straggler
    assert fired(signals(8, waiting={0: 1.0, 1: 3.5, 2: 1.0, 3: 1.0})) == []
    # half the pool waiting long: the median rises with them, nobody straggles
    assert fired(signals(8, waiting={0: 20.0, 1: 20.0, 2: 20.0})) == []


def test_a_straggler_back_from_a_gap_is_judged_as_prometheus_looks_back():
    """`offset 2m` reads the last sample up to 5 min before t - 2 min: a gap in an engine's scrapes
    shorter than that keeps it judged; after a longer one it waits 2 min again."""

    def with_gap(minutes: float) -> pd.DataFrame:
        sig = signals(17.5, waiting={1: 20.0})
        gone = sig["engine"].eq("1") & sig["ts"].between(
            NOW - pd.Timedelta(minutes=14.5) + pd.Timedelta(seconds=1), NOW - pd.Timedelta(minutes=14.5 - minutes)
        )
        return sig[~gone].reset_index(drop=True)

    assert fired(with_gap(4)) == [("DPEngineStraggler", "decode decode-0 engine 1")]
    assert fired(with_gap(8)) == []  # back 6.5 min before NOW, judged for the last 4.5


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
    down = pd.DataFrame(
        {"ts": ts, "target": "decode-1", "role": "decode", "up": [True] * 2 + [False] * 13}
    )  # down from NOW - 2 min
    back = pd.DataFrame({"ts": ts, "target": "decode-2", "role": "decode", "up": [False] * 14 + [True]})
    short = pd.DataFrame(
        {"ts": ts, "target": "decode-3", "role": "decode", "up": [True] * 4 + [False] * 11}
    )  # 1 min 40 s
    assert fired(signals(1), scrapes=pd.concat([down, back, short])) == [("TargetDown", "decode-1")]


def test_an_engine_preempting_over_1_per_minute_for_5_minutes_fires_with_its_rate():
    from warehouse.alerts import evaluate_engines

    # engine 2 preempts 2 requests a scrape (12 a minute): the 10-min count / 10 passes 1 a minute at
    # its 6th scrape (12 / 10), 50 s in; held 5 min from then
    assert fired(signals(6, preemptions={2: 2.0})) == [("EnginePreempting", "decode decode-0 engine 2")]
    assert fired(signals(5.5, preemptions={2: 2.0})) == []
    [f] = evaluate_engines(AlertRules(), signals(6, preemptions={2: 2.0}), NO_NIXL, NO_SCRAPES)
    assert f.value == 2.0 * 37 / 10  # 37 scrapes in 6 min, all within the 10 minutes
    assert f.since == NOW - pd.Timedelta(seconds=310)
    # one preemption a minute (one every 6th scrape) is the threshold, not over it
    one_a_minute = signals(30)
    one_a_minute.loc[one_a_minute["engine"].eq("2") & (one_a_minute.index // 4 % 6 == 0), "preemptions"] = 1.0
    assert fired(one_a_minute) == []


def test_an_engine_whose_steps_take_over_1_5x_its_pools_median_straggles():
    # engine 1: 1 s over 100 steps a scrape (10 ms a step), the others 5 ms: 2x the median; judged
    # from the 10th scrape (1,000 steps), held 5 minutes from there
    slow = signals(7, step_seconds={1: 1.0})
    [f] = evaluate_engines_of(slow, NO_SCRAPES)
    assert (f.rule, f.subject) == ("DPEngineStraggler", "decode decode-0 engine 1")
    assert f.value == 0.01 and f.message.startswith("10 ms per engine step")
    assert fired(signals(4.5, step_seconds={1: 1.0})) == []  # not held 5 min
    assert fired(signals(7, step_seconds={1: 0.7})) == []  # 1.4x the median
    assert fired(signals(7, step_seconds={1: 1.0}, steps={1: float("nan")})) == []  # no plugin: no judgement


def test_a_step_mean_over_fewer_than_1000_steps_in_5_minutes_is_not_judged():
    # a scrape every 10 s: 30 scrapes in a full 5-minute window; engine 1 at 2x the median throughout
    def pool(steps_a_scrape: float) -> pd.DataFrame:
        return signals(11, step_seconds={1: 1.0}, steps={e: steps_a_scrape for e in range(4)})

    assert fired(pool(33)) == []  # 990 steps
    assert fired(pool(34)) == [("DPEngineStraggler", "decode decode-0 engine 1")]  # 1,020 steps


def test_a_pool_up_that_counted_no_token_for_15_minutes_is_idle():
    idle = signals(16.5, tokens={e: 0.0 for e in range(4)})
    assert fired(idle, scrapes=scrapes_of(idle)) == [("PoolIdle", "decode")]
    # 15 min 30 s read: the 15 minutes are judged from 15 min in, and have not held 1 min
    short = signals(15.5, tokens={e: 0.0 for e in range(4)})
    assert fired(short, scrapes=scrapes_of(short)) == []
    busy = idle.copy()
    busy.loc[busy.index[-1], "tokens"] = 5.0  # one engine's token at the last scrape
    assert fired(busy, scrapes=scrapes_of(busy)) == []
    # down, not idle: the targets did not answer
    assert [r for r, _ in fired(idle, scrapes=scrapes_of(idle, up=False))] == ["TargetDown"]


def test_a_pool_whose_targets_are_no_longer_scraped_is_absent():
    from warehouse.alerts import evaluate_absent

    def absent(**last: pd.Timestamp) -> list[tuple[str, str, float, pd.Timestamp | None]]:
        frame = pd.DataFrame({"role": list(last), "last_scraped": list(last.values())})
        return [(f.rule, f.subject, f.value, f.since) for f in evaluate_absent(AlertRules(), frame, NOW)]

    two = NOW - pd.Timedelta(minutes=2)
    assert absent(prefill=NOW, decode=two) == [("PoolAbsent", "decode", 2.0, two)]
    assert absent(prefill=NOW, decode=NOW - pd.Timedelta(seconds=110)) == []
    assert absent(prefill=NOW) == []  # a pool the rack never had (or retired a day ago) is not absent


def evaluate_engines_of(sig: pd.DataFrame, scrapes: pd.DataFrame) -> list:
    from warehouse.alerts import evaluate_engines

    return evaluate_engines(AlertRules(), sig, NO_NIXL, scrapes)


# ---------------------------------------------------------------- SLO burn
STANDARD = {"standard": Objective(0.99, 30.0)}


def minutes(missed: dict[int, float], held: float = 100.0, n: int = 377, name: str = "standard") -> pd.DataFrame:
    """Per minute back from the latest scrape: `held` requests held to the class, `missed[back]` of
    them missed (none where not given)."""
    return pd.DataFrame(
        {"back": range(n), "class": name, "held": held, "met": [held - missed.get(b, 0.0) for b in range(n)]}
    )


def burns(per_minute: pd.DataFrame) -> list[tuple[str, str, float, pd.Timestamp | None]]:
    from warehouse.alerts import evaluate_burn

    return [(f.rule, f.subject, f.value, f.since) for f in evaluate_burn(AlertRules(), per_minute, STANDARD, NOW)]


def test_fast_burn_fires_over_1_hour_and_5_minutes_and_slow_burn_over_6_hours_and_30_minutes():
    # the last hour misses 20 of 100 a minute: 20% / 1% = 20x over 1 h and 5 min; over 6 h 20 x 60 /
    # 36,000 / 1% = 3.3x: no slow burn
    [(rule, subject, value, since)] = burns(minutes({b: 20.0 for b in range(60)}))
    assert (rule, subject) == ("MoemeterSLOFastBurn", "class standard")
    assert value == pytest.approx(20.0) and since == NOW - pd.Timedelta(minutes=15)  # looked back 15 min
    # 7 of 100 every minute for 6 h 17 min: 7x, over the slow burn's 6 but under the fast burn's 14.4
    [(rule, _, value, _)] = burns(minutes({b: 7.0 for b in range(377)}))
    assert rule == "MoemeterSLOSlowBurn" and value == pytest.approx(7.0)
    assert burns(minutes({b: 5.0 for b in range(377)})) == []  # 5x burns, but under both


def test_fast_burn_waits_for_its_2_minutes_and_needs_both_windows():
    # the last 2 minutes miss every request, 20 a minute missed from 7 to 59 minutes back:
    # now: 5 min 200 / 500 / 1% = 40x, 1 h 1,260 / 6,000 / 1% = 21x; 1 min ago 20x and 19.3x;
    # 2 min ago the 5 minutes (2..6 back) are clean: held 2 of the 3 minutes
    spike = {0: 100.0, 1: 100.0, **{b: 20.0 for b in range(7, 60)}}
    assert burns(minutes(spike)) == []
    [(rule, _, _, since)] = burns(minutes({**spike, 2: 100.0}))  # 3 minutes: fires, since 2 min ago
    assert rule == "MoemeterSLOFastBurn" and since == NOW - pd.Timedelta(minutes=2)
    # a burst over 5 minutes alone: 100% missed for 3 minutes is 3 x 100 / 6,000 / 1% = 5x over 1 h
    assert burns(minutes({0: 100.0, 1: 100.0, 2: 100.0})) == []


def test_no_request_held_no_burn_and_a_class_not_in_effect_is_not_judged():
    assert burns(minutes({}, held=0.0)) == []
    assert burns(minutes({b: 100.0 for b in range(377)}, name="retired")) == []
    assert burns(pd.DataFrame(columns=["back", "class", "held", "met"])) == []


# ---------------------------------------------------------------- $/M spike
def per_minute(tokens: list[float], usd: float = 1.0, pool: str = "decode") -> pd.DataFrame:
    """A pool's tokens per minute, tokens[0] the oldest, the last the minute up to NOW; `usd` a minute."""
    n = len(tokens)
    buckets = [NOW - pd.Timedelta(minutes=n - k) for k in range(n)]
    return pd.DataFrame({"bucket": buckets, "pool": pool, "tokens": tokens, "usd": usd})


def spikes(df: pd.DataFrame) -> list[tuple[str, str, float]]:
    from warehouse.alerts import evaluate_cost

    return [(f.rule, f.subject, f.value) for f in evaluate_cost(AlertRules(), df, NOW)]


def test_a_pools_last_hour_over_2x_its_24_hours_per_token_fires():
    # $1 a minute; 1,000 tokens a minute for 23 h, then 200 for the last 2 hours. Now: the hour costs
    # $60 for 12,000 tokens ($5,000/M), the 24 h $1,440 for 1,344,000 ($1,071.4/M): 4.7x; 30 min ago
    # $5,000/M against $1,410 / 1,368,000 ($1,030.7/M): held
    day = [1000.0] * (23 * 60) + [200.0] * 120
    [(rule, subject, value)] = spikes(per_minute(day))
    assert (rule, subject, value) == ("CostPerTokenSpike", "decode", pytest.approx(5000.0))
    # the drop began 40 minutes ago: now $60 / 28,000 = $2,142.9/M, over 2x the day's; 30 minutes
    # ago the hour held 10 low minutes: $60 / 52,000 = $1,153.8/M, under 2x: not held 30 min
    recent = [1000.0] * (24 * 60 + 30 - 40) + [200.0] * 40
    assert spikes(per_minute(recent)) == []
    assert spikes(per_minute([1000.0] * (25 * 60))) == []  # steady
    # 2.5 hours read: the longer figure is over what was read (30 min ago $120 / 72,000 = $1,666.7/M)
    [(_, _, value)] = spikes(per_minute([1000.0] * 60 + [200.0] * 90))
    assert value == pytest.approx(5000.0)
    assert spikes(per_minute([0.0] * (25 * 60))) == []  # no token, no $/M: PoolIdle's, not this
    assert spikes(per_minute(day, pool="prefill").assign(tokens=1000.0)) == []
