"""Every headline figure as PromQL, in one table: the recording rules of the Grafana mixin, the
panels of its dashboards, the rules of the alert pack that read a figure, the parity test against
a real Prometheus and docs/grafana.md all take their expressions from here.

A figure is a template over a window (`[W]` stands for the range, `5m` in the recording rules,
the compared window in the parity test) aggregated to the labels it keeps, `rack` first: the
operator's scrape config may add a `rack` label to every target (README, docs/grafana.md); where
it does not, the label is empty and every expression still holds. Each figure is the PromQL
reading of a definition of docs/definitions.md; its tolerance is how far Prometheus's answer may
lie from moemeter's query API for the same window, and why (the parity test holds both to it).

A rack's GPUs per pool and its GPU-hour prices are not in any exposition: the mixin records them as
constants (`moemeter:pool_gpus`, `moemeter:pool_usd_per_gpu_hour`) from the targets file and the
price sheet in force when it is written, the way the alert pack's $/M rule always has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from moemeter.contract import POOLS, TargetInfo
from moemeter.contract.alerts import ACCEPTANCE_MINUTES, prom_minutes
from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import E2E_BUCKETS, ITL_BUCKETS, SERVER_FAULTS, TTFT_BUCKETS
from warehouse.prices import PriceSheet
from warehouse.slo import SloClass

RULE_WINDOW = "5m"
"""The range of the mixin's recording rules (and of the panels that read them)."""

PROMPT = 'vllm:prompt_tokens_total{role="prefill"}'
CACHED = 'vllm:prompt_tokens_by_source_total{role="prefill",source="local_cache_hit"}'
GENERATED = 'vllm:generation_tokens_total{role="decode"}'
FINISHED = "moemeter_gateway_request_duration_seconds"
"""The gateway's histogram that observes every request it finishes."""
POOL_GPUS = "moemeter:pool_gpus"
RACK_GPUS = "moemeter:rack_gpus"
GPU_PRICE = "moemeter:pool_usd_per_gpu_hour"
CONSTANTS = (POOL_GPUS, RACK_GPUS, GPU_PRICE)
"""The rack's constants the mixin records from the targets file and the price sheet (`inventory`)."""
KV = f'vllm:kv_cache_usage_perc{{role=~"{"|".join(POOLS)}"}}'
WAITING = f'vllm:num_requests_waiting{{role=~"{"|".join(POOLS)}"}}'


class PromqlError(MoemeterError, ValueError):
    """A figure the rules cannot express (an SLO target that is no bucket boundary)."""


@dataclass(frozen=True)
class Tolerance:
    """How far Prometheus's answer may lie from moemeter's: `relative` of moemeter's value, or
    `absolute` in the figure's unit, or `sigmas` standard errors of the difference of two means of
    `samples` independent samples of a gauge whose standard deviation over the window is `spread`,
    whichever is largest; `why` is the reason docs/grafana.md gives."""

    name: str
    relative: float
    absolute: float
    why: str
    sigmas: float = 0.0

    def describe(self, unit: str) -> str:
        parts = [f"{self.relative:.0%}"] if self.relative else []
        parts += [f"{self.absolute:g} {unit}".strip()] if self.absolute else []
        parts += [f"{self.sigmas:g} standard errors"] if self.sigmas else []
        return " or ".join(parts)

    def allowed(self, moemeter: float, spread: float = 0.0, samples: int = 1) -> float:
        return max(self.relative * abs(moemeter), self.absolute, self.sigmas * spread * math.sqrt(2 / samples))


EDGES = Tolerance(
    "edges",
    0.02,
    0.0,
    "Prometheus's `rate` extrapolates its first and last sample in the range to the "
    "range's edges, moemeter prorates the increase between the scrapes on either side of each edge; "
    "the two scrape the same targets at different moments",
)
GAUGE = Tolerance(
    "sampling",
    0.01,
    0.0,
    "each side averages the samples its own scrapes took, at other moments of the window; "
    "a queue turns over faster than the scrape interval (the twin's prefill queue swings 12-125 "
    "between scrapes), so the two means differ like two independent samples: 3 standard errors of "
    "that difference (from the standard deviation Prometheus measures over the window), or 1%",
    sigmas=3.0,
)
BUCKETS = Tolerance(
    "buckets",
    0.03,
    0.0,
    "both interpolate linearly inside the bucket that holds the rank (moemeter's `histogram_quantile` "
    "is Prometheus's), over bucket increases that differ by the scrape phase at the window's edges",
)
REQUESTS = Tolerance(
    "requests",
    0.0,
    0.02,
    "moemeter counts the gateway's request records that finished inside the window "
    "(exact latencies), Prometheus the gateway histograms' increase between scrapes; a target on a "
    "bucket boundary makes the comparison itself exact, the requests at the edges do not; the twin "
    "fails no request, so its availability burn is 0 on both sides",
)


