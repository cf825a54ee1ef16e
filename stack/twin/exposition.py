"""Render the twin's plain stats as Prometheus text, exactly as the real processes write it.

vLLM 0.32 (prometheus_client underneath): sorted label names, `_created` gauges beside every
counter and histogram, histogram lines in bucket, count, sum order. vllm-router 0.1.17 and
dcgm-exporter have their own layouts, taken from their captures.
"""

from __future__ import annotations

import numpy as np
from prometheus_client.utils import floatToGoString

from .config import TwinProfile
from .experts import ExpertState
from .stats import STEP_BUCKETS, STEP_PHASES, GpuStats, Histogram, InstanceStats, RouterStats

DCGM_INT64_BLANK = 9223372036854775794  # what DCGM reports for a field the GPU does not support


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))
    return "{" + inner + "}"


class _Page:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def head(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {floatToGoString(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# ------------------------------------------------------------------------- vLLM
# (family, help) in the order vLLM 0.32 registers them; "kind" decides the rendering.
_NIXL_HISTS = [
    ("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers."),
    ("vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers."),
    ("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers."),
    ("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL  KV Cache transfers."),
]
_NIXL_COUNTERS = [
    (
        "vllm:nixl_num_failed_transfers",
        "nixl_failed_transfers",
        "Number of failed NIXL KV Cache transfers, including handshake and notification failures. NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
    ),
    (
        "vllm:nixl_num_failed_notifications",
        None,
        "Number of failed NIXL KV Cache notifications. Retained for compatibility; these failures are also included in vllm:nixl_num_failed_transfers.",
    ),
    (
        "vllm:nixl_num_kv_expired_reqs",
        None,
        "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
    ),
    (
        "vllm:nixl_num_notifications_after_expiry",
        None,
        "Number of completion notifications for requests that were no longer tracked, usually because their KV lease expired. The KV blocks may have been reused before the transfer finished. Counted per notification (one per remote rank), not per request.",
    ),
]
_MFU_COUNTERS = [
    (
        "vllm:estimated_flops_per_gpu",
        "estimated_flops",
        "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
    ),
    (
        "vllm:estimated_read_bytes_per_gpu",
        "estimated_read_bytes",
        "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
    ),
    (
        "vllm:estimated_write_bytes_per_gpu",
        "estimated_write_bytes",
        "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
    ),
]
_CACHE_COUNTERS = [
    (
        "vllm:prefix_cache_queries",
        "prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    ("vllm:prefix_cache_hits", "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    (
        "vllm:external_prefix_cache_queries",
        "external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
    ),
    (
        "vllm:external_prefix_cache_hits",
        "external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
    ),
    ("vllm:mm_cache_queries", None, "Multi-modal cache queries, in terms of number of queried items."),
    ("vllm:mm_cache_hits", None, "Multi-modal cache hits, in terms of number of cached items."),
    ("vllm:num_preemptions", "num_preemptions", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens", "prompt_tokens", "Number of prefill tokens processed."),
]
_REQUEST_HISTS = [
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:request_generation_tokens", "Number of generation tokens processed."),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step."),
    ("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens."),
    ("vllm:request_params_n", "Histogram of the n request parameter."),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter."),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds."),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request."),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
    ("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted."),
    (
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    ),
]


class _VllmPage(_Page):
    def __init__(self, inst: InstanceStats, model_name: str) -> None:
        super().__init__()
        self.inst = inst
        self.model = model_name
        self.engines = [str(e) for e in range(inst.dp)]

    def per_engine(self, name: str, values: np.ndarray | None, extra: dict[str, str] | None = None) -> None:
        for e, label in enumerate(self.engines):
            labels = {"engine": label, "model_name": self.model, **(extra or {})}
            self.sample(name, labels, 0.0 if values is None else float(values[e]))

    def counter(self, base: str, help_text: str, series: list[tuple[dict[str, str], np.ndarray | None]]) -> None:
        self.head(base + "_total", "counter", help_text)
        for extra, values in series:
            self.per_engine(base + "_total", values, extra)
        self.head(base + "_created", "gauge", help_text)
        for extra, _ in series:
            self.per_engine(base + "_created", np.full(self.inst.dp, self.inst.created), extra)

    def gauge(self, name: str, help_text: str, series: list[tuple[dict[str, str], np.ndarray | None]]) -> None:
        self.head(name, "gauge", help_text)
        for extra, values in series:
            self.per_engine(name, values, extra)

    def histogram(self, name: str, help_text: str, h: Histogram) -> None:
        self.head(name, "histogram", help_text)
        cum = h.cumulative()
        bounds = [floatToGoString(b) for b in h.bounds] + ["+Inf"]
        for e, label in enumerate(self.engines):
            for j, le in enumerate(bounds):
                self.lines.append(
                    f'{name}_bucket{{engine="{label}",le="{le}",model_name="{self.model}"}} '
                    f"{floatToGoString(cum[e, j])}"
                )
            tail = f'{{engine="{label}",model_name="{self.model}"}}'
            self.lines.append(f"{name}_count{tail} {floatToGoString(cum[e, -1])}")
            self.lines.append(f"{name}_sum{tail} {floatToGoString(h.sums[e])}")
        self.head(name + "_created", "gauge", help_text)
        self.per_engine(name + "_created", np.full(self.inst.dp, self.inst.created))


def _process_families(page: _Page, created: float, rss: float) -> None:
    page.head("python_gc_objects_collected_total", "counter", "Objects collected during gc")
    for g in "012":
        page.sample("python_gc_objects_collected_total", {"generation": g}, 1000.0 * (3 - int(g)))
    page.head("python_info", "gauge", "Python platform information")
    page.sample(
        "python_info",
        {"implementation": "CPython", "major": "3", "minor": "12", "patchlevel": "3", "version": "3.12.3"},
        1.0,
    )
    page.head("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
    page.sample("process_resident_memory_bytes", {}, rss)
    page.head("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
    page.sample("process_start_time_seconds", {}, round(created, 2))


def render_vllm(inst: InstanceStats, profile: TwinProfile) -> str:
    """The /metrics page of one vLLM API server (all its DP engines), PD mode with NIXL."""
    p = _VllmPage(inst, profile.model.name)
    c, g, h = inst.counters, inst.gauges, inst.histograms
    _process_families(p, inst.created, 6.6e9)
    for name, help_text in _NIXL_HISTS:
        p.histogram(name, help_text, h[name])
    for base, key, help_text in _NIXL_COUNTERS + _MFU_COUNTERS:
        p.counter(base, help_text, [({}, c[key] if key else None)])
    p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", [({}, g["running"])])
    p.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", [({}, g["waiting"])])
    p.gauge(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        [({"reason": "capacity"}, g["waiting_capacity"]), ({"reason": "deferred"}, g["waiting_deferred"])],
    )
    p.gauge(
        "vllm:num_requests_kv_fetch_by_stage",
        "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs an async KV load that has not started; 'in_progress' = load started and not yet reported finished; 'completed_waiting' = load finished, request not running yet.",
        [
            ({"stage": "waiting_to_start"}, g["kv_fetch_waiting"]),
            ({"stage": "in_progress"}, g["kv_fetch_in_progress"]),
            ({"stage": "completed_waiting"}, g["kv_fetch_completed_waiting"]),
        ],
    )
    ones = np.ones(inst.dp)
    p.gauge(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        [
            ({"sleep_state": "awake"}, ones),
            ({"sleep_state": "weights_offloaded"}, None),
            ({"sleep_state": "discard_all"}, None),
        ],
    )
    p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", [({}, g["kv_cache_usage"])])
    for base, key, help_text in _CACHE_COUNTERS:
        p.counter(base, help_text, [({}, c[key] if key else None)])
    p.counter(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        [
            ({"source": "local_compute"}, c["prompt_local_compute"]),
            ({"source": "local_cache_hit"}, c["prompt_local_cache_hit"]),
            ({"source": "external_kv_transfer"}, c["prompt_external_kv_transfer"]),
        ],
    )
    p.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        [({}, c["cached_device"] + c["cached_p2p"])],
    )
    p.counter(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
        [
            ({"source": "device"}, c["cached_device"]),
            ({"source": "host"}, None),
            ({"source": "p2p"}, c["cached_p2p"]),
            ({"source": "disk"}, None),
            ({"source": "external_unspecified"}, None),
        ],
    )
    p.counter("vllm:generation_tokens", "Number of generation tokens processed.", [({}, c["generation_tokens"])])
    p.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [
            ({"finished_reason": r}, c[f"success_{r}"] if f"success_{r}" in c else None)
            for r in ("stop", "length", "abort", "error", "repetition")
        ],
    )
    help_rej = "Number of admission attempts rejected by a queue limit, by reason."
    p.head("vllm:admission_rejections_total", "counter", help_rej)
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        p.sample("vllm:admission_rejections_total", {"model_name": p.model, "reason": reason}, 0.0)
    p.head("vllm:admission_rejections_created", "gauge", help_rej)
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        p.sample("vllm:admission_rejections_created", {"model_name": p.model, "reason": reason}, inst.created)
    for name, help_text in _REQUEST_HISTS:
        p.histogram(name, help_text, h[name])
    p.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        [
            (
                {
                    "block_size": "64",
                    "cache_dtype": "fp8",
                    "enable_prefix_caching": str(inst.role == "prefill"),
                    "gpu_memory_utilization": "0.9",
                    "kv_cache_memory_bytes": str(
                        int(profile.performance.decode_kv_capacity_tokens * profile.model.kv_bytes_per_token)
                    ),
                },
                ones,
            )
        ],
    )
    help_http = "Total number of requests by method, status and handler."
    p.head("http_requests_total", "counter", help_http)
    p.sample(
        "http_requests_total", {"handler": "/v1/completions", "method": "POST", "status": "2xx"}, inst.http_requests
    )
    return p.text()


# ------------------------------------------------------------- moemeter plugin
HOT_EXPERTS = 8


def render_plugin(st: ExpertState, model_name: str) -> str:
    """The moemeter vLLM plugin's low-cardinality families (docs/metrics.md): per layer x rank
    load, per-layer balancedness, rebalances, and the hottest experts. Full matrices go to the
    snapshot endpoint instead."""
    p = _Page()
    layers, ranks = st.rank_tokens.shape
    p.head(
        "moemeter_expert_rank_tokens_total",
        "counter",
        "Tokens routed to the physical experts on this rank (engine), per MoE layer; top-k counted.",
    )
    for layer in range(layers):
        for rank in range(ranks):
            p.sample(
                "moemeter_expert_rank_tokens_total",
                {"engine": str(rank), "layer": str(layer), "model_name": model_name},
                float(st.rank_tokens[layer, rank]),
            )
    p.head(
        "moemeter_eplb_balancedness",
        "gauge",
        "Mean over ranks / max over ranks of rank load, per MoE layer, last step window.",
    )
    for layer in range(layers):
        p.sample(
            "moemeter_eplb_balancedness", {"layer": str(layer), "model_name": model_name}, float(st.balancedness[layer])
        )
    last = st.rebalances[-1] if st.rebalances else None
    p.head("moemeter_eplb_rebalances_total", "counter", "EPLB rebalances performed.")
    p.sample("moemeter_eplb_rebalances_total", {"model_name": model_name}, float(st.rebalances_total))
    p.head("moemeter_eplb_last_rebalance_duration_seconds", "gauge", "Wall time of the last EPLB rebalance.")
    p.sample(
        "moemeter_eplb_last_rebalance_duration_seconds",
        {"model_name": model_name},
        last.duration_seconds if last else 0.0,
    )
    p.head(
        "moemeter_eplb_last_rebalance_timestamp_seconds",
        "gauge",
        "Unix time the last EPLB rebalance finished (0: none yet).",
    )
    p.sample("moemeter_eplb_last_rebalance_timestamp_seconds", {"model_name": model_name}, last.at if last else 0.0)
    share = st.last_load / np.maximum(st.last_load.sum(axis=1, keepdims=True), 1.0)
    top = np.argsort(-share, axis=None, kind="stable")[:HOT_EXPERTS]
    p.head(
        "moemeter_expert_hot_share",
        "gauge",
        "Share of its layer's tokens taken by each of the hottest experts, last step window.",
    )
    for pos, flat in enumerate(top, start=1):
        layer, expert = divmod(int(flat), share.shape[1])
        p.sample(
            "moemeter_expert_hot_share",
            {"expert": str(expert), "layer": str(layer), "model_name": model_name, "position": str(pos)},
            float(share[layer, expert]),
        )
    return p.text()


def render_step_phases(inst: InstanceStats, model_name: str) -> str:
    """The moemeter plugin's engine-step families (every instance loads the plugin)."""
    p = _Page()

    def hist(name: str, help_text: str, rows: list[tuple[dict[str, str], np.ndarray, float]]) -> None:
        p.head(name, "histogram", help_text)
        for labels, counts, total in rows:
            cum = np.cumsum(counts)
            for le, n in zip([*map(repr, STEP_BUCKETS), "+Inf"], cum):
                p.sample(name + "_bucket", {**labels, "le": le}, float(n))
            p.sample(name + "_count", labels, float(cum[-1]))
            p.sample(name + "_sum", labels, float(total))

    ph = inst.phases
    hist(
        "moemeter_step_phase_seconds",
        "Engine-step time by phase: schedule, prepare_inputs, forward (device time), "
        "sample, update (scheduler output processing).",
        [
            ({"engine": str(e), "model_name": model_name, "phase": phase}, ph[phase].counts[e], ph[phase].sums[e])
            for e in range(inst.dp)
            for phase in STEP_PHASES
        ],
    )
    hist(
        "moemeter_step_seconds",
        "Engine-step wall time (EngineCore.step); CPU overhead = this - forward.",
        [
            ({"engine": str(e), "model_name": model_name}, ph["step"].counts[e], ph["step"].sums[e])
            for e in range(inst.dp)
        ],
    )
    hist(
        "moemeter_api_output_seconds",
        "API-server output handling per batch of engine outputs (OutputProcessor.process_outputs).",
        [({"model_name": model_name}, inst.api_output.counts[0], inst.api_output.sums[0])],
    )
    return p.text()


def expert_snapshot(st: ExpertState, model_name: str, now: float) -> dict[str, object]:
    """GET /moemeter/experts: full matrices for the warehouse (schema moemeter.experts/1)."""
    layers, ranks = st.rank_tokens.shape
    return {
        "schema": "moemeter.experts/1",
        "model_name": model_name,
        "time": now,
        "layers": layers,
        "logical_experts": st.logical_tokens.shape[1],
        "slots": st.phy2log.shape[1],
        "ranks": ranks,
        "logical_tokens_total": st.logical_tokens.round().tolist(),
        "phy2log": st.phy2log.tolist(),
        "rebalances": [
            {
                "time": r.at,
                "duration_seconds": r.duration_seconds,
                "moved_replicas": r.moved_replicas,
                "balancedness_before": r.balancedness_before,
                "balancedness_planned": r.balancedness_planned,
            }
            for r in st.rebalances
        ],
    }


# ----------------------------------------------------------------- vllm-router
def render_router(r: RouterStats) -> str:
    """vllm-router 0.1.17 --vllm-pd-disaggregation /metrics (families as in its capture)."""
    p = _Page()

    def block(name: str, kind: str, rows: list[tuple[dict[str, str], float]]) -> None:
        p.lines.append(f"# TYPE {name} {kind}")
        for labels, value in rows:
            p.lines.append(f"{name}{_plain_labels(labels)} {_router_value(value)}")
        p.lines.append("")

    workers = r.prefill_urls + r.decode_urls
    block("vllm_router_pd_prefill_errors_total", "counter", [({"worker": u}, 0) for u in r.prefill_urls])
    total = sum(r.requests_by_route.values())
    block(
        "vllm_router_prefix_routing_decisions_total",
        "counter",
        [({"policy": "cache_aware", "stage": s, "outcome": "cache_hit"}, total) for s in ("prefill", "decode")],
    )
    block(
        "vllm_router_processed_requests_total",
        "counter",
        [({"worker": u}, r.prefill_requests.get(u, 0) + r.decode_requests.get(u, 0)) for u in workers],
    )
    block("vllm_router_pd_requests_total", "counter", [({"route": k}, v) for k, v in r.requests_by_route.items()])
    block(
        "vllm_router_pd_prefill_requests_total",
        "counter",
        [({"worker": u}, r.prefill_requests[u]) for u in r.prefill_urls],
    )
    block("vllm_router_kv_routing_inputs_total", "counter", [({"transport": "pd_decode", "result": "accepted"}, total)])
    block(
        "vllm_router_policy_decisions_total",
        "counter",
        [
            ({"policy": "cache_aware", "worker": u}, r.prefill_requests.get(u, 0) + r.decode_requests.get(u, 0))
            for u in workers
        ],
    )
    block(
        "vllm_router_pd_decode_requests_total",
        "counter",
        [({"worker": u}, r.decode_requests[u]) for u in r.decode_urls],
    )
    block(
        "vllm_router_pd_active_prefill_tokens",
        "gauge",
        [({"worker": u, "rank": "aggregate"}, r.active_prefill_tokens.get(u, 0)) for u in r.prefill_urls],
    )
    block(
        "vllm_router_pd_active_decode_requests",
        "gauge",
        [({"worker": u, "rank": "aggregate"}, r.active_decode_requests.get(u, 0)) for u in r.decode_urls],
    )
    block("vllm_router_worker_health", "gauge", [({"worker": u}, 1) for u in workers])
    block(
        "vllm_router_pd_pending_decode_requests",
        "gauge",
        [({"worker": u, "rank": "aggregate"}, r.pending_decode_requests.get(u, 0)) for u in r.decode_urls],
    )
    block(
        "vllm_router_pd_prefill_occupancy",
        "gauge",
        [({"worker": u, "rank": "aggregate"}, r.prefill_occupancy.get(u, 0)) for u in r.prefill_urls],
    )
    block(
        "vllm_router_pd_unknown_prefill_requests",
        "gauge",
        [({"worker": u, "rank": "aggregate"}, 0) for u in r.prefill_urls],
    )
    recent = r.decode_pending_recent
    qs = (0, 0.5, 0.9, 0.95, 0.99, 0.999, 1)
    rows: list[tuple[dict[str, str], float]] = [
        ({"quantile": _router_value(q)}, float(np.quantile(recent, q)) if recent.size else 0.0) for q in qs
    ]
    p.lines.append("# TYPE vllm_router_pd_decode_pending_seconds summary")
    for labels, value in rows:
        p.lines.append(f"vllm_router_pd_decode_pending_seconds{_plain_labels(labels)} {_router_value(value)}")
    p.lines.append(f"vllm_router_pd_decode_pending_seconds_sum {_router_value(r.decode_pending_sum)}")
    p.lines.append(f"vllm_router_pd_decode_pending_seconds_count {_router_value(r.decode_pending_count)}")
    p.lines.append("")
    assert r.duration is not None
    cum = r.duration.cumulative()
    name = "vllm_router_pd_request_duration_seconds"
    p.lines.append(f"# TYPE {name} histogram")
    for i, route in enumerate(r.routes):
        for j, le in enumerate([*r.duration.bounds.tolist(), None]):
            le_s = "+Inf" if le is None else _router_value(le)
            p.lines.append(f'{name}_bucket{{route="{route}",le="{le_s}"}} {_router_value(cum[i, j])}')
        p.lines.append(f'{name}_sum{{route="{route}"}} {_router_value(r.duration.sums[i])}')
        p.lines.append(f'{name}_count{{route="{route}"}} {_router_value(cum[i, -1])}')
    return "\n".join(p.lines) + "\n"


def _plain_labels(labels: dict[str, str]) -> str:
    """The Rust exporter keeps label insertion order."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def _router_value(v: float) -> str:
    """The Rust exporter prints integral values without a decimal point."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


# ------------------------------------------------------------------- dcgm-exporter
# (field, type, help) — the dcgm-exporter default-counters fields the GPU pages read.
DCGM_FIELDS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
]


def render_dcgm(gpus: list[GpuStats], hostname: str, profile: TwinProfile) -> str:
    """One dcgm-exporter (one tray). GB300 reports no memory temperature: DCGM's blank sentinel."""
    total = profile.topology.gpu_memory_mib
    values = {
        "DCGM_FI_DEV_SM_CLOCK": lambda g: 1965.0 if g.util > 0 else 345.0,
        "DCGM_FI_DEV_MEM_CLOCK": lambda g: 3996.0,
        "DCGM_FI_DEV_MEMORY_TEMP": lambda g: DCGM_INT64_BLANK,
        "DCGM_FI_DEV_GPU_TEMP": lambda g: round(g.temp_c),
        "DCGM_FI_DEV_POWER_USAGE": lambda g: round(g.power_watts, 3),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda g: round(g.energy_mj),
        "DCGM_FI_DEV_GPU_UTIL": lambda g: round(g.util),
        "DCGM_FI_DEV_MEM_COPY_UTIL": lambda g: round(100 * g.dram_active),
        "DCGM_FI_DEV_XID_ERRORS": lambda g: 0,
        "DCGM_FI_DEV_FB_FREE": lambda g: round(total - g.fb_used_mib),
        "DCGM_FI_DEV_FB_USED": lambda g: round(g.fb_used_mib),
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": lambda g: round(g.nvlink_bytes),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": lambda g: round(g.util / 100, 6),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda g: round(g.tensor_active, 6),
        "DCGM_FI_PROF_DRAM_ACTIVE": lambda g: round(g.dram_active, 6),
    }
    lines: list[str] = []
    for field, kind, help_text in DCGM_FIELDS:
        lines.append(f"# HELP {field} {help_text}")
        lines.append(f"# TYPE {field} {kind}")
        for local, g in enumerate(gpus):
            labels = (
                f'gpu="{local}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",device="nvidia{local}",'
                f'modelName="{profile.topology.gpu_model}",Hostname="{hostname}"'
            )
            v = values[field](g)
            lines.append(f"{field}{{{labels}}} {v}")
    return "\n".join(lines) + "\n"
