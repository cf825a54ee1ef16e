"""moemeter's vLLM plugin (entry point `vllm.general_plugins`): per-expert load, EPLB state and
engine-step phase timings, exported on the engine's /metrics and at /moemeter/experts.

vLLM calls `register()` in every process it starts, possibly more than once. It must never take
the engine down: each hook that fails is disabled and logged once (hooks.py).
"""

from __future__ import annotations

import logging

log = logging.getLogger("vllm.moemeter_plugin")
_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        from . import hooks

        hooks.install()
    except Exception:  # the engine runs on without the plugin
        log.exception("moemeter plugin: not installed")