@dataclass(frozen=True)
class Figure:
    """One headline figure: `template` is PromQL with `[W]` for the range, kept by `by`."""

    key: str
    title: str
    unit: str  # a Grafana unit id
    by: tuple[str, ...]
    template: str
    tolerance: Tolerance
    definition: str  # the section of docs/definitions.md it reads
    plugin: bool = False  # needs the moemeter vLLM plugin's families
    spread: str = ""  # a sampled gauge's standard deviation over [W], for its tolerance
    recorded: str = ""  # the series the alert pack records it as, where it does (else the mixin's own)

    def spread_expr(self, window: str, interval: str) -> str:
        return self.spread.replace("[W]", f"[{window}:{interval}]")

    @property
    def record(self) -> str:
        return self.recorded or f"moemeter:{self.key}:{RULE_WINDOW}"

    def expr(self, window: str = RULE_WINDOW) -> str:
        return self.template.replace("[W]", f"[{window}]")


def _sum(by: str, series: str) -> str:
    return f"sum by ({by}) (rate({series}[W]))"


def _per_gpu(tokens: str, by: str = "rack, role") -> str:
    return f"({tokens}) / on ({by}) group_left () {POOL_GPUS}"


def over_share(histogram: str, target: float, buckets: tuple[float, ...], by: str = "rack") -> str:
    """The share of requests whose measure in `histogram` is above `target` over `[W]`. A request
    without the measure (an answer with no token text has no first token) did not miss it
    (docs/definitions.md, SLOs), so the share is of every request the gateway finished: its
    duration histogram observes each one."""
    if target not in buckets:
        raise PromqlError(
            f"{histogram}: the target {target:g} s is no bucket boundary ({', '.join(f'{b:g}' for b in buckets)})"
        )
    return (
        f"(sum by ({by}) (rate({histogram}_count[W]))"
        f' - sum by ({by}) (rate({histogram}_bucket{{le="{target!r}"}}[W])))'
        f" / sum by ({by}) (rate({FINISHED}_count[W]))"
    )


def fault_share(by: str = "rack") -> str:
    """The share of requests that failed on the server side (client errors are not the rack's)."""
    faults = "|".join(sorted(SERVER_FAULTS))
    return (
        f'(sum by ({by}) (rate(moemeter_gateway_requests_total{{outcome=~"{faults}"}}[W])) '
        f"or sum by ({by}) (rate(moemeter_gateway_requests_total[W])) * 0)"
        f" / sum by ({by}) (rate(moemeter_gateway_requests_total[W]))"
    )


def acceptance_length(by: str) -> str:
    return (
        f"1 + {_sum(by, 'vllm:spec_decode_num_accepted_tokens_total')}"
        f" / {_sum(by, 'vllm:spec_decode_num_drafts_total')}"
    )


def pool_tokens(by: str = "rack, role") -> str:
    """Per pool, the tokens its $/M is over (docs/definitions.md): the prefill pool's computed prompt
    tokens (prompt - cache hits), the decode pool's generated tokens."""
    return f"({computed(by)}) or {_sum(by, GENERATED)}"


def computed(by: str) -> str:
    """Computed prompt tokens (docs/definitions.md Tokens): prompt - cache hits, a pool without a cache
    hit series counting every prompt token as computed."""
    return f"{_sum(by, PROMPT)} - ({_sum(by, CACHED)} or {_sum(by, PROMPT)} * 0)"


def _quantile(q: float, family: str, role: str) -> str:
    return f'histogram_quantile({q:g}, sum by (rack, role, le) (rate({family}_bucket{{role="{role}"}}[W])))'


