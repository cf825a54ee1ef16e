"""Every metric family moemeter reads or emits, by the name its `# TYPE` line gives (counters with
`_total`), with its kind, label names (`le` and `quantile` aside), unit, HELP text as its source
writes it, the source and the versions it is known in. The rack twin renders its pages from here,
the gateway its /metrics, docs/metrics.md's table is generated from here (`python -m
moemeter.contract > table`; tests/test_docs.py checks it), and tests/stack/twin/test_contract.py
holds every entry to the real captures in tests/fixtures/ (vLLM's `PrometheusStatLogger` declares
its families the same way)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    title: str
    """As docs/metrics.md names it."""
    versions: tuple[str, ...]
    """The versions whose real output the families were checked against (tests/fixtures/)."""


SOURCES = {
    "vllm": Source("vLLM 0.32 API server (prefill and decode instances)", ("vllm 0.32.0",)),
    "router": Source("vllm-router 0.1.17 (`--vllm-pd-disaggregation`)", ("vllm-router 0.1.17",)),
    "dcgm": Source("dcgm-exporter (one per tray)", ("dcgm-exporter default-counters.csv",)),
    "plugin": Source("moemeter vLLM plugin", ("vllm 0.32.0",)),
    "gateway": Source("moemeter metering gateway", ()),
    "process": Source("prometheus_client's process collector (vLLM's API servers)", ("vllm 0.32.0",)),
}

STEP_PHASES = ("schedule", "prepare_inputs", "forward", "sample", "update")
"""The phases the plugin times an engine step in (its `phase` label). The plugin is a distribution
of its own that imports nothing of ours: tests/test_contract.py holds its PHASES equal to these."""

KINDS = ("counter", "gauge", "histogram", "summary")


@dataclass(frozen=True)
class Family:
    source: str
    """A key of SOURCES."""
    name: str
    """As its `# TYPE` line writes it: counters end in `_total`."""
    kind: str
    """counter, gauge, histogram or summary."""
    labels: tuple[str, ...]
    """Label names of its samples, sorted; `le` and `quantile` aside."""
    unit: str = ""
    """Of its value (a histogram's: of what it observes); "" for a count or an info gauge."""
    help: str = ""
    """Its `# HELP` text, exactly as the source writes it ("" where it writes none)."""
    meaning: str = ""
    """What docs/metrics.md says it means, when more than its HELP text."""
    read_by: str = "stored"
    """What moemeter shows from it."""
    where: str = ""
    """Where it comes from, when more precise than its source's title."""

    @property
    def base(self) -> str:
        """The name a prometheus_client counter family is declared by (without `_total`)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    @property
    def origin(self) -> str:
        return self.where or SOURCES[self.source].title


_FAMILIES = [
    # vLLM 0.32: the API server of every prefill and decode instance (one per data-parallel group)
    Family(
        "vllm",
        "vllm:nixl_xfer_time_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of transfer duration for NIXL KV Cache transfers.",
    ),
    Family(
        "vllm",
        "vllm:nixl_post_time_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of transfer post time for NIXL KV Cache transfers.",
    ),
    Family(
        "vllm",
        "vllm:nixl_bytes_transferred",
        "histogram",
        ("engine", "model_name"),
        unit="bytes",
        help="Histogram of bytes transferred per NIXL KV Cache transfers.",
    ),
    Family(
        "vllm",
        "vllm:nixl_num_descriptors",
        "histogram",
        ("engine", "model_name"),
        unit="descriptors",
        help="Histogram of number of descriptors per NIXL  KV Cache transfers.",
    ),
    Family(
        "vllm",
        "vllm:nixl_num_failed_transfers_total",
        "counter",
        ("engine", "model_name"),
        unit="transfers",
        help="Number of failed NIXL KV Cache transfers, including handshake and notification failures. NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
    ),
    Family(
        "vllm",
        "vllm:nixl_num_failed_notifications_total",
        "counter",
        ("engine", "model_name"),
        unit="notifications",
        help="Number of failed NIXL KV Cache notifications. Retained for compatibility; these failures are also included in vllm:nixl_num_failed_transfers.",
    ),
    Family(
        "vllm",
        "vllm:nixl_num_kv_expired_reqs_total",
        "counter",
        ("engine", "model_name"),
        unit="requests",
        help="Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
    ),
    Family(
        "vllm",
        "vllm:nixl_num_notifications_after_expiry_total",
        "counter",
        ("engine", "model_name"),
        unit="notifications",
        help="Number of completion notifications for requests that were no longer tracked, usually because their KV lease expired. The KV blocks may have been reused before the transfer finished. Counted per notification (one per remote rank), not per request.",
    ),
    Family(
        "vllm",
        "vllm:estimated_flops_per_gpu_total",
        "counter",
        ("engine", "model_name"),
        unit="FLOPs",
        help="Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
        read_by="Roofline: achieved FLOP/s per GPU, MFU against the GPU sheet",
    ),
    Family(
        "vllm",
        "vllm:estimated_read_bytes_per_gpu_total",
        "counter",
        ("engine", "model_name"),
        unit="bytes",
        help="Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
        read_by="Roofline: bytes/s per GPU (with writes), MBU against the GPU sheet",
    ),
    Family(
        "vllm",
        "vllm:estimated_write_bytes_per_gpu_total",
        "counter",
        ("engine", "model_name"),
        unit="bytes",
        help="Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
        read_by="Roofline: bytes/s per GPU (with reads), MBU against the GPU sheet",
    ),
    # Speculative decoding (vllm/v1/spec_decode/metrics.py, SpecDecodingProm): exported by an
    # instance started with a speculative config, nothing else. A "draft" is one request's proposal
    # in one engine step; vLLM 0.32 adds no other family for the method in use (ngram, MTP, DSpark).
    Family(
        "vllm",
        "vllm:spec_decode_num_drafts_total",
        "counter",
        ("engine", "model_name"),
        unit="drafts",
        help="Number of spec decoding drafts.",
        meaning="Drafts proposed: one per request per engine step that drafted (docs/definitions.md, Speculative decoding).",
        read_by="Speculative decoding: mean acceptance length, per-position acceptance",
    ),
    Family(
        "vllm",
        "vllm:spec_decode_num_draft_tokens_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="Number of draft tokens.",
        read_by="Speculative decoding: acceptance rate, rejected drafts' share of decode compute",
    ),
    Family(
        "vllm",
        "vllm:spec_decode_num_accepted_tokens_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="Number of accepted tokens.",
        read_by="Live, DP ranks and Speculative decoding: acceptance length per pool and engine",
    ),
    Family(
        "vllm",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "counter",
        ("engine", "model_name", "position"),
        unit="tokens",
        help="Accepted tokens per draft position.",
        meaning="Drafts whose token at `position` (0-based) was accepted, with every token before it.",
        read_by="Speculative decoding: per-position acceptance",
    ),
    Family(
        "vllm",
        "vllm:num_requests_running",
        "gauge",
        ("engine", "model_name"),
        unit="requests",
        help="Number of requests in model execution batches.",
        read_by="Live: running requests",
    ),
    Family(
        "vllm",
        "vllm:num_requests_waiting",
        "gauge",
        ("engine", "model_name"),
        unit="requests",
        help="Number of requests waiting to be processed.",
        read_by="Live: waiting requests",
    ),
    Family(
        "vllm",
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        ("engine", "model_name", "reason"),
        unit="requests",
        help="Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    ),
    Family(
        "vllm",
        "vllm:num_requests_kv_fetch_by_stage",
        "gauge",
        ("engine", "model_name", "stage"),
        unit="requests",
        help="Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs an async KV load that has not started; 'in_progress' = load started and not yet reported finished; 'completed_waiting' = load finished, request not running yet.",
    ),
    Family(
        "vllm",
        "vllm:engine_sleep_state",
        "gauge",
        ("engine", "model_name", "sleep_state"),
        help="Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    ),
    Family(
        "vllm",
        "vllm:kv_cache_usage_perc",
        "gauge",
        ("engine", "model_name"),
        unit="ratio 0..1",
        help="KV-cache usage. 1 means 100 percent usage.",
        read_by="Live: KV-cache mean and max",
    ),
    Family(
        "vllm",
        "vllm:prefix_cache_queries_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="Prefix cache queries, in terms of number of queried tokens.",
    ),
    Family(
        "vllm",
        "vllm:prefix_cache_hits_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="Prefix cache hits, in terms of number of cached tokens.",
    ),
    Family(
        "vllm",
        "vllm:external_prefix_cache_queries_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
    ),
    Family(
        "vllm",
        "vllm:external_prefix_cache_hits_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
    ),
    Family(
        "vllm",
        "vllm:mm_cache_queries_total",
        "counter",
        ("engine", "model_name"),
        unit="items",
        help="Multi-modal cache queries, in terms of number of queried items.",
    ),
    Family(
        "vllm",
        "vllm:mm_cache_hits_total",
        "counter",
        ("engine", "model_name"),
        unit="items",
        help="Multi-modal cache hits, in terms of number of cached items.",
    ),
    Family(
        "vllm",
        "vllm:num_preemptions_total",
        "counter",
        ("engine", "model_name"),
        unit="preemptions",
        help="Cumulative number of preemption from the engine.",
    ),
    Family(
        "vllm",
        "vllm:prompt_tokens_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="Number of prefill tokens processed.",
        read_by="Live: prefill tokens/s per GPU (logical), rack",
    ),
    Family(
        "vllm",
        "vllm:prompt_tokens_by_source_total",
        "counter",
        ("engine", "model_name", "source"),
        unit="tokens",
        help="Number of prompt tokens by source.",
        read_by="Live: cached (`local_cache_hit`) part, computed = prompt − cached",
    ),
    Family(
        "vllm",
        "vllm:prompt_tokens_cached_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="Number of cached prompt tokens (local + external).",
    ),
    Family(
        "vllm",
        "vllm:prompt_tokens_cached_by_source_total",
        "counter",
        ("engine", "model_name", "source"),
        unit="tokens",
        help="Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
    ),
    Family(
        "vllm",
        "vllm:generation_tokens_total",
        "counter",
        ("engine", "model_name"),
        unit="tokens",
        help="Number of generation tokens processed.",
        read_by="Live: decode tokens/s per GPU, rack",
    ),
    Family(
        "vllm",
        "vllm:request_success_total",
        "counter",
        ("engine", "finished_reason", "model_name"),
        unit="requests",
        help="Count of successfully processed requests.",
    ),
    Family(
        "vllm",
        "vllm:admission_rejections_total",
        "counter",
        ("model_name", "reason"),
        unit="admission attempts",
        help="Number of admission attempts rejected by a queue limit, by reason.",
    ),
    Family(
        "vllm",
        "vllm:request_prompt_tokens",
        "histogram",
        ("engine", "model_name"),
        unit="tokens",
        help="Number of prefill tokens processed.",
    ),
    Family(
        "vllm",
        "vllm:request_generation_tokens",
        "histogram",
        ("engine", "model_name"),
        unit="tokens",
        help="Number of generation tokens processed.",
    ),
    Family(
        "vllm",
        "vllm:iteration_tokens_total",
        "histogram",
        ("engine", "model_name"),
        unit="tokens",
        help="Histogram of number of tokens per engine_step.",
    ),
    Family(
        "vllm",
        "vllm:request_max_num_generation_tokens",
        "histogram",
        ("engine", "model_name"),
        unit="tokens",
        help="Histogram of maximum number of requested generation tokens.",
    ),
    Family(
        "vllm",
        "vllm:request_params_n",
        "histogram",
        ("engine", "model_name"),
        help="Histogram of the n request parameter.",
    ),
    Family(
        "vllm",
        "vllm:request_params_max_tokens",
        "histogram",
        ("engine", "model_name"),
        unit="tokens",
        help="Histogram of the max_tokens request parameter.",
    ),
    Family(
        "vllm",
        "vllm:time_to_first_token_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of time to first token in seconds.",
        read_by="Live: TTFT p50/p90/p99 per pool",
    ),
    Family(
        "vllm",
        "vllm:inter_token_latency_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of inter-token latency in seconds.",
        read_by="Live: ITL p50/p90/p99 (decode)",
    ),
    Family(
        "vllm",
        "vllm:request_time_per_output_token_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of time_per_output_token_seconds per request.",
        read_by="Live: P90 per-user tokens/s (decode pool)",
    ),
    Family(
        "vllm",
        "vllm:e2e_request_latency_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of e2e request latency in seconds.",
    ),
    Family(
        "vllm",
        "vllm:request_queue_time_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of time spent in WAITING phase for request.",
    ),
    Family(
        "vllm",
        "vllm:request_inference_time_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of time spent in RUNNING phase for request.",
    ),
    Family(
        "vllm",
        "vllm:request_prefill_time_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of time spent in PREFILL phase for request.",
    ),
    Family(
        "vllm",
        "vllm:request_decode_time_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Histogram of time spent in DECODE phase for request.",
    ),
    Family(
        "vllm",
        "vllm:request_num_preemptions",
        "histogram",
        ("engine", "model_name"),
        unit="preemptions",
        help="Histogram of the number of times a request was preempted.",
    ),
    Family(
        "vllm",
        "vllm:request_prefill_kv_computed_tokens",
        "histogram",
        ("engine", "model_name"),
        unit="tokens",
        help="Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    ),
    Family(
        "vllm",
        "vllm:cache_config_info",
        "gauge",
        (
            "_block_size_resolved",
            "block_size",
            "cache_dtype",
            "cache_hit_alignment_tokens",
            "effective_attention_block_size",
            "enable_mamba_shared_prefix_checkpoint",
            "enable_prefix_caching",
            "engine",
            "gpu_memory_utilization",
            "hash_block_size",
            "is_attention_free",
            "kv_cache_dtype_skip_layers",
            "kv_cache_layout",
            "kv_cache_max_concurrency",
            "kv_cache_memory_bytes",
            "kv_cache_size_tokens",
            "kv_offloading_backend",
            "kv_offloading_size",
            "kv_sharing_fast_prefill",
            "mamba_block_size",
            "mamba_cache_dtype",
            "mamba_cache_mode",
            "mamba_page_size_padded",
            "mamba_ssm_cache_dtype",
            "num_cpu_blocks",
            "num_gpu_blocks",
            "num_gpu_blocks_override",
            "prefix_cache_retention_interval",
            "prefix_caching_hash_algo",
            "prefix_match_unit",
            "replayssm_buffer_len",
            "skip_page_size_padded",
            "sliding_window",
            "swa_bounded_replay",
            "use_kda_recoverssm",
            "use_replayssm",
            "user_specified_block_size",
        ),
        help="Information of the LLMEngine CacheConfig",
    ),
    # vllm-router 0.1.17 in --vllm-pd-disaggregation mode (it writes no HELP lines)
    Family(
        "router",
        "vllm_router_pd_prefill_errors_total",
        "counter",
        ("worker",),
        unit="requests",
        meaning="Prefill requests that failed, per prefill worker.",
    ),
    Family(
        "router",
        "vllm_router_prefix_routing_decisions_total",
        "counter",
        ("outcome", "policy", "stage"),
        unit="decisions",
        meaning="Cache-aware routing outcomes per stage.",
    ),
    Family(
        "router",
        "vllm_router_processed_requests_total",
        "counter",
        ("worker",),
        unit="requests",
        meaning="Requests sent to each worker.",
    ),
    Family(
        "router",
        "vllm_router_pd_requests_total",
        "counter",
        ("route",),
        unit="requests",
        meaning="PD requests per OpenAI route.",
    ),
    Family(
        "router",
        "vllm_router_pd_prefill_requests_total",
        "counter",
        ("worker",),
        unit="requests",
        meaning="Requests sent to each prefill worker.",
    ),
    Family(
        "router",
        "vllm_router_kv_routing_inputs_total",
        "counter",
        ("result", "transport"),
        unit="inputs",
        meaning="KV-aware routing inputs and their result.",
    ),
    Family(
        "router",
        "vllm_router_policy_decisions_total",
        "counter",
        ("policy", "worker"),
        unit="decisions",
        meaning="Routing policy decisions per worker.",
    ),
    Family(
        "router",
        "vllm_router_pd_decode_requests_total",
        "counter",
        ("worker",),
        unit="requests",
        meaning="Requests sent to each decode worker.",
    ),
    Family(
        "router",
        "vllm_router_pd_active_prefill_tokens",
        "gauge",
        ("rank", "worker"),
        unit="tokens",
        meaning="Prompt tokens being prefilled now, per prefill worker.",
    ),
    Family(
        "router",
        "vllm_router_pd_active_decode_requests",
        "gauge",
        ("rank", "worker"),
        unit="requests",
        meaning="Requests decoding now, per decode worker.",
    ),
    Family(
        "router",
        "vllm_router_worker_health",
        "gauge",
        ("worker",),
        meaning="1 when the router considers the worker healthy.",
    ),
    Family(
        "router",
        "vllm_router_pd_pending_decode_requests",
        "gauge",
        ("rank", "worker"),
        unit="requests",
        meaning="Requests waiting for the decode worker (KV hand-over).",
    ),
    Family(
        "router",
        "vllm_router_pd_prefill_occupancy",
        "gauge",
        ("rank", "worker"),
        unit="ratio 0..1",
        meaning="Share of the prefill worker busy.",
    ),
    Family(
        "router",
        "vllm_router_pd_unknown_prefill_requests",
        "gauge",
        ("rank", "worker"),
        unit="requests",
        meaning="Prefill requests the router lost track of.",
    ),
    Family(
        "router",
        "vllm_router_pd_decode_pending_seconds",
        "summary",
        (),
        unit="seconds",
        meaning="Time from prefill answer to decode start (quantiles over recent requests).",
    ),
    Family(
        "router",
        "vllm_router_pd_request_duration_seconds",
        "histogram",
        ("route",),
        unit="seconds",
        meaning="End-to-end PD request duration per route.",
    ),
    # dcgm-exporter, one per GPU tray (its default counters that the twin serves)
    Family(
        "dcgm",
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="MHz",
        help="SM clock frequency (in MHz).",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="MHz",
        help="Memory clock frequency (in MHz).",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="degrees C",
        help="Memory temperature (in C).",
        read_by="Live: GPU table (blank on GB300 → missing)",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="degrees C",
        help="GPU temperature (in C).",
        read_by="Live: GPU table",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="W",
        help="Power draw (in W).",
        read_by="Live: per-GPU and rack power",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="mJ",
        help="Total energy consumption since boot (in mJ).",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="percent",
        help="GPU utilization (in %).",
        read_by="Live: per-GPU utilisation",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="percent",
        help="Memory utilization (in %).",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        help="Value of the last XID error encountered.",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="MiB",
        help="Framebuffer memory free (in MiB).",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="MiB",
        help="Framebuffer memory used (in MiB).",
        read_by="Live: GPU table",
    ),
    Family(
        "dcgm",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        help="Total number of NVLink bandwidth counters for all lanes.",
    ),
    Family(
        "dcgm",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="ratio 0..1",
        help="Ratio of time the graphics engine is active.",
    ),
    Family(
        "dcgm",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="ratio 0..1",
        help="Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    Family(
        "dcgm",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        ("Hostname", "UUID", "device", "gpu", "modelName", "pci_bus_id"),
        unit="ratio 0..1",
        help="Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    # moemeter's vLLM plugin, which declares these itself (it runs inside vLLM, without moemeter):
    # tests/test_contract.py holds the two identical
    Family(
        "plugin",
        "moemeter_step_phase_seconds",
        "histogram",
        ("engine", "model_name", "phase"),
        unit="seconds",
        help="Engine-step time by phase: schedule, prepare_inputs, forward (device time), sample, update (scheduler output processing).",
        meaning="Time of each engine-step phase: `schedule` (Scheduler.schedule), `prepare_inputs` (the model runner's input preparation), `forward` (the model's forward pass: device time, from CUDA events on GPUs, wall time on CPU), `sample`, `update` (Scheduler.update_from_output). Buckets 0.1 ms .. 10 s.",
        read_by="CPU overhead: phases per engine and pool over time",
        where="moemeter vLLM plugin (every instance; the twin's too, from its `[overhead]` profile)",
    ),
    Family(
        "plugin",
        "moemeter_step_seconds",
        "histogram",
        ("engine", "model_name"),
        unit="seconds",
        help="Engine-step wall time (EngineCore.step); CPU overhead = this - forward.",
        meaning="Engine-step wall time (EngineCore.step). CPU overhead = step wall time − forward (definitions.md); device-idle fraction = 1 − forward / wall.",
        read_by="CPU overhead: overhead share, device-idle fraction",
    ),
    Family(
        "plugin",
        "moemeter_api_output_seconds",
        "histogram",
        ("model_name",),
        unit="seconds",
        help="API-server output handling per batch of engine outputs (OutputProcessor.process_outputs).",
        meaning="API-server handling of each batch of engine outputs (OutputProcessor.process_outputs: detokenising, streaming to clients).",
        read_by="CPU overhead",
        where="moemeter vLLM plugin (API server process)",
    ),
    Family(
        "plugin",
        "moemeter_expert_rank_tokens_total",
        "counter",
        ("engine", "layer", "model_name"),
        unit="tokens",
        help="Tokens routed to the experts on rank `engine` in MoE layer `layer` (top-k counted).",
        meaning="Tokens routed to the physical experts on rank `engine` in MoE layer `layer` (top-k counted: every token counts once per chosen expert); replicas of an expert share its tokens.",
        read_by="Experts: layer x rank heatmap, per-layer balancedness over time",
        where="moemeter vLLM plugin (on each EPLB instance; the twin's decode instance)",
    ),
    Family(
        "plugin",
        "moemeter_eplb_balancedness",
        "gauge",
        ("layer", "model_name"),
        unit="ratio 0..1",
        help="Mean over ranks / max over ranks of rank load since the last scrape, per MoE layer.",
        meaning="Mean over ranks / max over ranks of rank load in the last step window, per layer (definitions.md; vLLM's own log line averages over layers instead).",
        read_by="stored (the page recomputes it from the counter over any window)",
    ),
    Family(
        "plugin",
        "moemeter_eplb_rebalances_total",
        "counter",
        ("model_name",),
        unit="rebalances",
        help="EPLB rebalances performed (0 while EPLB is off).",
        meaning="EPLB rebalances performed.",
    ),
    Family(
        "plugin",
        "moemeter_eplb_last_rebalance_duration_seconds",
        "gauge",
        ("model_name",),
        unit="seconds",
        help="Wall time of the last rebalance.",
        meaning="Wall time of the last rebalance (weights moved between ranks).",
    ),
    Family(
        "plugin",
        "moemeter_eplb_last_rebalance_timestamp_seconds",
        "gauge",
        ("model_name",),
        unit="seconds since the Unix epoch",
        help="Unix time of the last rebalance; 0 before the first.",
        meaning="Unix time the last rebalance finished; 0 before the first.",
    ),
    Family(
        "plugin",
        "moemeter_expert_hot_share",
        "gauge",
        ("expert", "layer", "model_name", "position"),
        unit="ratio 0..1",
        help="The hottest experts since the last scrape and their share of their layer's tokens.",
        meaning="The hottest experts of the last step window (position 1..8 over all layers) and the share of their layer's tokens each took. Label values change as hot experts drift; at most 8 series at a time.",
    ),
    # moemeter's metering gateway (stack/gateway/metrics.py renders them from here)
    Family(
        "gateway",
        "moemeter_gateway_requests_total",
        "counter",
        ("outcome", "user"),
        unit="requests",
        help="Requests finished, by user and outcome.",
        meaning="Requests finished, by user and outcome (`ok`, or the error class: `bad_json`, `missing_model`, `unknown_model`, `body_too_large`, `unauthorized`, `upstream_unavailable`, `upstream_timeout`, `upstream_4xx`, `upstream_5xx`, `upstream_dropped`, `upstream_stream_error`, `client_disconnect`). At most `--max-user-labels` users (default 50) get their own label, in order of first traffic, kept for the process's life so counters never drop; later users count as `other`.",
        read_by="stored (the Users page reads the request feed)",
        where="moemeter metering gateway (`moemeter gateway`; the twin's `gateway` endpoint)",
    ),
    Family(
        "gateway",
        "moemeter_gateway_prompt_tokens_total",
        "counter",
        ("user",),
        unit="tokens",
        help="Prompt tokens (upstream usage), by user.",
        meaning="Prompt tokens, from the upstream's `usage`.",
    ),
    Family(
        "gateway",
        "moemeter_gateway_cached_prompt_tokens_total",
        "counter",
        ("user",),
        unit="tokens",
        help="Prompt tokens the upstream served from its prefix cache, by user.",
        meaning="Prompt tokens the upstream served from its prefix cache (`usage.prompt_tokens_details.cached_tokens`; vLLM reports it with `--enable-prompt-tokens-details`). Behind vllm-router in PD mode the usage comes from the decode instance, which counts its own cache hits, not the prefill pool's.",
    ),
    Family(
        "gateway",
        "moemeter_gateway_generation_tokens_total",
        "counter",
        ("user",),
        unit="tokens",
        help="Generated tokens (upstream usage, or chunks counted when it gave none), by user.",
        meaning="Generated tokens, from `usage`; when a stream ends without it (dropped, client gone), the token chunks delivered.",
    ),
    Family(
        "gateway",
        "moemeter_gateway_errors_total",
        "counter",
        ("class",),
        unit="requests",
        help="Failed requests by error class.",
        meaning="Failed requests by error class (the outcomes above other than `ok`).",
    ),
    Family(
        "gateway",
        "moemeter_gateway_ttft_seconds",
        "histogram",
        (),
        unit="seconds",
        help="Time to first token chunk, streams.",
        meaning="Request received to first token chunk, streams.",
    ),
    Family(
        "gateway",
        "moemeter_gateway_itl_mean_seconds",
        "histogram",
        (),
        unit="seconds",
        help="Per-request mean inter-token latency, streams.",
        meaning="Per-request mean inter-token latency, streams: (last token chunk − first) / (generated − 1).",
    ),
    Family(
        "gateway",
        "moemeter_gateway_request_duration_seconds",
        "histogram",
        (),
        unit="seconds",
        help="Request received to response end.",
    ),
    Family(
        "gateway",
        "moemeter_gateway_in_flight_requests",
        "gauge",
        (),
        unit="requests",
        help="Requests being served now.",
    ),
    Family(
        "gateway",
        "moemeter_gateway_records_pending",
        "gauge",
        (),
        unit="records",
        help="Request records not yet durable.",
        meaning="Request records queued but not yet durable in the request log (the feed shows only durable ones).",
    ),
    # prometheus_client's own families are stored as scraped; this one the warehouse reads
    Family(
        "process",
        "process_start_time_seconds",
        "gauge",
        (),
        unit="seconds since the Unix epoch",
        help="Start time of the process since unix epoch in seconds.",
        read_by="the warehouse: a counter reset's increase covers the time since the process started",
    ),
]

FAMILIES: dict[str, Family] = {f.name: f for f in _FAMILIES}
"""Every family moemeter reads or emits, by name."""


def family(name: str) -> Family:
    """The family `name` (as its TYPE line writes it); a counter's sample name finds it too."""
    return FAMILIES[name]


def of(source: str) -> list[Family]:
    return [f for f in _FAMILIES if f.source == source]


def markdown_table() -> str:
    """docs/metrics.md's table of families, generated from FAMILIES."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = [
        "| family (sample name) | source | type | unit | labels | meaning | read by |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in _FAMILIES:
        labels = ", ".join(f.labels) or "(none)"
        rows.append(
            f"| `{f.name}` | {cell(f.origin)} | {f.kind} | {f.unit or '—'} | {labels} | {cell(f.meaning or f.help)} "
            f"| {cell(f.read_by)} |"
        )
    return "\n".join(rows) + "\n"
