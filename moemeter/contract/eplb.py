"""EPLB placement policies: where each logical expert's replicas go, given observed load.

`vllm`: an independent implementation of vLLM's default policy (vLLM 0.32,
vllm/distributed/eplb/policy/default.py, after DeepSeek's EPLB): greedy replication of the
hottest expert, then greedy balanced packing — hierarchical (groups to nodes, then replicas
to GPUs inside each node) when the groups divide over the nodes, global otherwise. Ties break
as vLLM's do (numpy argsort of the negated float32 load, first argmin/argmax), so the
placement is the one vLLM would choose and the page can predict the next rebalance.
"Exact" means slot for slot the same as vLLM's code run with the same numpy on the same CPU
(tested from the vLLM environment). numpy's argsort orders equal loads by the CPU's SIMD sort
and its own version, so across machines only what ties cannot move is fixed: replica counts
and rank loads; vLLM's own placement varies the same way.

`refined`: same slots per GPU and every logical expert at least once, but packs globally and
then improves the packing by pairwise swaps out of the most loaded GPU; per layer it keeps
vLLM's placement where it would not be strictly better, so its maximum rank load is never
higher than `vllm`'s.

Pure numpy; no dependency on the rest of moemeter (the twin runs it too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from moemeter.contract.errors import MoemeterError

POLICIES = ("vllm", "refined")


class PlanError(MoemeterError, ValueError):
    """The planner input breaks a constraint; the message names it."""


@dataclass(frozen=True)
class PlanInput:
    weight: np.ndarray  # [layers, logical experts], observed load (tokens)
    num_replicas: int  # physical expert slots per layer, a multiple of num_gpus
    num_groups: int  # expert groups (logical experts divide evenly into them)
    num_nodes: int  # nodes with a fast intra-node network
    num_gpus: int  # EP ranks

    @classmethod
    def from_dict(cls, data: Any) -> PlanInput:
        if not isinstance(data, dict):
            raise PlanError("input must be a JSON object with weight, num_replicas, num_groups, num_nodes, num_gpus")
        missing = [k for k in ("weight", "num_replicas", "num_groups", "num_nodes", "num_gpus") if k not in data]
        if missing:
            raise PlanError(f"missing keys {missing}")
        ints = {}
        for key in ("num_replicas", "num_groups", "num_nodes", "num_gpus"):
            v = data[key]
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise PlanError(f"{key} must be a positive integer, got {v!r}")
            ints[key] = v
        rows = data["weight"]
        if not isinstance(rows, list) or not rows:
            raise PlanError("weight must be a non-empty list of layers, each a list of per-expert loads")
        for i, row in enumerate(rows):
            if not isinstance(row, list) or not row:
                raise PlanError(f"weight layer {i} is empty: every layer needs one load per logical expert")
            if len(row) != len(rows[0]):
                raise PlanError(f"weight layer {i} has {len(row)} experts, layer 0 has {len(rows[0])}")
        try:
            weight = np.asarray(rows, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise PlanError(f"weight must hold numbers only: {exc}") from exc
        return cls(weight, **ints).validated()

    def validated(self) -> PlanInput:
        w = self.weight
        if w.ndim != 2 or w.shape[0] == 0 or w.shape[1] == 0:
            raise PlanError("weight must be [layers][logical experts] with at least one of each")
        bad = np.argwhere(~np.isfinite(w))
        if bad.size:
            layer, expert = bad[0]
            raise PlanError(f"weight[{layer}][{expert}] is not finite ({w[layer, expert]}): loads must be finite")
        neg = np.argwhere(w < 0)
        if neg.size:
            layer, expert = neg[0]
            raise PlanError(f"weight[{layer}][{expert}] = {w[layer, expert]} is negative: loads must be >= 0")
        experts = w.shape[1]
        if experts % self.num_groups:
            raise PlanError(f"{experts} logical experts do not divide into num_groups={self.num_groups}")
        if self.num_replicas % self.num_gpus:
            raise PlanError(f"num_replicas={self.num_replicas} slots do not divide over num_gpus={self.num_gpus}")
        if self.num_replicas < experts:
            raise PlanError(f"num_replicas={self.num_replicas} is fewer than the {experts} logical experts")
        if self.num_gpus % self.num_nodes:
            raise PlanError(f"num_gpus={self.num_gpus} does not divide over num_nodes={self.num_nodes}")
        if self.hierarchical and (self.num_replicas // self.num_nodes) % (self.num_gpus // self.num_nodes):
            raise PlanError("slots per node do not divide over the GPUs of a node")
        return self

    @property
    def hierarchical(self) -> bool:
        """vLLM packs groups to nodes first only when the groups divide over the nodes."""
        return self.num_groups % self.num_nodes == 0


@dataclass(frozen=True)
class Plan:
    policy: str
    phy2log: np.ndarray  # [layers, slots]: logical expert in each physical slot (slot s is on GPU s // slots_per_gpu)
    rank_load: np.ndarray  # [layers, gpus]: tokens the GPU's slots receive, replicas sharing their expert's load evenly
    balancedness: np.ndarray  # [layers]: mean over GPUs / max over GPUs of rank load (1.0 = perfect)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "phy2log": self.phy2log.tolist(),
            "rank_load": self.rank_load.tolist(),
            "balancedness": [None if math.isnan(b) else float(b) for b in self.balancedness],
            "max_rank_load": self.rank_load.max(axis=1).tolist(),
        }


# --------------------------------------------------------------------------- pieces
def greedy_pack(weights: np.ndarray, packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Heaviest item first into the lightest pack that still has room; each pack gets
    len(weights) / packs items. Returns (pack of each item, position inside its pack)."""
    n = weights.shape[0]
    per_pack = n // packs
    if per_pack == 1:
        return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    pack_of = np.empty(n, dtype=np.int64)
    slot_of = np.empty(n, dtype=np.int64)
    totals = np.zeros(packs, dtype=np.float64)
    filled = np.zeros(packs, dtype=np.int64)
    for item in np.argsort(-weights):
        p = int(np.argmin(totals))  # a full pack holds +inf, so it is never the lightest
        pack_of[item], slot_of[item] = p, filled[p]
        totals[p] += weights[item]
        filled[p] += 1
        if filled[p] == per_pack:
            totals[p] = np.inf
    return pack_of, slot_of