HEADLINE: tuple[Figure, ...] = (
    Figure(
        "rack_tokens_per_gpu",
        "Rack tokens/s per GPU (logical)",
        "short",
        ("rack",),
        f"({_sum('rack', PROMPT)} + {_sum('rack', GENERATED)}) / on (rack) group_left () {RACK_GPUS}",
        EDGES,
        "Throughput",
    ),
    Figure(
        "prefill_logical_tokens_per_gpu",
        "Prefill tokens/s per GPU (logical)",
        "short",
        ("rack", "role"),
        _per_gpu(_sum("rack, role", PROMPT)),
        EDGES,
        "Throughput",
    ),
    Figure(
        "prefill_computed_tokens_per_gpu",
        "Prefill tokens/s per GPU (computed)",
        "short",
        ("rack", "role"),
        _per_gpu(computed("rack, role")),
        EDGES,
        "Throughput",
    ),
    Figure(
        "decode_tokens_per_gpu",
        "Decode tokens/s per GPU",
        "short",
        ("rack", "role"),
        _per_gpu(_sum("rack, role", GENERATED)),
        EDGES,
        "Throughput",
    ),
    Figure(
        "ttft_p90_seconds",
        "TTFT P90 (prefill)",
        "s",
        ("rack", "role"),
        _quantile(0.9, "vllm:time_to_first_token_seconds", "prefill"),
        BUCKETS,
        "Throughput",
    ),
    Figure(
        "itl_p50_seconds",
        "Inter-token latency P50 (decode)",
        "s",
        ("rack", "role"),
        _quantile(0.5, "vllm:inter_token_latency_seconds", "decode"),
        BUCKETS,
        "Throughput",
    ),
    Figure(
        "user_tokens_per_second_p90",
        "P90 per-user tokens/s (decode)",
        "short",
        ("rack", "role"),
        "1 / " + _quantile(0.9, "vllm:request_time_per_output_token_seconds", "decode"),
        BUCKETS,
        "Throughput",
    ),
    Figure(
        "kv_cache_usage_mean",
        "KV-cache use (mean over engines)",
        "percentunit",
        ("rack", "role"),
        f"avg by (rack, role) (avg_over_time({KV}[W]))",
        GAUGE,
        "Pools and cost",
        spread=f"stddev_over_time((avg by (rack, role) ({KV}))[W])",
    ),
    Figure(
        "requests_waiting",
        "Requests waiting (sum over engines)",
        "short",
        ("rack", "role"),
        f"sum by (rack, role) (avg_over_time({WAITING}[W]))",
        GAUGE,
        "Pools and cost",
        spread=f"stddev_over_time((sum by (rack, role) ({WAITING}))[W])",
    ),
    Figure(
        "pool_usd_per_mtok",
        "$/M tokens per pool",
        "currencyUSD",
        ("rack", "role"),
        f"({POOL_GPUS} * on (rack, role) {GPU_PRICE}) / 3600 / on (rack, role) ((({pool_tokens()}) > 0) / 1e6)",
        EDGES,
        "$/M tokens and revenue",
    ),
    Figure(
        "layer_balancedness",
        "Balancedness per MoE layer",
        "percentunit",
        ("rack", "instance", "model_name", "layer"),
        "avg by (rack, instance, model_name, layer) (sum by (rack, instance, model_name, layer, engine)"
        " (rate(moemeter_expert_rank_tokens_total[W])))"
        " / max by (rack, instance, model_name, layer) (sum by (rack, instance, model_name, layer, engine)"
        " (rate(moemeter_expert_rank_tokens_total[W])))",
        EDGES,
        "Experts",
        plugin=True,
    ),
    Figure(
        "acceptance_length",
        "Mean acceptance length per pool",
        "short",
        ("rack", "role"),
        acceptance_length("rack, role"),
        EDGES,
        "Speculative decoding",
        recorded=f"moemeter:pool_acceptance_length:{prom_minutes(ACCEPTANCE_MINUTES)}",
    ),
)


def figure(key: str) -> Figure:
    [f] = [f for f in HEADLINE if f.key == key]
    return f


def figures(slo: SloClass) -> list[Figure]:
    """The headline figures and the SLO burn rates held to `slo` (the SLO sheet's default class: the
    gateway's histograms have no class label)."""
    out = list(HEADLINE)
    budget = 1 - slo.objective
    measures = (
        ("ttft", "moemeter_gateway_ttft_seconds", slo.ttft_seconds, TTFT_BUCKETS),
        ("itl", "moemeter_gateway_itl_mean_seconds", slo.itl_seconds, ITL_BUCKETS),
        ("e2e", FINISHED, slo.e2e_seconds, E2E_BUCKETS),
    )
    shares = [
        (name, f"{name.upper()} over {target:g} s", over_share(histogram, target, buckets))
        for name, histogram, target, buckets in measures
        if target
    ]
    shares.append(("availability", "server-side failures", fault_share()))
    for name, what, share in shares:
        out.append(
            Figure(
                f"slo_{name}_burn",
                f"SLO burn rate: {what}",
                "short",
                ("rack",),
                f"({share}) / {budget:g}",
                replace(REQUESTS, absolute=REQUESTS.absolute / budget),
                "SLOs",
                recorded=f'moemeter:slo_burn:rate{RULE_WINDOW}{{objective="{name}"}}',
            )
        )
    return out


