"""Typed settings of the rack twin: model, topology, workload and performance model.

A profile is a TOML file under ``stack/twin/profiles/`` whose tables map one to one onto
the dataclasses below. Every field carries a one-line docstring with its unit;
``tests/test_docs.py`` fails if one is missing.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moemeter.contract.errors import MoemeterError

PROFILE_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "deepseek-v4.1-flash"


class ProfileError(MoemeterError, ValueError):
    """A profile file is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class ModelSpec:
    name: str = "deepseek-ai/DeepSeek-V4.1-Flash"
    """Model name served by every vLLM instance (the `model_name` label)."""
    num_layers: int = 40
    """Transformer layers in the whole model."""
    prefill_layers: int = 20
    """Layers the prefill instances run (the encoder half); equals num_layers when prefill runs all."""
    routed_experts: int = 384
    """Routed experts per MoE layer."""
    shared_experts: int = 1
    """Shared experts per MoE layer (run for every token)."""
    top_k: int = 6
    """Routed experts chosen per token."""
    hash_routed_layers: int = 0
    """Leading MoE layers routed by a hash of the token id instead of the gate."""
    kv_bytes_per_token: int = 890
    """Global KV-cache bytes per token (all layers), what a PD transfer moves per prompt token."""
    max_model_len: int = 1_048_576
    """Longest context in tokens (vLLM's `request_tokens` histogram buckets stop here)."""
    active_params_billion: float = 13.0
    """Parameters active per token, in billions (for the FLOP estimate)."""


@dataclass(frozen=True)
class TopologySpec:
    gpus_per_tray: int = 4
    """GPUs in one compute tray (one GPU exporter per tray)."""
    trays: int = 18
    """Compute trays in the rack."""
    gpu_model: str = "NVIDIA GB300"
    """GPU model name, as dcgm-exporter's `modelName` label shows it."""
    gpu_memory_mib: int = 288 * 1024
    """HBM per GPU in MiB."""
    gpu_power_idle_watts: float = 180.0
    """Power draw of an idle GPU in watts."""
    gpu_power_max_watts: float = 1400.0
    """Power draw of a fully busy GPU in watts."""
    prefill_instances: int = 4
    """Prefill vLLM instances (each one API server)."""
    prefill_dp: int = 2
    """Data-parallel engines (one GPU each) per prefill instance ("DEP2" = 2)."""
    decode_instances: int = 1
    """Decode vLLM instances."""
    decode_dp: int = 64
    """Data-parallel engines (one GPU each) per decode instance (Wide-EP)."""
    eplb_redundant_experts: int = 64
    """Redundant expert slots the decode instance's EPLB adds over the routed experts."""

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_tray * self.trays

    @property
    def prefill_gpus(self) -> int:
        return self.prefill_instances * self.prefill_dp

    @property
    def decode_gpus(self) -> int:
        return self.decode_instances * self.decode_dp


@dataclass(frozen=True)
class WorkloadSpec:
    agents: int = 3500
    """Concurrent agent sessions (closed loop: each waits for its answer, thinks, asks again)."""
    users: int = 600
    """Distinct users the agents belong to."""
    system_prompt_tokens: int = 12_000
    """Shared system prompt and tool schema at the start of every session (prefix-cached)."""
    first_turn_tokens: int = 3_000
    """Mean new tokens of a session's first user turn."""
    turn_tokens_mean: int = 3_000
    """Mean new tokens (tool output, user text) appended per later turn."""
    output_tokens_mean: int = 700
    """Mean generated tokens per turn."""
    turns_per_session_mean: float = 30.0
    """Mean turns before a session ends and the agent starts a new one."""
    think_seconds_mean: float = 1.8
    """Mean pause between an answer and the next turn (tool execution), seconds."""
    max_context_tokens: int = 240_000
    """A session ends when its context would pass this many tokens."""
    prefix_cache_keep: float = 0.995
    """Share of a session's previous context still in the prefill prefix cache at its next turn."""


@dataclass(frozen=True)
class PerformanceSpec:
    decode_step_base_seconds: float = 0.0028
    """Decode step time at batch 1 with an empty context (launch, all-to-all latency), without the
    draft stage's passes and the drafts' verification (SpeculativeSpec), seconds."""
    decode_step_per_request_seconds: float = 0.000075
    """Extra decode step time per request in the largest rank batch, for its one bonus position
    (each verified draft adds SpeculativeSpec.verify_cost of it), seconds."""
    decode_step_per_context_token_seconds: float = 2.5e-10
    """Extra decode step time per context token held by the busiest rank (KV reads), seconds."""
    decode_speed_jitter: float = 0.05
    """Log-normal sigma of a request's own speed factor (sampling, stop checks; acceptance is drawn apart)."""
    prefill_tokens_per_second: float = 5.5e5
    """Computed prompt tokens one prefill engine (GPU) processes per second: for V4.1-Flash's 13B
    active parameters over its 20 prefill layers, 37% of a GB300's dense FP4 peak while busy, within
    2x of the 19% published DeepSeek-V3 prefill reaches on GB200 (tests/stack/twin/test_physics.py)."""
    prefill_step_base_seconds: float = 0.002
    """Fixed time of one prefill pass, seconds."""
    prefill_per_cached_token_seconds: float = 2.0e-9
    """Attention time per cached context token read during prefill, seconds."""
    kv_transfer_bandwidth_bytes_per_second: float = 2.0e11
    """Effective NIXL KV-transfer bandwidth between a prefill and a decode GPU, bytes/s."""
    kv_transfer_latency_seconds: float = 0.0006
    """Fixed cost of one NIXL KV transfer (handshake, descriptor post), seconds."""
    decode_kv_capacity_tokens: int = 6_000_000
    """KV-cache capacity of one decode engine in tokens (kv_cache_usage_perc denominator)."""
    prefill_kv_capacity_tokens: int = 60_000_000
    """Prefix-cache capacity of one prefill engine in tokens."""


