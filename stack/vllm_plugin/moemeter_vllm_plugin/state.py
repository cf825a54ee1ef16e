"""What each vLLM process measures, how it hands it to the API server, and how the API server
turns it into Prometheus families and the expert snapshot. Pure Python: no torch, no vLLM.

Every process that measures something (engine core, workers, API server) writes its totals
to `<state dir>/<pid>.json` (atomically, at most twice a second). The API server process reads
all of them at scrape time: /metrics gets low-cardinality families, /moemeter/experts the full
matrices (schema moemeter.experts/1, docs/metrics.md).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

PHASES = ("schedule", "prepare_inputs", "forward", "sample", "update")
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HOT_EXPERTS = 8
WRITE_EVERY_SECONDS = 0.5
KEEP_REBALANCES = 50  # the latest ones, in each snapshot; the counter counts them all


@dataclass
class Hist:
    """A Prometheus histogram's state: per-bucket (not cumulative) counts, +Inf last."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        i = 0
        while i < len(BUCKETS) and seconds > BUCKETS[i]:
            i += 1
        self.counts[i] += 1
        self.sum += seconds

    def merge(self, other: Hist) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.sum += other.sum

    def cumulative(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for le, n in zip([*map(_le, BUCKETS), "+Inf"], self.counts):
            total += n
            out.append((le, float(total)))
        return out

    def as_json(self) -> dict[str, object]:
        return {"counts": self.counts, "sum": self.sum}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Hist:
        counts = [int(x) for x in data["counts"]]  # type: ignore[attr-defined]
        if len(counts) != len(BUCKETS) + 1:
            raise ValueError("bucket layout changed")
        return cls(counts, float(data["sum"]))  # type: ignore[arg-type]


def _le(x: float) -> str:
    return repr(float(x))


def placement_balancedness(load: list[float], phy2log: list[int], ranks: int) -> float:
    """One layer's balancedness (docs/definitions.md: mean over ranks / max over ranks of rank
    load) when logical expert e carries load[e], split evenly over its replicas, and slot s is
    on rank s // (slots / ranks). 1.0 for a layer without load."""
    replicas = [0] * len(load)
    for e in phy2log:
        replicas[e] += 1
    per_rank = len(phy2log) // ranks
    rank_load = [0.0] * ranks
    for s, e in enumerate(phy2log):
        rank_load[s // per_rank] += load[e] / replicas[e]
    top = max(rank_load)
    return sum(rank_load) / ranks / top if top > 0 else 1.0


@dataclass
class Eplb:
    """vLLM's EPLB state as one engine process sees it (EplbState / EplbModelState of the
    served model): its EP rank, the placement, tokens per physical expert (counted here, per
    layer and slot, top-k counted), and the rebalances it performed (EP rank 0 records them)."""

    rank: int
    ranks: int
    phy2log: list[list[int]]
    physical: dict[int, list[int]] = field(default_factory=dict)
    steps: int = 0  # EplbState.step calls (dummy steps too: vLLM's rearrangement counter counts them)
    rebalances: list[dict[str, object]] = field(default_factory=list)
    rebalances_total: int = 0
    replicas: list[list[int]] = field(default_factory=list)  # vLLM's logical_replica_count
    window_load: list[list[float]] = field(default_factory=list)  # vLLM's last_expert_load; [] before a rebalance

    def as_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "ranks": self.ranks,
            "phy2log": self.phy2log,
            "physical": [[layer, row] for layer, row in self.physical.items()],
            "steps": self.steps,
            "rebalances": self.rebalances,
            "rebalances_total": self.rebalances_total,
            "replicas": self.replicas,
            "window_load": self.window_load,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Eplb:
        return cls(
            rank=int(data["rank"]),  # type: ignore[call-overload]
            ranks=int(data["ranks"]),  # type: ignore[call-overload]
            phy2log=[[int(e) for e in row] for row in data["phy2log"]],  # type: ignore[attr-defined]
            physical={int(layer): [int(n) for n in row] for layer, row in data["physical"]},  # type: ignore[attr-defined]
            steps=int(data["steps"]),  # type: ignore[call-overload]
            rebalances=list(data["rebalances"]),  # type: ignore[call-overload]
            rebalances_total=int(data["rebalances_total"]),  # type: ignore[call-overload]
            replicas=[[int(n) for n in row] for row in data["replicas"]],  # type: ignore[attr-defined]
            window_load=[[float(n) for n in row] for row in data["window_load"]],  # type: ignore[attr-defined]
        )

    def rebalanced(
        self,
        at: float,
        step: int,
        pause: float,
        seconds: float,
        mode: str,
        before: list[list[int]],
        load: list[list[float]],
    ) -> None:
        """Record a rearrangement from `before` to the current `phy2log`, planned on `load`
        (vLLM's all-reduced window of logical expert load, per layer), started at EPLB step
        `step`: `pause` seconds of the engine's, `seconds` from its start until the last layer's
        new weights were in (the same for a synchronous one; longer for `mode` "async")."""
        self.rebalances.append(
            {
                "time": at,
                "step": step,
                "mode": mode,
                "duration_seconds": pause,
                "transfer_seconds": seconds,
                "moved_replicas": sum(a != b for old, new in zip(before, self.phy2log) for a, b in zip(old, new)),
                "balancedness_before": [placement_balancedness(w, p, self.ranks) for w, p in zip(load, before)],
                "balancedness_planned": [placement_balancedness(w, p, self.ranks) for w, p in zip(load, self.phy2log)],
            }
        )
        del self.rebalances[:-KEEP_REBALANCES]
        self.rebalances_total += 1


@dataclass
class ProcessState:
    """One process's totals since it started. Keys of `phases` are (engine, phase)."""

    model_name: str = ""
    phases: dict[tuple[int, str], Hist] = field(default_factory=dict)
    steps: dict[int, Hist] = field(default_factory=dict)
    api_output: Hist = field(default_factory=Hist)
    experts: dict[int, dict[int, list[int]]] = field(default_factory=dict)  # engine -> MoE layer -> per expert
    num_experts: int = 0
    eplb: Eplb | None = None  # with --enable-eplb, in the engine processes

    def as_json(self, pid: int, now: float) -> dict[str, object]:
        return {
            "pid": pid,
            "time": now,
            "model_name": self.model_name,
            "num_experts": self.num_experts,
            "phases": [[e, p, h.as_json()] for (e, p), h in self.phases.items()],
            "steps": [[e, h.as_json()] for e, h in self.steps.items()],
            "api_output": self.api_output.as_json(),
            "experts": [[e, layer, row] for e, layers in self.experts.items() for layer, row in layers.items()],
            "eplb": self.eplb.as_json() if self.eplb else None,
        }


def write_atomically(directory: Path, data: dict[str, object]) -> None:
    path = directory / f"{data['pid']}.json"
    tmp = directory / f".{data['pid']}.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_states(directory: Path) -> list[dict[str, object]]:
    """Every live process's latest totals; files of processes that are gone are removed (their
    counters end with them, as a restarted engine's do)."""
    out = []
    for f in sorted(directory.glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now, or unreadable: the next scrape reads it
        if not _alive(int(data.get("pid", 0))):
            f.unlink(missing_ok=True)
            continue
        out.append(data)
    return out


@dataclass
class Merged(ProcessState):
    """All processes' totals, summed. With EPLB, `eplb` is EP rank 0's (the placement is the
    same on every rank; rank 0 records the rebalances) with every rank's physical counts added."""

    @classmethod
    def of(cls, states: list[dict[str, object]]) -> Merged:
        m = cls()
        views = sorted((Eplb.from_json(s["eplb"]) for s in states if s.get("eplb")), key=lambda v: v.rank)  # type: ignore[arg-type]
        if views:
            m.eplb = views[0]
            for other in views[1:]:
                for layer, row in other.physical.items():
                    have = m.eplb.physical.get(layer)
                    m.eplb.physical[layer] = [a + b for a, b in zip(have, row)] if have else row
        for s in states:
            m.model_name = m.model_name or str(s.get("model_name") or "")
            m.num_experts = max(m.num_experts, int(s.get("num_experts") or 0))  # type: ignore[call-overload]
            for engine, phase, h in s.get("phases", []):  # type: ignore[attr-defined]
                m.phases.setdefault((int(engine), str(phase)), Hist()).merge(Hist.from_json(h))
            for engine, h in s.get("steps", []):  # type: ignore[attr-defined]
                m.steps.setdefault(int(engine), Hist()).merge(Hist.from_json(h))
            m.api_output.merge(Hist.from_json(s["api_output"]))  # type: ignore[arg-type]
            for engine, layer, row in s.get("experts", []):  # type: ignore[attr-defined]
                layers = m.experts.setdefault(int(engine), {})
                have = layers.get(int(layer))
                layers[int(layer)] = [a + b for a, b in zip(have, row)] if have else [int(x) for x in row]
        return m

    def layers(self) -> list[int]:
        return sorted({layer for layers in self.experts.values() for layer in layers})

    def logical_matrix(self) -> list[list[int]]:
        """[MoE layer][logical expert] tokens over every engine."""
        out = []
        for layer in self.layers():
            row = [0] * self.num_experts
            for layers in self.experts.values():
                for i, n in enumerate(layers.get(layer, [])):
                    row[i] += n
            out.append(row)
        return out

    def rank_tokens(self) -> dict[tuple[int, int], int]:
        """(rank, layer) -> tokens routed to the experts that rank holds. With EPLB the ranks are
        EP ranks and a rank holds slots [r * slots / ranks, (r + 1) * slots / ranks); without
        expert parallelism every engine holds all its layer's experts."""
        if self.eplb and self.eplb.physical:
            ranks = self.eplb.ranks
            out = {}
            for layer, row in self.eplb.physical.items():
                per = len(row) // ranks
                out.update({(r, layer): sum(row[r * per : (r + 1) * per]) for r in range(ranks)})
            return out
        return {(e, layer): sum(row) for e, layers in self.experts.items() for layer, row in layers.items()}


def snapshot(m: Merged, now: float) -> dict[str, object]:
    """GET /moemeter/experts (schema moemeter.experts/1). With EPLB, vLLM's placement
    (`physical_to_logical_map`, rows of MoE layers) on its EP ranks, the tokens per physical
    slot and the rebalances; without, the identity: one slot per logical expert, on one rank."""
    matrix = m.logical_matrix()
    experts = m.num_experts
    snap: dict[str, object] = {
        "schema": "moemeter.experts/1",
        "time": now,
        "layers": len(matrix),
        "logical_experts": experts,
        "slots": experts,
        "ranks": 1,
        "engines": max(1, len(m.experts)),
        "layer_ids": m.layers(),
        "logical_tokens_total": matrix,
        "phy2log": [list(range(experts)) for _ in matrix],
        "rebalances": [],
    }
    if m.eplb:
        e = m.eplb
        snap.update(
            slots=len(e.phy2log[0]) if e.phy2log else experts,
            ranks=e.ranks,
            phy2log=[e.phy2log[layer] for layer in m.layers()],
            physical_tokens_total=[e.physical.get(layer, [0] * len(e.phy2log[layer])) for layer in m.layers()],
            logical_replicas=[e.replicas[layer] for layer in m.layers()] if e.replicas else [],
            eplb_window_load=[e.window_load[layer] for layer in m.layers()] if e.window_load else [],
            eplb_steps=e.steps,
            rebalances=e.rebalances,
        )
    return snap


@dataclass
class Window:
    """What the last scrape saw, so gauges can speak of the window since (balancedness, hot experts)."""

    rank_tokens: dict[tuple[int, int], int] = field(default_factory=dict)
    matrix: list[list[int]] = field(default_factory=list)
    balancedness: dict[int, float] = field(default_factory=dict)
    hot: list[tuple[int, int, float]] = field(default_factory=list)
    at: float = field(default_factory=time.time)

    def advance(self, m: Merged) -> None:
        ranks = m.rank_tokens()
        delta = {k: v - self.rank_tokens.get(k, 0) for k, v in ranks.items()}
        for layer in {layer for _, layer in delta}:
            loads = [v for (_, lay), v in delta.items() if lay == layer]
            top = max(loads, default=0)
            if top > 0:  # a window without tokens keeps the last value
                self.balancedness[layer] = (sum(loads) / len(loads)) / top
        matrix = m.logical_matrix()
        if matrix:
            prev = self.matrix if len(self.matrix) == len(matrix) else [[0] * len(r) for r in matrix]
            window = [[a - b for a, b in zip(r, p)] for r, p in zip(matrix, prev)]
            if any(any(r) for r in window):
                shares = []
                for layer, row in enumerate(window):
                    total = sum(row)
                    shares += [(layer, e, n / total) for e, n in enumerate(row) if total > 0 and n > 0]
                self.hot = sorted(shares, key=lambda x: -x[2])[:HOT_EXPERTS]
        self.rank_tokens, self.matrix, self.at = ranks, matrix, time.time()


def families(m: Merged, w: Window) -> list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]:
    """(name, type, help, samples) in docs/metrics.md's terms; the exporter wraps them."""
    model = m.model_name
    out: list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]] = []

    def hist(name: str, doc: str, items: list[tuple[dict[str, str], Hist]]) -> None:
        samples = []
        for labels, h in items:
            for le, n in h.cumulative():
                samples.append((name + "_bucket", {**labels, "le": le}, n))
            samples.append((name + "_count", labels, float(sum(h.counts))))
            samples.append((name + "_sum", labels, h.sum))
        out.append((name, "histogram", doc, samples))

    hist(
        "moemeter_step_phase_seconds",
        "Engine-step time by phase: schedule, prepare_inputs, forward (device time), "
        "sample, update (scheduler output processing).",
        [({"engine": str(e), "model_name": model, "phase": p}, h) for (e, p), h in sorted(m.phases.items())],
    )
    hist(
        "moemeter_step_seconds",
        "Engine-step wall time (EngineCore.step); CPU overhead = this - forward.",
        [({"engine": str(e), "model_name": model}, h) for e, h in sorted(m.steps.items())],
    )
    hist(
        "moemeter_api_output_seconds",
        "API-server output handling per batch of engine outputs (OutputProcessor.process_outputs).",
        [({"model_name": model}, m.api_output)],
    )
    out.append(
        (
            "moemeter_expert_rank_tokens_total",
            "counter",
            "Tokens routed to the experts on rank `engine` in MoE layer `layer` (top-k counted).",
            [
                (
                    "moemeter_expert_rank_tokens_total",
                    {"engine": str(e), "layer": str(layer), "model_name": model},
                    float(n),
                )
                for (e, layer), n in sorted(m.rank_tokens().items())
            ],
        )
    )
    out.append(
        (
            "moemeter_eplb_balancedness",
            "gauge",
            "Mean over ranks / max over ranks of rank load since the last scrape, per MoE layer.",
            [
                ("moemeter_eplb_balancedness", {"layer": str(layer), "model_name": model}, b)
                for layer, b in sorted(w.balancedness.items())
                if math.isfinite(b)
            ],
        )
    )
    last = m.eplb.rebalances[-1] if m.eplb and m.eplb.rebalances else {}
    for name, kind, doc, value in (
        (
            "moemeter_eplb_rebalances_total",
            "counter",
            "EPLB rebalances performed (0 while EPLB is off).",
            m.eplb.rebalances_total if m.eplb else 0,
        ),
        (
            "moemeter_eplb_last_rebalance_duration_seconds",
            "gauge",
            "Wall time of the last rebalance.",
            last.get("duration_seconds", 0.0),
        ),
        (
            "moemeter_eplb_last_rebalance_timestamp_seconds",
            "gauge",
            "Unix time of the last rebalance; 0 before the first.",
            last.get("time", 0.0),
        ),
    ):
        out.append((name, kind, doc, [(name, {"model_name": model}, float(value))]))  # type: ignore[arg-type]
    out.append(
        (
            "moemeter_expert_hot_share",
            "gauge",
            "The hottest experts since the last scrape and their share of their layer's tokens.",
            [
                (
                    "moemeter_expert_hot_share",
                    {"expert": str(e), "layer": str(layer), "model_name": model, "position": str(i)},
                    s,
                )
                for i, (layer, e, s) in enumerate(w.hot, start=1)
            ],
        )
    )
    return out
