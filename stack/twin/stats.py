"""Plain state of what each simulated process would export: counters, gauges, histograms.

The model (model.py) writes these; exposition.py renders them. Nothing here knows about
Prometheus text. Arrays are indexed by data-parallel engine (vLLM's `engine` label).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moemeter.contract.families import STEP_PHASES

# The moemeter plugin's step-phase families: its own phases and buckets (pure Python, no vLLM).
from stack.vllm_plugin.moemeter_vllm_plugin.state import BUCKETS as STEP_BUCKETS

# vLLM 0.32 default bucket families (vllm/v1/metrics/buckets.py).
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
# NIXL connector histograms keep their own bounds (vllm/distributed/kv_transfer/.../nixl).
NIXL_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_TIME_BUCKETS = (0.001, *NIXL_XFER_TIME_BUCKETS)
NIXL_BYTES_BUCKETS = (
    2048,
    8192,
    32768,
    131072,
    524288,
    2097152,
    8388608,
    33554432,
    134217728,
    536870912,
    2147483648,
    8589934592,
)
NIXL_DESCRIPTORS_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's `request_tokens` family: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass
class Histogram:
    """Per-series histogram: non-cumulative counts, the last column is the +Inf overflow."""

    bounds: np.ndarray
    counts: np.ndarray
    sums: np.ndarray

    @classmethod
    def zeros(cls, bounds: tuple[float, ...] | list[float], series: int) -> Histogram:
        b = np.asarray(bounds, dtype=float)
        return cls(b, np.zeros((series, len(b) + 1)), np.zeros(series))

    def observe(self, series: np.ndarray | int, values: np.ndarray | float, weights: np.ndarray | float = 1.0) -> None:
        values = np.asarray(values, dtype=float)
        series = np.broadcast_to(np.asarray(series), values.shape)
        weights = np.broadcast_to(np.asarray(weights, dtype=float), values.shape)
        idx = np.searchsorted(self.bounds, values, side="left")
        width = self.counts.shape[1]
        flat = (series * width + idx).ravel()
        self.counts += np.bincount(flat, weights.ravel(), minlength=self.counts.size).reshape(self.counts.shape)
        self.sums += np.bincount(series.ravel(), (values * weights).ravel(), minlength=self.sums.size)

    def cumulative(self) -> np.ndarray:
        return np.cumsum(self.counts, axis=1)


HIST_BUCKET_FAMILY = {
    # vLLM family name -> vLLM bucket-family key (custom_histogram_buckets keys).
    "vllm:request_prompt_tokens": "request_tokens",
    "vllm:request_generation_tokens": "request_tokens",
    "vllm:iteration_tokens_total": "iteration_tokens",
    "vllm:request_max_num_generation_tokens": "request_tokens",
    "vllm:request_params_n": "request_params_n",
    "vllm:request_params_max_tokens": "request_tokens",
    "vllm:time_to_first_token_seconds": "time_to_first_token",
    "vllm:inter_token_latency_seconds": "inter_token_latency",
    "vllm:request_time_per_output_token_seconds": "inter_token_latency",
    "vllm:e2e_request_latency_seconds": "request_latency",
    "vllm:request_queue_time_seconds": "request_latency",
    "vllm:request_inference_time_seconds": "request_latency",
    "vllm:request_prefill_time_seconds": "request_latency",
    "vllm:request_decode_time_seconds": "request_latency",
    "vllm:request_num_preemptions": "request_num_preemptions",
    "vllm:request_prefill_kv_computed_tokens": "request_tokens",
}
NIXL_HISTOGRAMS = {
    "vllm:nixl_xfer_time_seconds": NIXL_XFER_TIME_BUCKETS,
    "vllm:nixl_post_time_seconds": NIXL_POST_TIME_BUCKETS,
    "vllm:nixl_bytes_transferred": NIXL_BYTES_BUCKETS,
    "vllm:nixl_num_descriptors": NIXL_DESCRIPTORS_BUCKETS,
}


def family_buckets(family_key: str, max_model_len: int, custom: dict[str, list[float]]) -> tuple[float, ...]:
    """Bucket bounds vLLM 0.32 uses for a family key, honouring --custom-histogram-buckets."""
    if family_key in custom:
        return tuple(custom[family_key])
    defaults = {
        "request_latency": REQUEST_LATENCY_BUCKETS,
        "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
        "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS,
        "iteration_tokens": ITERATION_TOKENS_BUCKETS,
        "request_params_n": REQUEST_PARAMS_N_BUCKETS,
        "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
    }
    if family_key == "request_tokens":
        return build_1_2_5_buckets(max_model_len)
    return tuple(float(b) for b in defaults[family_key])


COUNTERS = (
    "prompt_tokens",
    "prompt_local_compute",
    "prompt_local_cache_hit",
    "prompt_external_kv_transfer",
    "cached_device",
    "cached_p2p",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "external_prefix_cache_queries",
    "external_prefix_cache_hits",
    "generation_tokens",
    "success_stop",
    "success_length",
    "success_abort",
    "success_error",
    "num_preemptions",
    "estimated_flops",
    "estimated_read_bytes",
    "estimated_write_bytes",
    "nixl_failed_transfers",
)
GAUGES = (
    "running",
    "waiting",
    "waiting_capacity",
    "waiting_deferred",
    "kv_fetch_waiting",
    "kv_fetch_in_progress",
    "kv_fetch_completed_waiting",
    "kv_cache_usage",
)


@dataclass
class InstanceStats:
    """Everything one vLLM API server exports, for its `dp` engines."""

    name: str
    role: str
    dp: int
    histograms: dict[str, Histogram]
    counters: dict[str, np.ndarray] = field(default_factory=dict)
    gauges: dict[str, np.ndarray] = field(default_factory=dict)
    http_requests: float = 0.0
    created: float = 0.0
    phases: dict[str, Histogram] = field(default_factory=dict)  # STEP_PHASES and "step" (wall), per engine
    api_output: Histogram = field(default_factory=lambda: Histogram.zeros(STEP_BUCKETS, 1))

    @classmethod
    def new(
        cls, name: str, role: str, dp: int, max_model_len: int, custom: dict[str, list[float]], created: float
    ) -> InstanceStats:
        hists = {
            fam: Histogram.zeros(family_buckets(key, max_model_len, custom), dp)
            for fam, key in HIST_BUCKET_FAMILY.items()
        }
        hists.update({fam: Histogram.zeros(b, dp) for fam, b in NIXL_HISTOGRAMS.items()})
        return cls(
            name=name,
            role=role,
            dp=dp,
            histograms=hists,
            counters={c: np.zeros(dp) for c in COUNTERS},
            gauges={g: np.zeros(dp) for g in GAUGES},
            created=created,
            phases={p: Histogram.zeros(STEP_BUCKETS, dp) for p in (*STEP_PHASES, "step")},
        )

    def rows(self, name: str, dp: int, first: int) -> InstanceStats:
        """An instance whose `dp` engines are this one's engines `first` on: its counters, gauges and
        histograms are views of these, so the model can update a whole pool's instances at once."""

        def part(h: Histogram) -> Histogram:
            return Histogram(h.bounds, h.counts[first : first + dp], h.sums[first : first + dp])

        return InstanceStats(
            name=name,
            role=self.role,
            dp=dp,
            histograms={fam: part(h) for fam, h in self.histograms.items()},
            counters={c: a[first : first + dp] for c, a in self.counters.items()},
            gauges={g: a[first : first + dp] for g, a in self.gauges.items()},
            created=self.created,
            phases={p: part(h) for p, h in self.phases.items()},
        )


