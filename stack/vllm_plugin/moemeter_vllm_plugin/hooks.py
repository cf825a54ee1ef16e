"""Wrap the vLLM methods whose timing and routing the plugin measures.

Engine core (and workers): Scheduler.schedule and update_from_output, the model runner's
_prepare_inputs, _model_forward and _sample, EngineCore.step (wall time); the MoE router's
select_experts (tokens per logical expert, counted on the device: no host synchronisation in
the hot path; totals are copied out at most twice a second). API server: OutputProcessor.
process_outputs, and the Prometheus collector that reads every process's totals.

Only real engine steps count: profiling and warm-up passes run outside EngineCore.step and
the model runner's execute_model/sample_tokens, so their tokens never reach the counters.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .state import WRITE_EVERY_SECONDS, Hist, ProcessState, write_atomically

log = logging.getLogger("moemeter.vllm_plugin")
STATE_DIR_ENV = "MOEMETER_VLLM_STATE_DIR"

STATE = ProcessState()
_engine = 0  # this process's data-parallel rank
_active = 0  # >0 while a real engine step runs in this process
_disabled: set[str] = set()
_lock = threading.Lock()
_counters: dict[int, Any] = {}  # MoE layer ordinal -> device tensor of per-expert tokens
_layer_ordinal: dict[str, int] = {}
_pending_events: list[tuple[Any, Any]] = []  # CUDA (start, end) events of forward passes not yet resolved


def state_dir() -> Path:
    """Shared by the API server and the processes it starts (they inherit the variable)."""
    path = os.environ.get(STATE_DIR_ENV)
    if not path:
        path = tempfile.mkdtemp(prefix="moemeter-vllm-")
        os.environ[STATE_DIR_ENV] = path
        atexit.register(_remove_dir, Path(path), os.getpid())
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p


def _remove_dir(path: Path, owner: int) -> None:
    if os.getpid() == owner:
        for f in path.glob("*"):
            f.unlink(missing_ok=True)
        path.rmdir()


def _guard(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run `fn` (plugin code); on any error disable `part` for good and say so once."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if part in _disabled:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception:
            _disabled.add(part)
            log.exception("moemeter plugin: %s failed and is now off; the engine is unaffected", part)
            return None

    return run


def _wrap(
    cls: type, name: str, part: str, before: Callable[..., Any] | None = None, after: Callable[..., Any] | None = None
) -> None:
    """Replace cls.name by a wrapper that times it; `after(self, seconds, result)` records it.
    The original's own exceptions pass through untouched."""
    original = cls.__dict__.get(name) or getattr(cls, name)
    if getattr(original, "__moemeter__", False):
        return  # loaded twice
    safe_before = _guard(part, before) if before else None
    safe_after = _guard(part, after) if after else None

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = safe_before(self) if safe_before else None
        t0 = time.perf_counter()
        try:
            result = original(self, *args, **kwargs)
        finally:
            if safe_after:
                safe_after(self, time.perf_counter() - t0, token)
        return result

    wrapper.__moemeter__ = True  # type: ignore[attr-defined]
    setattr(cls, name, wrapper)


def _observe(phase: str, seconds: float) -> None:
    STATE.phases.setdefault((_engine, phase), Hist()).observe(seconds)


def _observe_phase(phase: str) -> Callable[..., None]:
    def after(self: Any, seconds: float, token: Any) -> None:
        if _active:
            _observe(phase, seconds)

    return after


def _enter(self: Any) -> None:
    global _active
    _active += 1


def _leave_step(self: Any, seconds: float, token: Any) -> None:
    global _active
    _active -= 1
    STATE.steps.setdefault(_engine, Hist()).observe(seconds)


def _leave(self: Any, seconds: float, token: Any) -> None:
    global _active
    _active -= 1


def _note_config(vllm_config: Any) -> None:
    global _engine
    _engine = int(getattr(vllm_config.parallel_config, "data_parallel_rank", 0) or 0)
    names = getattr(vllm_config.model_config, "served_model_name", None)
    STATE.model_name = names if isinstance(names, str) else (names[0] if names else vllm_config.model_config.model)


# ------------------------------------------------------------------ forward device time
def _forward_before(self: Any) -> Any:
    import torch

    if _active and torch.cuda.is_available() and str(getattr(self, "device", "cpu")).startswith("cuda"):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start
    return None


def _forward_after(self: Any, seconds: float, start: Any) -> None:
    if not _active:
        return
    if start is None:  # CPU: the call's wall time is the device time
        _observe("forward", seconds)
        return
    import torch

    end = torch.cuda.Event(enable_timing=True)
    end.record()
    _pending_events.append((start, end))  # resolved once the device has passed it: no sync


def _resolve_events() -> None:
    while _pending_events and _pending_events[0][1].query():
        start, end = _pending_events.pop(0)
        _observe("forward", start.elapsed_time(end) / 1000.0)


