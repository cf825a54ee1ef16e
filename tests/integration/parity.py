"""What the parity tests (test_promql_parity.py on the twin, test_localstack_spec.py on real vLLM)
share: the SLO class both hold the runs to, Prometheus's instant query, and moemeter's reading of
each headline figure through its query API (warehouse/promql.py names the figures)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx

from dashboard.data import experts, live, spec
from warehouse.api import QueryClient
from warehouse.cost import cost_report, stored_pools
from warehouse.goodput import slo_reports
from warehouse.read import Window
from warehouse.slo import load_slo_sheet

ONE_BUCKET = 9_999_999
"""A step far longer than the window, and no whole minute: one bucket of raw rows (warehouse/read.py)."""

NOW = datetime.now(UTC).replace(tzinfo=None)
SLO_SHEET = Path(__file__).parents[1] / "fixtures" / "slo-parity.toml"
SLO = load_slo_sheet(SLO_SHEET).default_at(NOW)


def query(url: str, expr: str, at: datetime | None) -> list[dict]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at.replace(tzinfo=UTC).timestamp():.3f}"
    body = httpx.get(url + "/api/v1/query", params=params, timeout=30).json()
    assert body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def moemeter(q: QueryClient, key: str, start: datetime, end: datetime, instances: dict[str, str]):
    """moemeter's answer for [start, end) through its query API, keyed as `prometheus` keys."""
    w = Window(start, end, ONE_BUCKET)
    gpus = live.pool_gpus(live.targets(q, w))
    if key.endswith("tokens_per_gpu"):
        series = {
            "rack_tokens_per_gpu": ("rack logical", ()),
            "prefill_logical_tokens_per_gpu": ("prefill logical", ("prefill",)),
            "prefill_computed_tokens_per_gpu": ("prefill computed", ("prefill",)),
            "decode_tokens_per_gpu": ("decode", ("decode",)),
        }[key]
        tpg = live.tokens_per_gpu(live.token_rates(q, w), gpus)
        [value] = tpg.loc[tpg["series"] == series[0], "value"]
        return {series[1]: float(value)}
    if key in ("ttft_p90_seconds", "itl_p50_seconds", "user_tokens_per_second_p90"):
        family, quantile, role = {
            "ttft_p90_seconds": ("vllm:time_to_first_token_seconds", 0.9, "prefill"),
            "itl_p50_seconds": ("vllm:inter_token_latency_seconds", 0.5, "decode"),
            "user_tokens_per_second_p90": ("vllm:request_time_per_output_token_seconds", 0.9, "decode"),
        }[key]
        counts = live.histograms_counts(q, w, [family])[family]
        value = live.quantile_overall(counts, quantile, role)
        return {(role,): 1 / value if key.startswith("user") else value}
    if key in ("kv_cache_usage_mean", "requests_waiting"):
        gauges = live.queue_and_kv(q, w)
        column = "kv_mean" if key == "kv_cache_usage_mean" else "waiting"
        return {(role,): float(g[column].mean()) for role, g in gauges.groupby("role")}
    if key == "pool_usd_per_mtok":
        report = cost_report(q, stored_pools(q, start, end), start, end, revenue_too=False)
        return {
            ("prefill",): report.prefill.cost_usd / (report.computed_prompt_tokens / 1e6),
            ("decode",): report.decode.cost_usd / (report.generated_tokens / 1e6),
        }
    if key == "layer_balancedness":
        out = {}
        for target in experts.eplb_targets(q):
            bal = experts.balancedness_over_time(experts.rank_steps(q, w, target))
            for layer, g in bal.groupby("layer"):
                out[(instances[target], "", str(layer))] = float(g["balancedness"].mean())
        return out
    if key == "acceptance_length":
        pools = spec.drafting(q, w).window("pool")
        return {(r["role"],): float(r["mean_acceptance_length"]) for _, r in pools.iterrows()}
    if key.startswith("slo_"):
        rows = slo_reports(q, start, end)["class"].rows
        [row] = rows[rows["class"] == SLO.name].to_dict("records")
        missed = {
            "slo_ttft_burn": "missed_ttft",
            "slo_itl_burn": "missed_itl",
            "slo_e2e_burn": "missed_e2e",
            "slo_availability_burn": "failed",
        }[key]
        return {(): row[missed] / row["requests"] / (1 - SLO.objective)}
    raise AssertionError(f"no moemeter reading for the figure {key}")
