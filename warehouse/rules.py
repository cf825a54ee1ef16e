"""The alert pack: one Prometheus rules file for the rack, over the families of the contract.

Groups: SLO burn rates from the gateway's histograms and request counter (multi-window, as in
Google's SRE workbook), NIXL transfer failures and expired KV, KV-cache saturation, preemptions,
DP-engine stragglers, targets down or absent, idle pools, a $/M-token spike, and the EPLB rules of
warehouse/alerts.py. Every threshold is a field of `AlertRules`; the SLO objectives and targets
are the SLO sheet's (warehouse/slo.py); the burn rates', acceptance lengths' and $/M expressions
are figures of warehouse/promql.py. Series are aggregated before they are compared, to `rack`,
`role` (the pool), `instance` and `engine` at most, so the pack's own series stay bounded on a
72-GPU rack.

The pack expects each scraped target to carry a `role` label (prefill, decode, router, gateway,
gpu: the targets file's role; `moemeter rules --sd-out` writes a file_sd file with it). The $/M
rule reads each pool's GPUs (from the targets file) and GPU-hour price (the sheet's, in effect
when the file is written) as recorded constants: write the file again when either changes.
"""

from __future__ import annotations

from moemeter.contract import POOLS, TargetInfo
from moemeter.contract.alerts import (
    ACCEPTANCE_MINUTES,
    NIXL_ALERTS,
    NIXL_MINUTES,
    POOL_IDLE_HOLD_MINUTES,
    PREEMPTING_MINUTES,
    PREEMPTION_RATE_MINUTES,
    STEP_MEAN_MINUTES,
    WAITING_MEAN_MINUTES,
    prom_minutes,
)
from warehouse.alerts import AlertRules, eplb_group
from warehouse.promql import (
    PoolCost,
    PromqlError,
    acceptance_length,
    figure,
    figures,
    inventory,
    pool_tokens,
)
from warehouse.slo import SloClass

WINDOWS = ("5m", "30m", "1h", "6h")
"""The burn-rate windows: fast burn reads 1h with 5m, slow burn 6h with 30m."""

ENGINE = "role, instance, engine"
"""What per-engine series are aggregated to."""


RulesError = PromqlError
"""Targets the pack cannot express (an SLO target that is no bucket boundary, no default class)."""


def alert_pack(
    rules: AlertRules,
    slo: SloClass,
    pools: dict[str, PoolCost] | None = None,
    targets: list[TargetInfo] | None = None,
    rack: str = "",
) -> dict[str, object]:
    """The rules file (YAML-serialisable): the gateway's traffic is held to `slo`, the SLO sheet's
    default class (its histograms have no class label: per-class attainment is the warehouse's).
    Without `pools` the $/M group is left out; `targets` and `rack` label the rack's inventory
    (`promql.inventory`), as the mixin records it."""
    groups = [_slo(rules, slo), _engines(rules), _targets(rules)]
    if pools:
        groups += [inventory(pools, targets, rack), _cost(rules, pools)]
    groups.append(eplb_group(rules))
    return {"groups": groups}


def file_sd(targets: list[TargetInfo]) -> list[dict[str, object]]:
    """A Prometheus file_sd file of the targets, each with the labels the pack reads."""
    from moemeter.contract.targets import instance_of

    return [
        {
            "targets": [instance_of(t.url)],
            "labels": {"role": t.role, "target": t.name, "__metrics_path__": _path(t.url)},
        }
        for t in targets
    ]


# --------------------------------------------------------------------------- groups
def _slo(r: AlertRules, c: SloClass) -> dict[str, object]:
    burns = [f for f in figures(c) if f.key.startswith("slo_")]
    record = [
        {
            "record": f"moemeter:slo_burn:rate{window}",
            "expr": f.expr(window),
            "labels": {"objective": f.key.removeprefix("slo_").removesuffix("_burn"), "slo_class": c.name},
        }
        for window in WINDOWS
        for f in burns
    ]
    what = "{{ $labels.slo_class }} {{ $labels.objective }} objective " + f"({c.objective * 100:g}% of requests)"
    alerts = [
        {
            "alert": "MoemeterSLOFastBurn",
            "expr": f"moemeter:slo_burn:rate1h > {r.burn_fast:g} and moemeter:slo_burn:rate5m > {r.burn_fast:g}",
            "for": "2m",
            "labels": {"severity": "page"},
            "annotations": {
                "summary": f'{what} burns its error budget {{{{ $value | printf "%.1f" }}}}x too fast (1 h):'
                f" at {r.burn_fast:g}x a {c.period_days:g}-day budget lasts {c.period_days / r.burn_fast:.1f} days",
            },
        },
        {
            "alert": "MoemeterSLOSlowBurn",
            "expr": f"moemeter:slo_burn:rate6h > {r.burn_slow:g} and moemeter:slo_burn:rate30m > {r.burn_slow:g}",
            "for": "15m",
            "labels": {"severity": "ticket"},
            "annotations": {
                "summary": f'{what} burns its error budget {{{{ $value | printf "%.1f" }}}}x too fast (6 h)',
            },
        },
    ]
    return {"name": "moemeter-slo", "rules": record + alerts}


