"""vLLM 0.32 on an x86 CPU with AMX runs its MoE layers with the AMX grouped-gemm kernel
(`X86CPUUnquantizedExperts`, isa "amx", chosen when torch reports `amx_tile`). Linux lets a
process execute AMX instructions only after it asked for the AMX register state
(arch_prctl ARCH_REQ_XCOMP_PERM); nothing in vLLM asks (`torch.cpu._init_amx` is never called),
so whether a process may depends on what happened to run in it before. Where it may not, the
first MoE forward dies with SIGILL (exit code -4): seen on an Intel Xeon with amx_tile in the
decode server of the local stack (its first request, after a NIXL KV transfer) and in the second
engine of DP=2 x EP (its first dummy batch), while a single server on either core ran.

`amx-permission`: the plugin asks once in every process on the CPU platform (process-wide, so
the worker's threads have it too), and logs it once. Elsewhere, and on CPUs without AMX,
nothing is done.
"""

from __future__ import annotations

import logging

log = logging.getLogger("vllm.moemeter_plugin")
_asked: list[bool] = []


def request() -> bool:
    """Ask Linux for the AMX state where vLLM's AMX kernels may run; True when granted."""
    if _asked:
        return _asked[0]
    import torch
    from vllm.platforms import current_platform

    granted = False
    if current_platform.is_cpu() and torch.cpu._is_amx_tile_supported():
        granted = bool(torch.cpu._init_amx())
        if granted:
            log.info("moemeter plugin: AMX state requested for vLLM's AMX MoE kernel (amx-permission)")
        else:
            log.warning("moemeter plugin: the CPU has AMX but Linux refused its state: MoE layers may die of SIGILL")
    _asked.append(granted)
    return granted