WORKLOAD_CLASSES = ("tool_call", "code", "text")
"""The turns an agent takes, in the order SpeculativeSpec's per-class lists give them."""


@dataclass(frozen=True)
class SpeculativeSpec:
    """The decode engines' draft path (vLLM's SpeculativeConfig): each engine step a request drafts
    `num_speculative_tokens` tokens and the target model verifies them with one more position, the
    bonus token. A request's acceptance is drawn once, from its turn's class: each drafted token is
    accepted with probability p (given every token before it was), p drawn from a Beta with the
    class's mean and `acceptance_concentration`."""

    method: str = "dspark"
    """vLLM's SpeculativeConfig.method: dspark (V4.1's draft stages), mtp (V4), or none."""
    num_speculative_tokens: int = 3
    """Tokens drafted per request per step (the launch profile's num_speculative_tokens)."""
    class_shares: tuple[float, ...] = (0.35, 0.35, 0.30)
    """Share of turns of each class of WORKLOAD_CLASSES (tool call, code, free text)."""
    class_acceptance: tuple[float, ...] = (0.86, 0.80, 0.58)
    """Mean per-token conditional acceptance p of each class: tool calls and code repeat their
    context and accept more than free text."""
    acceptance_concentration: float = 30.0
    """Beta concentration (a + b) of a request's p around its class mean: higher, less spread."""
    verify_cost: float = 0.35
    """Decode step time each verified draft position adds per request, as a share of a step's
    per-request time (the draft tokens ride in the same forward pass, mostly bandwidth-bound)."""
    draft_pass_seconds: float = 0.00012
    """Time of one pass of the draft stage per step (k passes a step), seconds."""
    collapsed_acceptance: float = 0.15
    """p on an engine under the `draft-collapse` fault (a draft stage out of step with the target)."""

    @property
    def enabled(self) -> bool:
        return self.method != "none" and self.num_speculative_tokens > 0


@dataclass(frozen=True)
class EplbSpec:
    expert_groups: int = 8
    """Expert groups of the model's router (vLLM's EPLB packs groups to nodes when they divide)."""
    nodes: int = 16
    """Hosts the decode instance spans (GB300 trays); EPLB's hierarchical policy needs groups divisible by it."""
    policy: str = "vllm"
    """Placement policy the decode instance's EPLB uses: vllm or refined."""
    rebalance_interval_seconds: float = 300.0
    """Time between EPLB rebalances of the decode instance, seconds."""
    window_seconds: float = 120.0
    """Load window a rebalance plans on, seconds."""
    skew_min: float = 0.55
    """Smallest Zipf exponent of a layer's expert popularity (layers differ in skew)."""
    skew_max: float = 1.25
    """Largest Zipf exponent of a layer's expert popularity."""
    drift_per_minute: float = 0.05
    """Standard deviation of a gated layer's log-popularity random walk per minute (hot experts drift)."""
    vocabulary: int = 129_280
    """Token vocabulary; hash-routed layers send token t to expert hash(t) mod experts."""
    token_zipf: float = 1.05
    """Zipf exponent of token frequency, which sets the skew of hash-routed layers."""
    expert_bytes: int = 12_582_912
    """Weight bytes of one routed expert (what a rebalance moves per relocated replica)."""
    migration_bytes_per_second: float = 4.0e11
    """NVLink bandwidth a rebalance moves expert weights at, bytes/s."""


@dataclass(frozen=True)
class OverheadSpec:
    """How an engine step's wall time splits into phases (the moemeter plugin's step-phase
    families); the forward pass (device time) takes the rest."""

    schedule_fraction: float = 0.035
    """Share of step wall time in Scheduler.schedule."""
    prepare_inputs_fraction: float = 0.06
    """Share in the model runner's input preparation (host-side tensors, metadata)."""
    sample_fraction: float = 0.025
    """Share in sampling."""
    update_fraction: float = 0.04
    """Share in Scheduler.update_from_output (output processing in the engine core)."""
    api_output_seconds: float = 0.0003
    """API-server output handling per batch of engine outputs, seconds."""

    def forward_fraction(self) -> float:
        return 1.0 - (
            self.schedule_fraction + self.prepare_inputs_fraction + self.sample_fraction + self.update_fraction
        )


