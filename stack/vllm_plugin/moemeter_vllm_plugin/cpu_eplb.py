"""What vLLM 0.32 lacks to run its own EPLB on a CPU (docs/metrics.md, "EPLB on CPU").

Applied by the plugin in every vLLM process on the CPU platform, and only there; each patch is
named here and logged once at start. They add what vLLM implements only for GPUs; none changes
vLLM's EPLB itself (its state, its policy, its rearrangement and weight transfer run as they are):

1. `platform-check`: `ParallelConfig` refuses `--enable-eplb` off CUDA, ROCm and XPU. The CPU
   platform answers "CUDA-like" to that one check (the only platform question it asks).
2. `gatherv`: the CPU communicator has no `all_gatherv` / `reduce_scatterv`, which DP + EP's
   all-gather/reduce-scatter all2all calls at every MoE layer. Here: padded all-gather and an
   all-reduce then this rank's rows, over gloo.
3. `eplb-state`: the CPU model runner's `load_model` never builds an `EplbState` (the GPU
   runner's does). Built here the same way, after the model is loaded, and, for vLLM's default
   async EPLB, its worker thread started as the GPU runner starts it.
4. `map-and-record`: on CPU vLLM's logical-to-physical expert mapping is the identity (the
   mapping and load recording exist only as a Triton kernel). Here: the same computation in
   torch (replica chosen by the same Knuth hash of the token index; load counted per physical
   expert while vLLM asks to record).
5. `events`: `torch.Event` does not exist on CPU; `EplbState` makes one at start and
   `rearrange` times itself with them. Here: wall-clock events (on CPU the wall time is the
   engine's pause), and a no-op stream for the gloo weight transfer's stream synchronisation.
6. `local-experts`: the CPU fused-MoE kernel ignores the expert map and indexes its local
   weights by global expert id. Here: ids mapped to this rank's local experts; tokens routed to
   another rank's experts get weight 0 (that rank adds their share in the reduce-scatter).
7. `async-worker`: async EPLB's worker thread makes an accelerator stream, and its hand-over
   (`CpuGpuEvent`) pairs a thread event with a `torch.Event`; a CPU has neither. Here: the worker
   runs vLLM's own `transfer_run_periodically` on a no-op stream (on CPU every copy is done when
   it returns), and the hand-over keeps only its thread event.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("vllm.moemeter_plugin")
KNUTH_MULTIPLIER = 2654435769  # vLLM's replica hash: floor(2^32 / phi)
MARK = "__moemeter_cpu_eplb__"  # apart from hooks.py's mark: both wrap EplbState.rearrange
_applied: list[str] = []


def apply() -> list[str]:
    """Apply every patch once; returns their names (empty off the CPU platform)."""
    from vllm.platforms import current_platform

    if _applied or not current_platform.is_cpu():
        return list(_applied)
    for name, patch in PATCHES:
        patch()
        _applied.append(name)
    log.info("moemeter plugin: EPLB on CPU patches applied: %s", ", ".join(_applied))
    return list(_applied)


def _once(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
    if original is None:
        original = getattr(owner, name)
    if getattr(original, MARK, False):
        return
    replacement = make(original)
    setattr(replacement, MARK, True)
    setattr(owner, name, replacement)


# 1 ------------------------------------------------------------------ platform-check
def _platform_check() -> None:
    from vllm.platforms.cpu import CpuPlatform

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def is_cuda_alike(self: Any) -> bool:
            if sys._getframe(1).f_code.co_name == "_validate_parallel_config":
                return True
            return original(self)

        return is_cuda_alike

    _once(CpuPlatform, "is_cuda_alike", make)


# 2 ------------------------------------------------------------------ gatherv
def all_gatherv(self: Any, input_: Any, dim: int = 0, sizes: list[int] | None = None) -> Any:
    """Rank r's `sizes[r]` rows of each input, concatenated over ranks in rank order (dim 0)."""
    import torch

    if dim != 0:
        raise NotImplementedError("only dim 0 all-gatherv is supported")
    world = self.world_size

    def one(t: Any) -> Any:
        rows = sizes or [t.shape[0]] * world
        if t.shape[0] != rows[self.rank_in_group]:
            raise ValueError(f"all_gatherv: {t.shape[0]} rows here, sizes say {rows[self.rank_in_group]}")
        top = max(rows)
        padded = t.new_zeros((top, *t.shape[1:]))
        padded[: t.shape[0]] = t
        out = t.new_empty((world * top, *t.shape[1:]))
        torch.distributed.all_gather_into_tensor(out, padded.contiguous(), group=self.device_group)
        return torch.cat([out[r * top : r * top + n] for r, n in enumerate(rows)])

    return [one(t) for t in input_] if isinstance(input_, list | tuple) else one(input_)