def _engines(r: AlertRules) -> dict[str, object]:
    # a moment's queue is no straggler: the 2-min mean, of an engine scraped for those 2 minutes
    waiting = (
        f"sum by ({ENGINE}) (avg_over_time(vllm:num_requests_waiting[{prom_minutes(WAITING_MEAN_MINUTES)}]))"
        f" and on ({ENGINE}) vllm:num_requests_waiting offset {prom_minutes(WAITING_MEAN_MINUTES)}"
    )
    step = (
        f"sum by ({ENGINE}) (rate(moemeter_step_seconds_sum[{prom_minutes(STEP_MEAN_MINUTES)}]))"
        f" / sum by ({ENGINE}) (rate(moemeter_step_seconds_count[{prom_minutes(STEP_MEAN_MINUTES)}]))"
    )
    rules: list[dict[str, object]] = [
        {"record": "moemeter:engine_waiting:avg2m", "expr": waiting},
        {"record": "moemeter:engine_step_seconds:mean5m", "expr": step},
        {
            "record": "moemeter:engine_steps:increase5m",
            "expr": f"sum by ({ENGINE}) (increase(moemeter_step_seconds_count[5m]))",
        },
    ]
    drafted = prom_minutes(ACCEPTANCE_MINUTES)
    for by, scope in ((ENGINE, "engine"), ("rack, role", "pool")):
        rules += [
            {
                "record": f"moemeter:{scope}_acceptance_length:{drafted}",
                "expr": acceptance_length(by).replace("[W]", f"[{drafted}]"),
            },
            {
                "record": f"moemeter:{scope}_drafts:increase{drafted}",
                "expr": f"sum by ({by}) (increase(vllm:spec_decode_num_drafts_total[{drafted}]))",
            },
        ]
    nixl = prom_minutes(NIXL_MINUTES)
    for a in NIXL_ALERTS:
        rules.append(
            {
                "alert": a.alert,
                "expr": f"sum by (role, instance) (increase({a.family}[{nixl}])) > 0",
                "labels": {"severity": "warning"},
                "annotations": {
                    "summary": f'{{{{ $labels.role }}}} {{{{ $labels.instance }}}}: {{{{ $value | printf "%.0f" }}}} '
                    f"{a.what} in {NIXL_MINUTES:g} min"
                },
            }
        )
    rules += [
        {
            "alert": "KVCacheSaturated",
            "expr": f"max by ({ENGINE}) (vllm:kv_cache_usage_perc) > {r.kv_usage_max:g}",
            "for": f"{r.kv_minutes:g}m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.role }} {{ $labels.instance }} engine {{ $labels.engine }}: KV cache "
                "{{ $value | humanizePercentage }} full for " + f"{r.kv_minutes:g} min"
            },
        },
        {
            "alert": "EnginePreempting",
            "expr": f"sum by ({ENGINE}) (rate(vllm:num_preemptions_total[{prom_minutes(PREEMPTION_RATE_MINUTES)}])) * 60 > {r.preemptions_per_minute:g}",
            "for": prom_minutes(PREEMPTING_MINUTES),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.role }} {{ $labels.instance }} engine {{ $labels.engine }}: "
                '{{ $value | printf "%.1f" }} preemptions per minute'
            },
        },
        {
            "alert": "DPEngineStraggler",
            "expr": f"moemeter:engine_waiting:avg2m > on (role) group_left () ({r.straggler_factor:g} * quantile by (role)"
            f" (0.5, moemeter:engine_waiting:avg2m)) and moemeter:engine_waiting:avg2m >= {r.straggler_min_waiting:g}",
            "for": f"{r.straggler_minutes:g}m",
            "labels": {"severity": "warning", "signal": "waiting"},
            "annotations": {
                "summary": "{{ $labels.role }} {{ $labels.instance }} engine {{ $labels.engine }}: "
                '{{ $value | printf "%.1f" }} requests waiting (2-min mean), over '
                + f"{r.straggler_factor:g}x its pool's median"
            },
        },
        {
            "alert": "DPEngineStraggler",
            "expr": f"moemeter:engine_step_seconds:mean5m > on (role) group_left () ({r.straggler_step_factor:g} * "
            "quantile by (role) (0.5, moemeter:engine_step_seconds:mean5m))"
            f" and moemeter:engine_steps:increase5m >= {r.straggler_min_steps:g}",
            "for": f"{r.straggler_minutes:g}m",
            "labels": {"severity": "warning", "signal": "step"},
            "annotations": {
                "summary": "{{ $labels.role }} {{ $labels.instance }} engine {{ $labels.engine }}: "
                "{{ $value | humanizeDuration }} per engine step, over "
                f"{r.straggler_step_factor:g}x its pool's median: every rank's all-to-all waits for it"
            },
        },
    ]
    for scope, who in (
        ("engine", "{{ $labels.role }} {{ $labels.instance }} engine {{ $labels.engine }}"),
        ("pool", "{{ $labels.role }} pool"),
    ):
        rules.append(
            {
                "alert": "SpecAcceptanceLow",
                "expr": f"moemeter:{scope}_acceptance_length:{drafted} < {r.acceptance_length_min:g}"
                f" and moemeter:{scope}_drafts:increase{drafted} >= {r.acceptance_min_drafts:g}",
                "for": f"{r.acceptance_minutes:g}m",
                "labels": {"severity": "warning", "scope": scope},
                "annotations": {
                    "summary": f"{who}: mean acceptance length "
                    + '{{ $value | printf "%.2f" }} tokens per step (5-min rate), under '
                    + f"{r.acceptance_length_min:g}: its drafts are rejected"
                },
            }
        )
    return {"name": "moemeter-engines", "rules": rules}