@dataclass(frozen=True)
class TwinProfile:
    name: str
    """Profile name (file stem)."""
    description: str
    """One line saying what the profile models."""
    model: ModelSpec = field(default_factory=ModelSpec)
    """The served model."""
    topology: TopologySpec = field(default_factory=TopologySpec)
    """Rack and instance layout."""
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    """The AgentX-like workload."""
    performance: PerformanceSpec = field(default_factory=PerformanceSpec)
    """Step-time and transfer model."""
    eplb: EplbSpec = field(default_factory=EplbSpec)
    """Expert routing and the decode instance's EPLB."""
    overhead: OverheadSpec = field(default_factory=OverheadSpec)
    """Engine-step phases (CPU overhead) as the moemeter plugin measures them."""
    speculative: SpeculativeSpec = field(default_factory=SpeculativeSpec)
    """The decode engines' draft path."""
    custom_histogram_buckets: dict[str, list[float]] = field(default_factory=dict)
    """vLLM `--custom-histogram-buckets` the stack profile sets (family -> upper bounds, seconds)."""

    def with_workload(self, **changes: Any) -> TwinProfile:
        return dataclasses.replace(self, workload=dataclasses.replace(self.workload, **changes))


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in table.items()})


def load_profile(name_or_path: str) -> TwinProfile:
    """Load a profile by name (from PROFILE_DIR) or by path to a TOML file."""
    path = Path(name_or_path)
    if path.suffix != ".toml" and "/" not in name_or_path:
        path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
        raise ProfileError(f"no twin profile {name_or_path!r}; available: {available}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from exc
    sections = {
        "model": ModelSpec,
        "topology": TopologySpec,
        "workload": WorkloadSpec,
        "performance": PerformanceSpec,
        "eplb": EplbSpec,
        "overhead": OverheadSpec,
        "speculative": SpeculativeSpec,
    }
    kwargs: dict[str, Any] = {"name": data.pop("name", path.stem), "description": data.pop("description", "")}
    for key, cls in sections.items():
        kwargs[key] = _build(cls, data.pop(key, {}), f"{path}: [{key}]")
    buckets = data.pop("custom_histogram_buckets", {})
    if data:
        raise ProfileError(f"{path}: unknown top-level keys {sorted(data)}")
    for family, bounds in buckets.items():
        if not bounds or any(b <= 0 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise ProfileError(f"{path}: custom_histogram_buckets[{family!r}] must be positive and increasing")
    kwargs["custom_histogram_buckets"] = {k: [float(b) for b in v] for k, v in buckets.items()}
    profile = TwinProfile(**kwargs)
    fractions = dataclasses.astuple(profile.overhead)[:4]
    if any(f < 0 for f in fractions) or profile.overhead.forward_fraction() <= 0:
        raise ProfileError(f"{path}: [overhead] fractions must be non-negative and leave time for the forward pass")
    _check_speculative(profile.speculative, path)
    if profile.eplb.policy not in ("vllm", "refined"):
        raise ProfileError(f"{path}: [eplb] policy must be vllm or refined, got {profile.eplb.policy!r}")
    topo = profile.topology
    if topo.prefill_gpus + topo.decode_gpus > topo.total_gpus:
        raise ProfileError(
            f"{path}: {topo.prefill_gpus} prefill + {topo.decode_gpus} decode GPUs exceed the rack's {topo.total_gpus}"
        )
    return profile


SPECULATIVE_METHODS = ("dspark", "mtp", "none")


def _check_speculative(spec: SpeculativeSpec, path: Path) -> None:
    where = f"{path}: [speculative]"
    if spec.method not in SPECULATIVE_METHODS:
        raise ProfileError(f"{where} method must be one of {', '.join(SPECULATIVE_METHODS)}, got {spec.method!r}")
    if not 0 <= spec.num_speculative_tokens <= 16:
        raise ProfileError(f"{where} num_speculative_tokens must be 0..16, got {spec.num_speculative_tokens}")
    n = len(WORKLOAD_CLASSES)
    if len(spec.class_shares) != n or len(spec.class_acceptance) != n:
        raise ProfileError(f"{where} class_shares and class_acceptance need one value per class of {WORKLOAD_CLASSES}")
    if any(s < 0 for s in spec.class_shares) or not math.isclose(sum(spec.class_shares), 1.0, abs_tol=1e-6):
        raise ProfileError(f"{where} class_shares must be non-negative and add up to 1")
    probabilities = (*spec.class_acceptance, spec.collapsed_acceptance)
    if any(not 0 < p < 1 for p in probabilities):
        raise ProfileError(f"{where} acceptance probabilities must lie strictly between 0 and 1")
    if spec.acceptance_concentration <= 0 or spec.verify_cost < 0 or spec.draft_pass_seconds < 0:
        raise ProfileError(
            f"{where} acceptance_concentration must be positive, verify_cost and draft_pass_seconds not negative"
        )
