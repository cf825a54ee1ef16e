"""Wrap the vLLM methods whose timing and routing the plugin measures.

Engine core (and workers): Scheduler.schedule and update_from_output, the model runner's
_prepare_inputs, _model_forward and _sample, EngineCore.step (wall time); the MoE router's
select_experts (tokens per logical expert, counted on the device: no host synchronisation in
the hot path; totals are copied out at most twice a second). API server: OutputProcessor.
process_outputs, and the Prometheus collector that reads every process's totals.

Only real engine steps count: profiling and warm-up passes run outside EngineCore.step and
the model runner's execute_model/sample_tokens, so their tokens never reach the counters.

With --enable-eplb: vLLM's EplbState (add_model, step, rearrange) of the served model. The
router then returns physical expert ids: tokens are counted per physical slot, and per logical
expert through vLLM's own physical_to_logical_map. Counters are copied out only between engine
steps, so every layer of one hand-over comes from the same step.
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

from . import cpu_amx, cpu_eplb
from .state import WRITE_EVERY_SECONDS, Eplb, Hist, ProcessState, write_atomically

log = logging.getLogger("vllm.moemeter_plugin")
STATE_DIR_ENV = "MOEMETER_VLLM_STATE_DIR"

STATE = ProcessState()
_engine = 0  # this process's data-parallel rank
_active = 0  # >0 while a real engine step runs in this process
_disabled: set[str] = set()
_lock = threading.Lock()
_counters: dict[int, Any] = {}  # MoE layer ordinal -> device tensor of per-expert tokens
_physical: dict[int, Any] = {}  # with EPLB: MoE layer ordinal -> device tensor of per-slot tokens
_eplb: dict[str, Any] = {}  # with EPLB: "model", the served model's EplbModelState
_async_cycle: dict[str, Any] = {}  # with async EPLB: the rearrangement in flight (placement before, step, times)
_copy_due = False  # the flusher asks for a copy-out; the engine makes it between steps
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
    with _lock:
        _active += 1


def _leave_step(self: Any, seconds: float, token: Any) -> None:
    _leave(self, seconds, token)
    STATE.steps.setdefault(_engine, Hist()).observe(seconds)


def _leave(self: Any, seconds: float, token: Any) -> None:
    global _active
    with _lock:
        _active -= 1
        if not _active and _copy_due:
            _copy_out()


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
    flat = topk_ids.reshape(-1).to(torch.int64)
    model = _eplb.get("model")
    if model is not None and getattr(router, "eplb_state", None) is not None:  # ids are physical slots
        phy2log = model.physical_to_logical_map[layer]
        flat = flat[flat >= 0]
        _tally(_physical, layer, flat, phy2log.shape[0])
        flat = phy2log[flat].to(torch.int64)
        experts = int(model.model.num_logical_experts)
    else:
        experts = int(getattr(router, "global_num_experts", 0) or 0)
    _tally(_counters, layer, flat, experts)
    STATE.num_experts = max(STATE.num_experts, experts)


def _tally(counters: dict[int, Any], layer: int, ids: Any, size: int) -> None:
    import torch

    acc = counters.get(layer)
    if acc is None or acc.device != ids.device:
        acc = counters[layer] = torch.zeros(size, dtype=torch.int64, device=ids.device)
    acc.scatter_add_(0, ids, torch.ones_like(ids))


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


# ------------------------------------------------------------------ EPLB state
def _install_eplb_hooks() -> None:
    from vllm.distributed.eplb.eplb_state import EplbState

    def add_model(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, model: Any, model_config: Any, model_name: str | None = None) -> Any:
            result = original(self, model, model_config, model_name)
            if model_name is None:  # the served model (a drafter is added with its own name)
                _guard("eplb", _note_eplb)(self.model_states[model_config.compute_hash()])
            return result

        return wrapper

    def step(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            result = original(self, *args, **kwargs)
            if STATE.eplb is not None and not kwargs.get("is_profile", args[1] if len(args) > 1 else False):
                STATE.eplb.steps += 1
                if _async_cycle:
                    _guard("eplb", _note_async_step)(time.perf_counter() - t0)
            return result

        return wrapper

    def rearrange(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            model = _eplb.get("model")
            if model is None or kwargs.get("is_profile", args[0] if args else False):
                return original(self, *args, **kwargs)
            before = model.physical_to_logical_map.tolist()
            step, t0 = STATE.eplb.steps if STATE.eplb else 0, time.perf_counter()
            result = original(self, *args, **kwargs)
            seconds = time.perf_counter() - t0
            if not self.is_async:
                _guard("eplb", _note_rebalance)(model, before, step, seconds, seconds, "sync")
            elif model.rebalanced:  # vLLM's worker thread moves the layers now, one per engine step
                _async_cycle.update(before=before, step=step, started=t0, pause=0.0)
            return result

        return wrapper

    for name, make in (("add_model", add_model), ("step", step), ("rearrange", rearrange)):
        original = EplbState.__dict__[name]
        if not getattr(original, "__moemeter__", False):
            wrapper = functools.wraps(original)(make(original))
            wrapper.__moemeter__ = True  # type: ignore[attr-defined]
            setattr(EplbState, name, wrapper)


def _note_eplb(model_state: Any) -> None:
    from vllm.distributed.parallel_state import get_ep_group

    ep = get_ep_group()
    _eplb["model"] = model_state
    STATE.eplb = Eplb(ep.rank_in_group, ep.world_size, model_state.physical_to_logical_map.tolist())


def _note_async_step(seconds: float) -> None:
    """An engine step of an async rearrangement: the step's EPLB time is the engine's pause
    (the rearrangement's own call in the first, the ranks' agreement and the move of one layer's
    weights from the worker's buffer in the others). The last layer committed ends it."""
    model = _eplb.get("model")
    _async_cycle["pause"] += seconds
    if model is not None and not model.rebalanced:
        cycle = dict(_async_cycle)
        _async_cycle.clear()
        seconds = time.perf_counter() - cycle["started"]
        _note_rebalance(model, cycle["before"], cycle["step"], cycle["pause"], seconds, "async")


def _note_rebalance(
    model_state: Any, before: list[list[int]], step: int, pause: float, seconds: float, mode: str
) -> None:
    view = STATE.eplb
    if view is None:
        return
    view.phy2log = model_state.physical_to_logical_map.tolist()
    if view.rank == 0:  # every rank rearranges in lockstep; one event
        load = model_state.last_expert_load.tolist()
        view.rebalanced(time.time(), step, pause, seconds, mode, before, load)


# ------------------------------------------------------------------ hand-over to the API server
def _copy_out() -> None:
    """Counters to host lists, between steps (the caller holds _lock and no step runs)."""
    global _copy_due
    _copy_due = False
    if _counters:
        STATE.experts[_engine] = {layer: acc.tolist() for layer, acc in _counters.items()}
    model = _eplb.get("model")
    if model is not None and STATE.eplb is not None:  # async EPLB changes it layer by layer: read it each time
        STATE.eplb.phy2log = model.physical_to_logical_map.tolist()
        STATE.eplb.replicas = model.logical_replica_count.tolist()
        if STATE.eplb.rebalances_total or _async_cycle:  # vLLM starts it as ones: no window yet
            STATE.eplb.window_load = model.last_expert_load.tolist()
        STATE.eplb.physical = {layer: acc.tolist() for layer, acc in _physical.items()}


def _flush() -> None:
    _guard("export", _write)()


def _write() -> None:
    global _copy_due
    if _pending_events:
        _resolve_events()
    with _lock:
        if _active:
            _copy_due = True  # the step in flight copies when it ends; this hand-over has the last copy
        else:
            _copy_out()
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
    global STATE, _active, _engine, _copy_due
    STATE, _active, _engine, _copy_due = ProcessState(), 0, 0, False
    _counters.clear()
    _physical.clear()
    _eplb.clear()
    _async_cycle.clear()
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
    _guard("eplb", _install_eplb_hooks)()
    _guard("eplb on cpu", cpu_eplb.apply)()
    _guard("amx permission", cpu_amx.request)()
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
