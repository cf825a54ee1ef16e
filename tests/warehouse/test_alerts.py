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
