"""Render the twin's plain stats as Prometheus text, exactly as the real processes write it.

vLLM 0.32 (prometheus_client underneath): sorted label names, `_created` gauges beside every
counter and histogram, histogram lines in bucket, count, sum order. vllm-router 0.1.17 and
dcgm-exporter have their own layouts, taken from their captures.
"""

from __future__ import annotations

import numpy as np
from prometheus_client.utils import floatToGoString

from moemeter.contract import FAMILIES, Family, of

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

    def family(self, name: str) -> Family:
        """The HELP and TYPE lines of a family of the contract."""
        f = FAMILIES[name]
        self.head(name, f.kind, f.help)
        return f

    def created(self, f: Family) -> None:
        """prometheus_client's `_created` gauge beside a counter or histogram, with its HELP."""
        self.head(f.base + "_created", "gauge", f.help)

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {floatToGoString(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# ------------------------------------------------------------------------- vLLM
# The families in the order vLLM 0.32 registers them (names, kinds and HELP: moemeter/contract/families.py),
# with the twin's counter behind each; None: a family that stays 0 in the twin.
_NIXL_HISTS = [
    "vllm:nixl_xfer_time_seconds",
    "vllm:nixl_post_time_seconds",
    "vllm:nixl_bytes_transferred",
    "vllm:nixl_num_descriptors",
]
_NIXL_COUNTERS = [
    ("vllm:nixl_num_failed_transfers_total", "nixl_failed_transfers"),
    ("vllm:nixl_num_failed_notifications_total", None),
    ("vllm:nixl_num_kv_expired_reqs_total", None),
    ("vllm:nixl_num_notifications_after_expiry_total", None),
]
_MFU_COUNTERS = [
    ("vllm:estimated_flops_per_gpu_total", "estimated_flops"),
    ("vllm:estimated_read_bytes_per_gpu_total", "estimated_read_bytes"),
    ("vllm:estimated_write_bytes_per_gpu_total", "estimated_write_bytes"),
]
_CACHE_COUNTERS = [
    ("vllm:prefix_cache_queries_total", "prefix_cache_queries"),
    ("vllm:prefix_cache_hits_total", "prefix_cache_hits"),
    ("vllm:external_prefix_cache_queries_total", "external_prefix_cache_queries"),
    ("vllm:external_prefix_cache_hits_total", "external_prefix_cache_hits"),
    ("vllm:mm_cache_queries_total", None),
    ("vllm:mm_cache_hits_total", None),
    ("vllm:num_preemptions_total", "num_preemptions"),
    ("vllm:prompt_tokens_total", "prompt_tokens"),
]
_REQUEST_HISTS = [
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_params_n",
    "vllm:request_params_max_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_num_preemptions",
    "vllm:request_prefill_kv_computed_tokens",
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

    def counter(self, name: str, series: list[tuple[dict[str, str], np.ndarray | None]]) -> None:
        f = self.family(name)
        for extra, values in series:
            self.per_engine(name, values, extra)
        self.created(f)
        for extra, _ in series:
            self.per_engine(f.base + "_created", np.full(self.inst.dp, self.inst.created), extra)

    def gauge(self, name: str, series: list[tuple[dict[str, str], np.ndarray | None]]) -> None:
        self.family(name)
        for extra, values in series:
            self.per_engine(name, values, extra)

    def histogram(self, name: str, h: Histogram) -> None:
        f = self.family(name)
        cum = np.floor(h.cumulative())  # observations counted: whole on a real page (the model's steps are not)
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
        self.created(f)
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
    page.family("process_start_time_seconds")
    page.sample("process_start_time_seconds", {}, round(created, 2))


def render_vllm(inst: InstanceStats, profile: TwinProfile) -> str:
    """The /metrics page of one vLLM API server (all its DP engines), PD mode with NIXL."""
    p = _VllmPage(inst, profile.model.name)
    c, g, h = inst.counters, inst.gauges, inst.histograms
    _process_families(p, inst.created, 6.6e9)
    for name in _NIXL_HISTS:
        p.histogram(name, h[name])
    for name, key in _NIXL_COUNTERS + _MFU_COUNTERS:
        p.counter(name, [({}, c[key] if key else None)])
    if "spec_drafts" in c:
        _spec_decode(p, c["spec_drafts"], c["spec_accepted_per_pos"])
    p.gauge("vllm:num_requests_running", [({}, g["running"])])
    p.gauge("vllm:num_requests_waiting", [({}, g["waiting"])])
    p.gauge(
        "vllm:num_requests_waiting_by_reason",
        [({"reason": "capacity"}, g["waiting_capacity"]), ({"reason": "deferred"}, g["waiting_deferred"])],
    )
    p.gauge(
        "vllm:num_requests_kv_fetch_by_stage",
        [
            ({"stage": "waiting_to_start"}, g["kv_fetch_waiting"]),
            ({"stage": "in_progress"}, g["kv_fetch_in_progress"]),
            ({"stage": "completed_waiting"}, g["kv_fetch_completed_waiting"]),
        ],
    )
    ones = np.ones(inst.dp)
    p.gauge(
        "vllm:engine_sleep_state",
        [
            ({"sleep_state": "awake"}, ones),
            ({"sleep_state": "weights_offloaded"}, None),
            ({"sleep_state": "discard_all"}, None),
        ],
    )
    p.gauge("vllm:kv_cache_usage_perc", [({}, g["kv_cache_usage"])])
    for name, key in _CACHE_COUNTERS:
        p.counter(name, [({}, c[key] if key else None)])
    p.counter(
        "vllm:prompt_tokens_by_source_total",
        [
            ({"source": "local_compute"}, c["prompt_local_compute"]),
            ({"source": "local_cache_hit"}, c["prompt_local_cache_hit"]),
            ({"source": "external_kv_transfer"}, c["prompt_external_kv_transfer"]),
        ],
    )
    p.counter("vllm:prompt_tokens_cached_total", [({}, c["cached_device"] + c["cached_p2p"])])
    p.counter(
        "vllm:prompt_tokens_cached_by_source_total",
        [
            ({"source": "device"}, c["cached_device"]),
            ({"source": "host"}, None),
            ({"source": "p2p"}, c["cached_p2p"]),
            ({"source": "disk"}, None),
            ({"source": "external_unspecified"}, None),
        ],
    )
    p.counter("vllm:generation_tokens_total", [({}, c["generation_tokens"])])
    p.counter(
        "vllm:request_success_total",
        [
            ({"finished_reason": r}, c[f"success_{r}"] if f"success_{r}" in c else None)
            for r in ("stop", "length", "abort", "error", "repetition")
        ],
    )
    rejections = p.family("vllm:admission_rejections_total")
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        p.sample("vllm:admission_rejections_total", {"model_name": p.model, "reason": reason}, 0.0)
    p.created(rejections)
    for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
        p.sample("vllm:admission_rejections_created", {"model_name": p.model, "reason": reason}, inst.created)
    for name in _REQUEST_HISTS:
        p.histogram(name, h[name])
    p.family("vllm:cache_config_info")
    for engine in p.engines:  # vLLM 0.32 labels it by engine only, without model_name
        p.sample("vllm:cache_config_info", {**_cache_config(inst, profile), "engine": engine}, 1.0)
    help_http = "Total number of requests by method, status and handler."
    p.head("http_requests_total", "counter", help_http)
    p.sample(
        "http_requests_total", {"handler": "/v1/completions", "method": "POST", "status": "2xx"}, inst.http_requests
    )
    return p.text()


def _spec_decode(p: _VllmPage, drafts: np.ndarray, accepted_per_pos: np.ndarray) -> None:
    """vLLM's SpecDecodingProm counters from the model's fractional steps, in whole numbers that keep
    vLLM's own invariants: every draft drafts k tokens, the accepted tokens are the sum over
    positions, and no position accepts more than the one before it or than there were drafts."""
    whole = np.floor(drafts)
    per_pos = np.floor(accepted_per_pos)
    k = per_pos.shape[1]
    p.counter("vllm:spec_decode_num_drafts_total", [({}, whole)])
    p.counter("vllm:spec_decode_num_draft_tokens_total", [({}, whole * k)])
    p.counter("vllm:spec_decode_num_accepted_tokens_total", [({}, per_pos.sum(axis=1))])
    p.counter(
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        [({"position": str(i)}, per_pos[:, i]) for i in range(k)],
    )


# vLLM 0.32's CacheConfig fields as vllm:cache_config_info labels them, at the values of its
# defaults (the capture's); _cache_config sets those the twin's profile decides.
_CACHE_CONFIG_DEFAULTS = {
    "_block_size_resolved": "True",
    "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "hash_block_size": "None",
    "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]",
    "kv_cache_layout": "None",
    "kv_offloading_backend": "native",
    "kv_offloading_size": "None",
    "kv_sharing_fast_prefill": "False",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32",
    "num_cpu_blocks": "None",
    "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0",
    "prefix_caching_hash_algo": "sha256",
    "prefix_match_unit": "None",
    "replayssm_buffer_len": "16",
    "skip_page_size_padded": "None",
    "sliding_window": "None",
    "swa_bounded_replay": "True",
    "use_kda_recoverssm": "False",
    "use_replayssm": "False",
    "user_specified_block_size": "False",
}
_BLOCK_SIZE = 64


def _cache_config(inst: InstanceStats, profile: TwinProfile) -> dict[str, str]:
    tokens = profile.performance.decode_kv_capacity_tokens
    return {
        **_CACHE_CONFIG_DEFAULTS,
        "block_size": str(_BLOCK_SIZE),
        "cache_dtype": "fp8",
        "effective_attention_block_size": str(_BLOCK_SIZE),
        "enable_prefix_caching": str(inst.role == "prefill"),
        "gpu_memory_utilization": "0.9",
        "kv_cache_max_concurrency": repr(tokens / profile.model.max_model_len),
        "kv_cache_memory_bytes": str(int(tokens * profile.model.kv_bytes_per_token)),
        "kv_cache_size_tokens": str(tokens),
        "num_gpu_blocks": str(tokens // _BLOCK_SIZE),
    }


# ------------------------------------------------------------- moemeter plugin
HOT_EXPERTS = 8


def render_plugin(st: ExpertState, model_name: str) -> str:
    """The moemeter vLLM plugin's low-cardinality families (docs/metrics.md): per layer x rank
    load, per-layer balancedness, rebalances, and the hottest experts. Full matrices go to the
    snapshot endpoint instead."""
    p = _Page()
    layers, ranks = st.rank_tokens.shape
    p.family("moemeter_expert_rank_tokens_total")
    for layer in range(layers):
        for rank in range(ranks):
            p.sample(
                "moemeter_expert_rank_tokens_total",
                {"engine": str(rank), "layer": str(layer), "model_name": model_name},
                float(np.floor(st.rank_tokens[layer, rank])),  # tokens: whole, as the plugin counts them
            )
    p.family("moemeter_eplb_balancedness")
    for layer in range(layers):
        p.sample(
            "moemeter_eplb_balancedness", {"layer": str(layer), "model_name": model_name}, float(st.balancedness[layer])
        )
    last = st.rebalances[-1] if st.rebalances else None
    p.family("moemeter_eplb_rebalances_total")
    p.sample("moemeter_eplb_rebalances_total", {"model_name": model_name}, float(st.rebalances_total))
    p.family("moemeter_eplb_last_rebalance_duration_seconds")
    p.sample(
        "moemeter_eplb_last_rebalance_duration_seconds",
        {"model_name": model_name},
        last.duration_seconds if last else 0.0,
    )
    p.family("moemeter_eplb_last_rebalance_timestamp_seconds")
    p.sample("moemeter_eplb_last_rebalance_timestamp_seconds", {"model_name": model_name}, last.at if last else 0.0)
    share = st.last_load / np.maximum(st.last_load.sum(axis=1, keepdims=True), 1.0)
    top = np.argsort(-share, axis=None, kind="stable")[:HOT_EXPERTS]
    p.family("moemeter_expert_hot_share")
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

    def hist(name: str, rows: list[tuple[dict[str, str], np.ndarray, float]]) -> None:
        p.family(name)
        for labels, counts, total in rows:
            cum = np.cumsum(counts)
            for le, n in zip([*map(repr, STEP_BUCKETS), "+Inf"], cum):
                p.sample(name + "_bucket", {**labels, "le": le}, float(n))
            p.sample(name + "_count", labels, float(cum[-1]))
            p.sample(name + "_sum", labels, float(total))

    ph = inst.phases
    hist(
        "moemeter_step_phase_seconds",
        [
            ({"engine": str(e), "model_name": model_name, "phase": phase}, ph[phase].counts[e], ph[phase].sums[e])
            for e in range(inst.dp)
            for phase in STEP_PHASES
        ],
    )
    hist(
        "moemeter_step_seconds",
        [
            ({"engine": str(e), "model_name": model_name}, ph["step"].counts[e], ph["step"].sums[e])
            for e in range(inst.dp)
        ],
    )
    hist(
        "moemeter_api_output_seconds",
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

    def block(name: str, rows: list[tuple[dict[str, str], float]]) -> None:
        p.lines.append(f"# TYPE {name} {FAMILIES[name].kind}")  # the router writes no HELP
        for labels, value in rows:
            p.lines.append(f"{name}{_plain_labels(labels)} {_router_value(value)}")
        p.lines.append("")

    workers = r.prefill_urls + r.decode_urls
    block("vllm_router_pd_prefill_errors_total", [({"worker": u}, 0) for u in r.prefill_urls])
    total = sum(r.requests_by_route.values())
    block(
        "vllm_router_prefix_routing_decisions_total",
        [({"policy": "cache_aware", "stage": s, "outcome": "cache_hit"}, total) for s in ("prefill", "decode")],
    )
    block(
        "vllm_router_processed_requests_total",
        [({"worker": u}, r.prefill_requests.get(u, 0) + r.decode_requests.get(u, 0)) for u in workers],
    )
    block("vllm_router_pd_requests_total", [({"route": k}, v) for k, v in r.requests_by_route.items()])
    block(
        "vllm_router_pd_prefill_requests_total",
        [({"worker": u}, r.prefill_requests[u]) for u in r.prefill_urls],
    )
    block("vllm_router_kv_routing_inputs_total", [({"transport": "pd_decode", "result": "accepted"}, total)])
    block(
        "vllm_router_policy_decisions_total",
        [
            ({"policy": "cache_aware", "worker": u}, r.prefill_requests.get(u, 0) + r.decode_requests.get(u, 0))
            for u in workers
        ],
    )
    block(
        "vllm_router_pd_decode_requests_total",
        [({"worker": u}, r.decode_requests[u]) for u in r.decode_urls],
    )
    block(
        "vllm_router_pd_active_prefill_tokens",
        [({"worker": u, "rank": "aggregate"}, r.active_prefill_tokens.get(u, 0)) for u in r.prefill_urls],
    )
    block(
        "vllm_router_pd_active_decode_requests",
        [({"worker": u, "rank": "aggregate"}, r.active_decode_requests.get(u, 0)) for u in r.decode_urls],
    )
    block("vllm_router_worker_health", [({"worker": u}, 1) for u in workers])
    block(
        "vllm_router_pd_pending_decode_requests",
        [({"worker": u, "rank": "aggregate"}, r.pending_decode_requests.get(u, 0)) for u in r.decode_urls],
    )
    block(
        "vllm_router_pd_prefill_occupancy",
        [({"worker": u, "rank": "aggregate"}, r.prefill_occupancy.get(u, 0)) for u in r.prefill_urls],
    )
    block(
        "vllm_router_pd_unknown_prefill_requests",
        [({"worker": u, "rank": "aggregate"}, 0) for u in r.prefill_urls],
    )
    recent = r.decode_pending_recent
    qs = (0, 0.5, 0.9, 0.95, 0.99, 0.999, 1)
    rows: list[tuple[dict[str, str], float]] = [
        ({"quantile": _router_value(q)}, float(np.quantile(recent, q)) if recent.size else 0.0) for q in qs
    ]
    name = "vllm_router_pd_decode_pending_seconds"
    p.lines.append(f"# TYPE {name} {FAMILIES[name].kind}")
    for labels, value in rows:
        p.lines.append(f"vllm_router_pd_decode_pending_seconds{_plain_labels(labels)} {_router_value(value)}")
    p.lines.append(f"vllm_router_pd_decode_pending_seconds_sum {_router_value(r.decode_pending_sum)}")
    p.lines.append(f"vllm_router_pd_decode_pending_seconds_count {_router_value(r.decode_pending_count)}")
    p.lines.append("")
    assert r.duration is not None
    cum = r.duration.cumulative()
    name = "vllm_router_pd_request_duration_seconds"
    p.lines.append(f"# TYPE {name} {FAMILIES[name].kind}")
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
# The dcgm-exporter default-counters fields the twin serves (kinds and HELP: moemeter/contract/families.py).
DCGM_FIELDS = [f.name for f in of("dcgm")]


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
    for field in DCGM_FIELDS:
        lines.append(f"# HELP {field} {FAMILIES[field].help}")
        lines.append(f"# TYPE {field} {FAMILIES[field].kind}")
        for local, g in enumerate(gpus):
            labels = (
                f'gpu="{local}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",device="nvidia{local}",'
                f'modelName="{profile.topology.gpu_model}",Hostname="{hostname}"'
            )
            v = values[field](g)
            lines.append(f"{field}{{{labels}}} {v}")
    return "\n".join(lines) + "\n"