def replicate(weights: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Give each extra slot to the expert with the highest load per replica.
    Returns (expert in each slot, replica count of each expert); slot e < len(weights) is expert e."""
    experts = weights.shape[0]
    slot_expert = np.concatenate([np.arange(experts, dtype=np.int64), np.zeros(slots - experts, dtype=np.int64)])
    count = np.ones(experts, dtype=np.int64)
    for s in range(experts, slots):
        e = int(np.argmax(weights / count))
        slot_expert[s] = e
        count[e] += 1
    return slot_expert, count


def evaluate(weight: np.ndarray, phy2log: np.ndarray, num_gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank load per layer and GPU, and balancedness (mean / max over GPUs) per layer."""
    layers, experts = weight.shape
    slots = phy2log.shape[1]
    rows = np.arange(layers)[:, None]
    count = np.zeros((layers, experts))
    np.add.at(count, (np.broadcast_to(rows, phy2log.shape), phy2log), 1)
    slot_load = weight[rows, phy2log] / count[rows, phy2log]
    rank_load = slot_load.reshape(layers, num_gpus, slots // num_gpus).sum(axis=2)
    peak = rank_load.max(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        balancedness = np.where(peak > 0, rank_load.mean(axis=1) / peak, np.nan)
    return rank_load, balancedness


# ------------------------------------------------------------------------------ vllm
def _vllm_layer(w: np.ndarray, inp: PlanInput) -> np.ndarray:
    groups, nodes = (inp.num_groups, inp.num_nodes) if inp.hierarchical else (1, 1)
    experts, slots, gpus = w.shape[0], inp.num_replicas, inp.num_gpus
    group_size, groups_per_node = experts // groups, groups // nodes
    experts_per_node, slots_per_node, gpus_per_node = experts // nodes, slots // nodes, gpus // nodes
    slots_per_gpu = slots // gpus
    # 1. groups to nodes; experts renumbered node by node, in packing order
    node_of_group, pos_of_group = greedy_pack(w.reshape(groups, group_size).sum(axis=-1), nodes)
    first = (node_of_group * groups_per_node + pos_of_group) * group_size
    node_order = (first[:, None] + np.arange(group_size, dtype=np.int64)).reshape(experts)
    expert_at = np.empty(experts, dtype=np.int64)
    expert_at[node_order] = np.arange(experts, dtype=np.int64)
    placement = np.empty(slots, dtype=np.int64)
    for node in range(nodes):
        local = expert_at[node * experts_per_node : (node + 1) * experts_per_node]
        local_load = w[local]
        # 2. replicas inside the node; 3. replicas to the node's GPUs
        slot_expert, count = replicate(local_load, slots_per_node)
        gpu_of, pos_of = greedy_pack((local_load / count)[slot_expert], gpus_per_node)
        ordered = np.empty(slots_per_node, dtype=np.int64)
        ordered[gpu_of * slots_per_gpu + pos_of] = slot_expert
        placement[node * slots_per_node : (node + 1) * slots_per_node] = local[ordered]
    return placement


def plan_vllm(inp: PlanInput) -> Plan:
    w32 = inp.weight.astype(np.float32)  # vLLM plans on the float32 load
    phy2log = np.stack([_vllm_layer(row, inp) for row in w32])
    rank_load, bal = evaluate(inp.weight, phy2log, inp.num_gpus)
    return Plan("vllm", phy2log, rank_load, bal)


# --------------------------------------------------------------------------- refined
def _swap_improve(slot_load: np.ndarray, max_rounds: int) -> np.ndarray:
    """slot_load [gpus, per_gpu]; returns a permutation of it (same shape, flat indices) that
    lowers the most loaded GPU by the best single swap, repeatedly."""
    gpus, per_gpu = slot_load.shape
    idx = np.arange(gpus * per_gpu).reshape(gpus, per_gpu)
    load = slot_load.copy()
    for _ in range(max_rounds):
        totals = load.sum(axis=1)
        h = int(np.argmax(totals))
        delta = load[h][None, :, None] - load[:, None, :]  # [g, i (on h), j (on g)]
        new_peak = np.maximum(totals[h] - delta, totals[:, None, None] + delta)
        new_peak[h] = np.inf
        new_peak[delta <= 0] = np.inf
        g, i, j = np.unravel_index(int(np.argmin(new_peak)), new_peak.shape)
        if not new_peak[g, i, j] < totals[h] - 1e-12 * max(1.0, totals[h]):
            break
        load[h, i], load[g, j] = load[g, j], load[h, i]
        idx[h, i], idx[g, j] = idx[g, j], idx[h, i]
    return idx


def plan_refined(inp: PlanInput, baseline: Plan | None = None) -> Plan:
    baseline = baseline or plan_vllm(inp)
    slots, gpus = inp.num_replicas, inp.num_gpus
    per_gpu = slots // gpus
    phy2log = baseline.phy2log.copy()
    for layer, w in enumerate(inp.weight):
        slot_expert, count = replicate(w, slots)
        per_slot = (w / count)[slot_expert]
        gpu_of, pos_of = greedy_pack(per_slot, gpus)
        ordered = np.empty(slots, dtype=np.int64)
        ordered[gpu_of * per_gpu + pos_of] = slot_expert
        order = _swap_improve((w / count)[ordered].reshape(gpus, per_gpu), max_rounds=20 * gpus).ravel()
        candidate = ordered[order]
        cand_peak = evaluate(w[None, :], candidate[None, :], gpus)[0].max()
        if cand_peak < baseline.rank_load[layer].max():
            phy2log[layer] = candidate
    rank_load, bal = evaluate(inp.weight, phy2log, gpus)
    return Plan("refined", phy2log, rank_load, bal)


def plan(inp: PlanInput, policy: str) -> Plan:
    if policy == "vllm":
        return plan_vllm(inp)
    if policy == "refined":
        return plan_refined(inp)
    raise PlanError(f"unknown policy {policy!r}; choose one of {list(POLICIES)}")