def reduce_scatterv(self: Any, input_: Any, dim: int = -1, sizes: list[int] | None = None) -> Any:
    """The sum over ranks of `input_`, this rank's `sizes[rank]` rows of it (gloo has no
    reduce-scatter: an all-reduce, then the slice)."""
    import torch

    if dim < 0:
        dim += input_.dim()
    world = self.world_size
    t = input_.movedim(0, dim).contiguous() if dim else input_.clone()
    rows = sizes or [t.shape[0] // world] * world
    if sum(rows) != t.shape[0]:
        raise ValueError(f"reduce_scatterv: {t.shape[0]} rows, sizes {rows}")
    torch.distributed.all_reduce(t, group=self.device_group)
    start = sum(rows[: self.rank_in_group])
    mine = t[start : start + rows[self.rank_in_group]]
    return (mine.movedim(0, dim) if dim else mine).contiguous()


def _gatherv() -> None:
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    _once(CpuCommunicator, "all_gatherv", lambda original: all_gatherv)
    _once(CpuCommunicator, "reduce_scatterv", lambda original: reduce_scatterv)


# 3 ------------------------------------------------------------------ eplb-state
def _eplb_state() -> None:
    from vllm.v1.worker import cpu_model_runner
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if not self.parallel_config.enable_eplb:
                return
            from vllm.distributed.eplb.eplb_state import EplbState
            from vllm.model_executor.models.interfaces import get_mixture_of_experts_model

            self._moe_model = get_mixture_of_experts_model(self.model)
            if self._moe_model is None:
                return
            with cpu_model_runner._torch_cuda_wrapper():  # its CpuGpuEvent makes a torch.Event
                self.eplb_state = EplbState(self.parallel_config, self.device)
            self.eplb_state.add_model(self._moe_model, self.model_config)
            if self.eplb_state.is_async:
                self.eplb_state.start_async_loop()  # as GPUModelRunner.load_model does

        return load_model

    _once(CPUModelRunner, "load_model", make)


# 4 ------------------------------------------------------------------ map-and-record
def map_to_physical_and_record(
    topk_ids: Any,
    expert_load_view: Any,
    logical_to_physical_map: Any,
    logical_replica_count: Any,
    record_enabled: Any,
    num_unpadded_tokens: Any = None,
) -> Any:
    """vLLM's `_eplb_map_and_record_i32_kernel` (fused_moe/router/base_router.py) in torch."""
    import torch

    if topk_ids.numel() == 0:
        return topk_ids
    k = topk_ids.shape[-1]
    ids = topk_ids.reshape(-1).to(torch.int64)
    valid = (ids >= 0) & (ids < logical_replica_count.shape[0])
    safe = torch.where(valid, ids, 0)
    replicas = torch.where(valid, logical_replica_count[safe], 1).clamp_min(1)
    position = torch.arange(ids.numel(), device=ids.device)
    hashed = ((position // k) * KNUTH_MULTIPLIER) & 0xFFFFFFFF
    physical = torch.where(valid, logical_to_physical_map[safe, hashed % replicas], -1)
    if bool(record_enabled):
        keep = (physical >= 0) & (physical < expert_load_view.shape[0])
        if num_unpadded_tokens is not None:
            keep &= position < int(num_unpadded_tokens) * k
        hits = physical[keep]
        expert_load_view.scatter_add_(0, hits, torch.ones_like(hits, dtype=expert_load_view.dtype))
    return physical.to(topk_ids.dtype).reshape(topk_ids.shape)


def _map_and_record() -> None:
    from vllm.model_executor.layers.fused_moe.router import base_router

    _once(base_router, "eplb_map_to_physical_and_record", lambda original: map_to_physical_and_record)


# 5 ------------------------------------------------------------------ events
class WallClockEvent:
    """torch.Event's timing interface on the host clock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: WallClockEvent) -> float:
        return ((end.at or 0.0) - (self.at or 0.0)) * 1000.0


class _NoStream:
    def synchronize(self) -> None:
        return None


@contextlib.contextmanager
def wall_clock_events() -> Iterator[None]:
    import torch

    event, current_stream = torch.Event, torch.accelerator.current_stream
    torch.Event = WallClockEvent  # type: ignore[misc,assignment]
    torch.accelerator.current_stream = lambda *a, **k: _NoStream()  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.Event = event  # type: ignore[misc]
        torch.accelerator.current_stream = current_stream


def _events() -> None:
    from vllm.distributed.eplb.eplb_state import EplbState

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def rearrange(self: Any, *args: Any, **kwargs: Any) -> Any:
            with wall_clock_events():
                return original(self, *args, **kwargs)

        return rearrange

    _once(EplbState, "rearrange", make)


# 6 ------------------------------------------------------------------ local-experts
def to_local(topk_ids: Any, topk_weights: Any, expert_map: Any) -> tuple[Any, Any]:
    """Global physical ids -> this rank's local ids; weight 0 where the expert is elsewhere."""
    import torch

    local = expert_map[topk_ids.to(torch.int64)]
    here = local >= 0
    return torch.where(here, local, 0).to(topk_ids.dtype), torch.where(here, topk_weights, 0).to(topk_weights.dtype)


def _local_experts() -> None:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def apply(self: Any, output: Any, hidden_states: Any, w1: Any, w2: Any, topk_weights: Any, topk_ids: Any,
                  activation: Any, global_num_experts: int, expert_map: Any, *args: Any, **kwargs: Any) -> Any:  # fmt: skip
            if expert_map is not None:
                topk_ids, topk_weights = to_local(topk_ids, topk_weights, expert_map)
            return original(
                self, output, hidden_states, w1, w2, topk_weights, topk_ids,
                activation, global_num_experts, expert_map, *args, **kwargs,
            )  # fmt: skip

        return apply

    _once(CPUUnquantizedExperts, "apply", make)


# 7 ------------------------------------------------------------------ async-worker
@contextlib.contextmanager
def device_stream(stream: Any) -> Iterator[None]:
    """vLLM's `eplb_utils.device_stream`, a no-op for the host's stream."""
    if stream is None or isinstance(stream, _NoStream):
        yield
        return
    with _device_stream(stream):
        yield


_device_stream: Any = None  # vLLM's, for any other stream


def _host_event_init(self: Any) -> None:
    self._event = WallClockEvent()
    self._recorded = threading.Event()


def _host_event_record(self: Any, stream: Any = None) -> None:
    """`CpuGpuEvent.record` without a device event (the check it makes, kept)."""
    if self._recorded.is_set():
        raise RuntimeError("CpuGpuEvent.record() called before the previous event was consumed by wait()")
    self._event = WallClockEvent()
    self._event.record()
    self._recorded.set()


def _host_event_wait(self: Any, stream: Any = None) -> None:
    self._recorded.wait()
    self._recorded.clear()


def start_async_worker(state: Any, is_profile: bool = False) -> threading.Thread:
    """vLLM's `async_worker.start_async_worker` with the host's stream for the accelerator's."""
    from vllm.distributed.eplb import async_worker

    def target() -> None:
        try:
            async_worker.transfer_run_periodically(state=state, stream=_NoStream(), is_profile=is_profile)
        except Exception:  # as vLLM's own thread does: logged, the engine goes on
            log.exception("moemeter plugin: async EPLB worker failed")

    thread = threading.Thread(target=target, name="eplb-async-worker", daemon=True)
    thread.start()
    return thread


def _replacement(method: Callable[..., None], original: Any) -> Callable[..., None]:
    return method


def _async_worker() -> None:
    global _device_stream
    from vllm.distributed.eplb import async_worker, eplb_communicator, eplb_state, eplb_utils, rebalance_execute

    if _device_stream is None:
        _device_stream = eplb_utils.device_stream
    for module in (eplb_utils, async_worker, eplb_communicator, rebalance_execute):
        module.device_stream = device_stream  # type: ignore[attr-defined]
    methods: dict[str, Callable[..., None]] = {
        "__init__": _host_event_init,
        "record": _host_event_record,
        "wait": _host_event_wait,
    }
    for name, method in methods.items():
        _once(eplb_utils.CpuGpuEvent, name, functools.partial(_replacement, method))
    _once(eplb_state, "start_async_worker", lambda original: start_async_worker)


PATCHES: tuple[tuple[str, Callable[[], None]], ...] = (
    ("platform-check", _platform_check),
    ("gatherv", _gatherv),
    ("eplb-state", _eplb_state),
    ("map-and-record", _map_and_record),
    ("events", _events),
    ("local-experts", _local_experts),
    ("async-worker", _async_worker),
)