# ------------------------------------------------------------------ expert routing
def _count_experts(router: Any, topk_ids: Any) -> None:
    if not _active:
        return
    import torch

    layer = getattr(router, "_moemeter_layer", None)
    if layer is None:
        return
    acc = _counters.get(layer)
    experts = int(getattr(router, "global_num_experts", 0) or 0)
    if acc is None or acc.device != topk_ids.device:
        acc = _counters[layer] = torch.zeros(experts, dtype=torch.int64, device=topk_ids.device)
        STATE.num_experts = max(STATE.num_experts, experts)
    flat = topk_ids.reshape(-1).to(torch.int64)
    acc.scatter_add_(0, flat, torch.ones_like(flat))


def _install_router_hook() -> None:
    from vllm.model_executor.layers.fused_moe.router.fused_moe_router import FusedMoERouter
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    original_init = MoERunner.__init__
    if not getattr(original_init, "__moemeter__", False):

        @functools.wraps(original_init)
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            _guard("expert counting", _name_router)(self)

        init.__moemeter__ = True  # type: ignore[attr-defined]
        MoERunner.__init__ = init  # type: ignore[method-assign]

    original = FusedMoERouter.select_experts
    if getattr(original, "__moemeter__", False):
        return
    count = _guard("expert counting", _count_experts)

    @functools.wraps(original)
    def select_experts(self: Any, *args: Any, **kwargs: Any) -> Any:
        weights, ids = original(self, *args, **kwargs)
        count(self, ids)
        return weights, ids

    select_experts.__moemeter__ = True  # type: ignore[attr-defined]
    FusedMoERouter.select_experts = select_experts  # type: ignore[method-assign]


def _name_router(runner: Any) -> None:
    """MoE layers in construction order are vLLM's MoE layer ordinals (as its EPLB state counts them)."""
    name = str(getattr(runner, "layer_name", ""))
    with _lock:
        ordinal = _layer_ordinal.setdefault(name, len(_layer_ordinal))
    runner.router._moemeter_layer = ordinal


# ------------------------------------------------------------------ hand-over to the API server
def _flush() -> None:
    _guard("export", _write)()


def _write() -> None:
    if _pending_events:
        _resolve_events()
    if _counters:
        STATE.experts[_engine] = {layer: acc.tolist() for layer, acc in _counters.items()}  # the one copy-out
    if STATE.phases or STATE.steps or STATE.experts or sum(STATE.api_output.counts):
        try:
            data = STATE.as_json(os.getpid(), time.time())
        except RuntimeError:  # a first observation added a key meanwhile: next time
            return
        write_atomically(state_dir(), data)


def _flusher() -> None:
    while "export" not in _disabled:
        time.sleep(WRITE_EVERY_SECONDS)
        _flush()


def _start_flusher() -> None:
    threading.Thread(target=_flusher, name="moemeter-flush", daemon=True).start()


def _after_fork_in_child() -> None:
    """A forked engine process starts its own totals and its own flusher."""
    global STATE, _active, _engine
    STATE, _active, _engine = ProcessState(), 0, 0
    _counters.clear()
    _layer_ordinal.clear()
    _pending_events.clear()
    _start_flusher()


def install() -> None:
    state_dir()
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    _wrap(Scheduler, "schedule", "step phases", after=_observe_phase("schedule"))
    _wrap(Scheduler, "update_from_output", "step phases", after=_observe_phase("update"))
    _wrap(GPUModelRunner, "_prepare_inputs", "step phases", after=_observe_phase("prepare_inputs"))
    _wrap(GPUModelRunner, "_model_forward", "step phases", before=_forward_before, after=_forward_after)
    _wrap(GPUModelRunner, "_sample", "step phases", after=_observe_phase("sample"))
    for name in ("step", "step_with_batch_queue"):
        _wrap(EngineCore, name, "step phases", before=_enter, after=_leave_step)
    for name in ("execute_model", "sample_tokens"):  # worker processes of a multi-process executor
        _wrap(GPUModelRunner, name, "step phases", before=_enter, after=_leave)
    _wrap(
        OutputProcessor,
        "process_outputs",
        "api output",
        after=lambda self, seconds, token: STATE.api_output.observe(seconds),
    )

    for cls in (GPUModelRunner, Scheduler):  # whichever this process builds knows the engine
        _note_config_on_init(cls)
    _guard("expert counting", _install_router_hook)()
    _guard("export", _install_exporter)()
    _start_flusher()
    os.register_at_fork(after_in_child=_after_fork_in_child)
    atexit.register(_flush)


def _note_config_on_init(cls: type) -> None:
    original_init = cls.__init__  # type: ignore[misc]
    if getattr(original_init, "__moemeter__", False):
        return

    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _guard("config", _note_config)(getattr(self, "vllm_config", None) or kwargs.get("vllm_config") or args[0])

    init.__moemeter__ = True  # type: ignore[attr-defined]
    cls.__init__ = init  # type: ignore[misc]


def _install_exporter() -> None:
    from . import exporter

    exporter.install(state_dir())
