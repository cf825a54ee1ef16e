"""The alert pack's fixed parts, read by both of its renderings: the Prometheus rules file
(warehouse/rules.py) and the banner that judges the same rules over stored rows
(warehouse/alerts.py). Thresholds a user may change are `AlertRules` fields (warehouse/alerts.py);
the windows and alerts here are the pack's shape."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CounterAlert:
    """Fires when a counter grows at all over the last `minutes` (`increase(c[Nm]) > 0`)."""

    alert: str
    family: str
    what: str
    """The summary's words after the count: "3 KV transfers failed in 5 min"."""


NIXL_MINUTES = 5.0
NIXL_ALERTS = (
    CounterAlert("NIXLFailedTransfers", "vllm:nixl_num_failed_transfers_total", "KV transfers failed"),
    CounterAlert("NIXLFailedNotifications", "vllm:nixl_num_failed_notifications_total", "NIXL notifications failed"),
    CounterAlert(
        "NIXLExpiredKV", "vllm:nixl_num_kv_expired_reqs_total", "requests' KV blocks expired before decode read them"
    ),
)
"""NIXL's fault counters, each its own alert over NIXL_MINUTES."""

WAITING_MEAN_MINUTES = 2.0
"""A straggler's queue: avg_over_time(vllm:num_requests_waiting[2m]), judged once it spans 2 min."""
STEP_MEAN_MINUTES = 5.0
"""An engine's mean step time: rate(moemeter_step_seconds_sum[5m]) / rate(..._count[5m])."""
PREEMPTION_RATE_MINUTES = 10.0
"""Preemptions per minute: rate(vllm:num_preemptions_total[10m]) * 60 ..."""
PREEMPTING_MINUTES = 5.0
"""... held this long (`for: 5m`)."""
POOL_IDLE_HOLD_MINUTES = 1.0
"""PoolIdle's `for`."""
ACCEPTANCE_MINUTES = 5.0
"""Mean acceptance length over the last 5 min: 1 + rate(vllm:spec_decode_num_accepted_tokens_total[5m])
/ rate(vllm:spec_decode_num_drafts_total[5m]), as vLLM's own Grafana board draws it."""


def prom_minutes(minutes: float) -> str:
    """A PromQL duration of whole minutes: 5.0 -> "5m"."""
    return f"{minutes:g}m"
