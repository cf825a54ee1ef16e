"""Named faults the twin can carry (`moemeter twin --fault KIND:INSTANCE[:ENGINE]`), so the pages,
the alert pack and the tests see what a sick rack looks like, with every consequence the model
draws from it rather than a painted-on number:

- `straggler`: the engine reads its requests' KV over a degraded link, `STRAGGLER_SLOWDOWN` times
  slower: its requests wait for their KV (vLLM's `num_requests_waiting`, reason deferred) while the
  pool's other engines keep pace, and its NIXL transfer times show it.
- `nixl-failures`: a share (`NIXL_FAILURE_SHARE`) of the KV transfers to the instance fail once
  (`vllm:nixl_num_failed_transfers`) and are read again, which costs those requests a second
  transfer's time.
- `kv-saturated`: the engine's KV cache holds `KV_SATURATED_CAPACITY` of its normal tokens: it runs
  full, and counts `PREEMPTIONS_PER_SECOND` preemptions (`vllm:num_preemptions`) while its
  sequences outgrow it. The model does not run the preempted requests again: their latency is
  not charged, only the counter and the full cache are.
- `draft-collapse`: the engine's draft path falls out of step with the target model (a stale draft
  checkpoint, a broken draft stage): each drafted token is accepted with probability
  `SpeculativeSpec.collapsed_acceptance` whatever the turn, so its requests emit fewer tokens a
  step, its acceptance length falls and its users' tokens/s with it, while its queue does not grow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moemeter.contract.errors import MoemeterError

KINDS = ("straggler", "nixl-failures", "kv-saturated", "draft-collapse")
STRAGGLER_SLOWDOWN = 1000.0
NIXL_FAILURE_SHARE = 0.05
KV_SATURATED_CAPACITY = 0.02
PREEMPTIONS_PER_SECOND = 0.5


class FaultError(MoemeterError, ValueError):
    """A fault the twin cannot carry: unknown kind, instance or engine."""


@dataclass(frozen=True)
class Fault:
    kind: str
    instance: str  # e.g. decode-0
    engine: int | None = None  # None: every engine of the instance

    @classmethod
    def parse(cls, spec: str) -> Fault:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or parts[0] not in KINDS:
            raise FaultError(f"fault {spec!r}: expected KIND:INSTANCE[:ENGINE], KIND one of {', '.join(KINDS)}")
        engine = None
        if len(parts) == 3:
            if not parts[2].isdigit():
                raise FaultError(f"fault {spec!r}: the engine is a data-parallel rank, a whole number")
            engine = int(parts[2])
        return cls(parts[0], parts[1], engine)

    def __str__(self) -> str:
        return f"{self.kind}:{self.instance}" + ("" if self.engine is None else f":{self.engine}")


class FaultMap:
    """Per decode engine (the pool's global DP ranks), what the faults change."""

    def __init__(self, faults: tuple[Fault, ...], decode_instances: int, decode_dp: int) -> None:
        n = decode_instances * decode_dp
        self.faults = faults
        self.kv_slowdown = np.ones(n)
        self.failure_share = np.zeros(n)
        self.kv_capacity = np.ones(n)
        self.draft_collapse = np.zeros(n, dtype=bool)
        for f in faults:
            engines = self._engines(f, decode_instances, decode_dp)
            if f.kind == "straggler":
                self.kv_slowdown[engines] = STRAGGLER_SLOWDOWN
            elif f.kind == "nixl-failures":
                self.failure_share[engines] = NIXL_FAILURE_SHARE
            elif f.kind == "draft-collapse":
                self.draft_collapse[engines] = True
            else:
                self.kv_capacity[engines] = KV_SATURATED_CAPACITY

    @staticmethod
    def _engines(f: Fault, instances: int, dp: int) -> np.ndarray:
        names = [f"decode-{i}" for i in range(instances)]
        if f.instance not in names:
            raise FaultError(f"fault {f}: no decode instance {f.instance!r}; the twin has {', '.join(names)}")
        base = names.index(f.instance) * dp
        if f.engine is None:
            return np.arange(base, base + dp)
        if f.engine >= dp:
            raise FaultError(f"fault {f}: {f.instance} has engines 0..{dp - 1}")
        return np.array([base + f.engine])