@dataclass
class RouterStats:
    """What vllm-router 0.1.17 in PD mode exports."""

    prefill_urls: list[str]
    decode_urls: list[str]
    routes: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions")
    requests_by_route: dict[str, float] = field(default_factory=dict)
    prefill_requests: dict[str, float] = field(default_factory=dict)
    decode_requests: dict[str, float] = field(default_factory=dict)
    active_prefill_tokens: dict[str, float] = field(default_factory=dict)
    active_decode_requests: dict[str, float] = field(default_factory=dict)
    pending_decode_requests: dict[str, float] = field(default_factory=dict)
    prefill_occupancy: dict[str, float] = field(default_factory=dict)
    decode_pending_recent: np.ndarray = field(default_factory=lambda: np.zeros(0))
    decode_pending_sum: float = 0.0
    decode_pending_count: float = 0.0
    duration: Histogram | None = None

    ROUTER_DURATION_BUCKETS = (
        0.001,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        15,
        30,
        45,
        60,
        90,
        120,
        180,
        240,
    )

    def __post_init__(self) -> None:
        for url in self.prefill_urls + self.decode_urls:
            for d in (self.prefill_requests, self.decode_requests):
                d.setdefault(url, 0.0)
        for r in self.routes:
            self.requests_by_route.setdefault(r, 0.0)
        self.duration = Histogram.zeros(self.ROUTER_DURATION_BUCKETS, len(self.routes))


@dataclass
class GpuStats:
    """One GPU as dcgm-exporter sees it."""

    index: int
    uuid: str
    pci_bus_id: str
    util: float = 0.0
    tensor_active: float = 0.0
    dram_active: float = 0.0
    power_watts: float = 0.0
    energy_mj: float = 0.0
    fb_used_mib: float = 0.0
    temp_c: float = 30.0
    nvlink_bytes: float = 0.0