# ---------------------------------------------------------------------- inventory
@dataclass(frozen=True)
class PoolCost:
    gpus: int
    usd_per_gpu_hour: float


def pool_costs(targets: list[TargetInfo], sheet: PriceSheet, at: datetime) -> dict[str, PoolCost]:
    """Each pool's GPUs in the targets file and its GPU-hour price in effect at `at` (UTC, naive)."""
    out = {}
    for pool in POOLS:
        gpus = sum(t.gpus for t in targets if t.role == pool)
        segments = sheet.gpu_segments(pool, at, at + timedelta(seconds=1))
        if gpus and segments:
            out[pool] = PoolCost(gpus, segments[0][2].usd_per_gpu_hour)
    return out


def rack_gpus(targets: list[TargetInfo]) -> int:
    """Every GPU the GPU exporters report, else the pools' (docs/definitions.md Throughput)."""
    return sum(t.gpus for t in targets if t.role == "gpu") or sum(t.gpus for t in targets if t.role in POOLS)


def inventory(pools: dict[str, PoolCost], targets: list[TargetInfo] | None = None, rack: str = "") -> dict[str, object]:
    """The rack's constants as recording rules: GPUs per pool (and in the rack, given the targets
    file), GPU-hour prices in effect when the file is written: write it again when either changes."""
    labels = {"rack": rack} if rack else {}
    rules: list[dict[str, object]] = [
        {"record": POOL_GPUS, "expr": f"vector({cost.gpus})", "labels": {**labels, "role": pool}}
        for pool, cost in pools.items()
    ]
    rules += [
        {
            "record": GPU_PRICE,
            "expr": f"vector({cost.usd_per_gpu_hour:.10g})",
            "labels": {**labels, "role": pool},
        }
        for pool, cost in pools.items()
    ]
    if targets is not None:
        rules.append({"record": RACK_GPUS, "expr": f"vector({rack_gpus(targets)})", "labels": labels})
    return {"name": "moemeter-inventory", "rules": rules}


def recording_group(slo: SloClass) -> dict[str, object]:
    """Every figure recorded at RULE_WINDOW (but those the alert pack records): what the
    dashboards' headline panels read."""
    return {
        "name": "moemeter-figures",
        "rules": [{"record": f.record, "expr": f.expr()} for f in figures(slo) if not f.recorded],
    }


# --------------------------------------------------------------------------- docs
def markdown_table(slo: SloClass, measured: dict[str, dict[str, float]]) -> str:
    """docs/grafana.md's parity table: each figure, its recording rule and tolerance, and the
    difference one run of tests/integration/test_promql_parity.py measured (MOEMETER_PARITY_OUT)."""
    lines = [
        "| Figure | Recording rule | Tolerance | moemeter | Prometheus | Difference | Allowed |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for f in figures(slo):
        m = measured.get(f.key)
        cells = ["not measured"] * 4
        if m:
            ours, theirs = m["moemeter"], m["prometheus"]
            diff = f"{(theirs - ours) / ours:+.2%}" if ours else f"{theirs - ours:+g}"
            cells = [_number(ours), _number(theirs), diff, f"±{_number(m['allowed'])}"]
        unit = "burn" if f.key.startswith("slo_") else ""
        lines.append(
            f"| {f.title} | `{f.record}` | {f.tolerance.describe(unit)} ({f.tolerance.name}) | "
            + " | ".join(cells)
            + " |"
        )
    lines += ["", "Why each tolerance is not zero:", ""]
    reasons = {f.tolerance.name: f.tolerance.why for f in figures(slo)}
    lines += [f"- **{name}**: {why}." for name, why in reasons.items()]
    return "\n".join(lines) + "\n"


def _number(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4f}" if abs(v) >= 0.01 or v == 0 else f"{v:.3g}"


if __name__ == "__main__":
    import json
    import sys

    from warehouse.slo import load_slo_sheet

    if len(sys.argv) != 3:
        sys.exit("usage: python -m warehouse.promql SLO_SHEET MEASURED_JSON (docs/grafana.md, Parity)")
    sheet = load_slo_sheet(sys.argv[1])
    slo = sheet.default_at(datetime.now(UTC).replace(tzinfo=None))
    if slo is None:
        sys.exit(f"{sys.argv[1]}: no default class is in effect now")
    with open(sys.argv[2]) as f:
        print(markdown_table(slo, json.load(f)), end="")