def _targets(r: AlertRules) -> dict[str, object]:
    rules: list[dict[str, object]] = [
        {
            "alert": "TargetDown",
            "expr": "up == 0",
            "for": f"{r.target_down_minutes:g}m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "{{ $labels.role }} target {{ $labels.instance }} has not answered a scrape for "
                f"{r.target_down_minutes:g} min"
            },
        }
    ]
    idle = pool_tokens("role").replace("[W]", f"[{r.idle_minutes:g}m]")
    for pool in POOLS:
        rules.append(
            {
                "alert": "PoolAbsent",
                "expr": f'absent(up{{role="{pool}"}})',
                "for": f"{r.target_down_minutes:g}m",
                "labels": {"severity": "page", "role": pool},
                "annotations": {"summary": f"no {pool} target is scraped at all"},
            }
        )
        rules.append(
            {
                "alert": "PoolIdle",
                "expr": f'({idle}) == 0 and on (role) max by (role) (up{{role="{pool}"}}) == 1',
                "for": prom_minutes(POOL_IDLE_HOLD_MINUTES),
                "labels": {"severity": "info", "role": pool},
                "annotations": {"summary": f"the {pool} pool is up and produced no token in {r.idle_minutes:g} min"},
            }
        )
    return {"name": "moemeter-targets", "rules": rules}


def _cost(r: AlertRules, pools: dict[str, PoolCost]) -> dict[str, object]:
    usd = figure("pool_usd_per_mtok")
    rules: list[dict[str, object]] = [
        {"record": f"moemeter:pool_usd_per_mtok:{window}", "expr": usd.expr(window)} for window in ("1h", "24h")
    ]
    rules.append(
        {
            "alert": "CostPerTokenSpike",
            "expr": f"moemeter:pool_usd_per_mtok:1h > on (role) {r.cost_spike_factor:g} * moemeter:pool_usd_per_mtok:24h",
            "for": f"{r.cost_spike_minutes:g}m",
            "labels": {"severity": "ticket"},
            "annotations": {
                "summary": '{{ $labels.role }} pool: ${{ $value | printf "%.2f" }} per M tokens over the last hour, '
                f"over {r.cost_spike_factor:g}x its 24-hour figure",
                "description": ", ".join(
                    f"{p}: {c.gpus} GPUs at ${c.usd_per_gpu_hour:g}/GPU-hour" for p, c in pools.items()
                ),
            },
        }
    )
    return {"name": "moemeter-cost", "rules": rules}


# --------------------------------------------------------------------------- helpers
def _path(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).path or "/metrics"
