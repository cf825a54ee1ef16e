"""Expert routing in the twin's Wide-EP decode instance, and its EPLB.

Each MoE layer has its own popularity over logical experts: gated layers follow a Zipf law
whose exponent differs by layer and whose hot experts drift (a mean-reverting random walk in
log space); hash-routed layers send token t to expert hash(t) mod experts, so their skew is the
token-frequency skew and does not drift. Tokens x top-k are routed per tick; replicas of an
expert share its tokens evenly; a rank's load is what its slots receive (docs/definitions.md).

Every `rebalance_interval_seconds` the decode instance's EPLB re-plans the placement on the
last window's load with the planner (moemeter/contract/eplb.py), as vLLM's EPLB does.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from moemeter.contract.eplb import PlanInput, evaluate, plan

from .config import TwinProfile


@dataclass
class Rebalance:
    at: float  # epoch seconds
    duration_seconds: float
    moved_replicas: int
    balancedness_before: list[float]  # per layer, planned-on window under the old placement
    balancedness_planned: list[float]  # per layer, the same window under the new placement


@dataclass
class ExpertState:
    logical_tokens: np.ndarray  # [layers, experts] cumulative tokens routed (top-k counted)
    rank_tokens: np.ndarray  # [layers, ranks] cumulative tokens received by each rank's slots
    phy2log: np.ndarray  # [layers, slots] current placement
    balancedness: np.ndarray  # [layers] over the last tick
    last_load: np.ndarray  # [layers, experts] tokens routed in the last tick
    rebalances: list[Rebalance] = field(default_factory=list)  # the latest ones (snapshots carry these)
    rebalances_total: int = 0  # every rebalance since start (the counter)


class ExpertModel:
    def __init__(self, profile: TwinProfile, rng: np.random.Generator, start: float) -> None:
        m, topo, e = profile.model, profile.topology, profile.eplb
        self.profile, self.rng = profile, rng
        self.layers, self.experts = m.num_layers, m.routed_experts
        self.ranks = topo.decode_dp
        self.slots = self.experts + topo.eplb_redundant_experts
        self.hashed = min(m.hash_routed_layers, self.layers)
        skew = rng.uniform(e.skew_min, e.skew_max, self.layers)
        self.base_log = np.stack([np.log(rng.permutation(1.0 / np.arange(1, self.experts + 1) ** s)) for s in skew])
        for layer in range(self.hashed):
            self.base_log[layer] = np.log(self._hash_popularity(layer) + 1e-12)
        self.log_pop = self.base_log.copy()
        self.window: list[tuple[float, np.ndarray]] = []
        self.next_rebalance = start + e.rebalance_interval_seconds
        self._shares_for: np.ndarray | None = None  # the placement _slot_share was computed for
        self._slot_share = np.ones((self.layers, self.slots))
        self.state = ExpertState(
            logical_tokens=np.zeros((self.layers, self.experts)),
            rank_tokens=np.zeros((self.layers, self.ranks)),
            phy2log=self._plan(self.popularity()),
            balancedness=np.ones(self.layers),
            last_load=np.zeros((self.layers, self.experts)),
        )

    def _hash_popularity(self, layer: int) -> np.ndarray:
        e = self.profile.eplb
        freq = 1.0 / np.arange(1, e.vocabulary + 1) ** e.token_zipf
        ids = np.arange(e.vocabulary)
        buckets = np.array([zlib.crc32(f"{layer}:{t}".encode()) % self.experts for t in ids[:4096]])
        # The head of the vocabulary decides the skew; the tail spreads evenly.
        pop = np.bincount(buckets, weights=freq[:4096], minlength=self.experts)
        return pop + freq[4096:].sum() / self.experts

    def popularity(self) -> np.ndarray:
        p = np.exp(self.log_pop - self.log_pop.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)

    def _plan(self, load: np.ndarray) -> np.ndarray:
        e = self.profile.eplb
        inp = PlanInput(load, self.slots, e.expert_groups, e.nodes, self.ranks).validated()
        return plan(inp, e.policy).phy2log

    def _rank_load(self, load: np.ndarray) -> np.ndarray:
        phy2log = self.state.phy2log
        if self._shares_for is not phy2log:
            # Per-slot share of its expert's tokens, fixed until the placement changes.
            count = np.stack([np.bincount(row, minlength=self.experts) for row in phy2log])
            self._slot_share = 1.0 / np.take_along_axis(count, phy2log, axis=1)
            self._shares_for = phy2log
        slot_load = np.take_along_axis(load, phy2log, axis=1) * self._slot_share
        return slot_load.reshape(self.layers, self.ranks, -1).sum(axis=2)

    def step(self, tokens: float, t0: float, t1: float) -> None:
        """Route `tokens` decode tokens (each to top_k experts per layer) over [t0, t1)."""
        e, k = self.profile.eplb, self.profile.model.top_k
        dt = t1 - t0
        gated = slice(self.hashed, self.layers)
        sigma = e.drift_per_minute * np.sqrt(dt / 60.0)
        noise = self.rng.normal(0.0, sigma, self.log_pop[gated].shape)
        self.log_pop[gated] += noise - (self.log_pop[gated] - self.base_log[gated]) * min(1.0, dt / 1800.0)
        routed = int(round(tokens)) * k  # every token goes to top_k experts in every layer
        load = self.rng.multinomial(routed, self.popularity()).astype(float)  # row by row, as one call per layer
        st = self.state
        st.logical_tokens += load
        st.last_load = load
        rank_load = self._rank_load(load)
        peak = rank_load.max(axis=1)
        bal = np.divide(rank_load.mean(axis=1), peak, out=np.ones_like(peak), where=peak > 0)
        st.rank_tokens += rank_load
        st.balancedness = bal
        self.window.append((t1, load))
        self.window = [(t, w) for t, w in self.window if t > t1 - e.window_seconds]
        if t1 >= self.next_rebalance:
            self._rebalance(t1)
            self.next_rebalance = t1 + e.rebalance_interval_seconds

    def _rebalance(self, at: float) -> None:
        e, st = self.profile.eplb, self.state
        window = np.sum([w for _, w in self.window], axis=0)
        if window.sum() <= 0:
            return
        before = evaluate(window, st.phy2log, self.ranks)[1]
        new = self._plan(window)
        after = evaluate(window, new, self.ranks)[1]
        moved = int((new != st.phy2log).sum())
        duration = 0.05 + moved * e.expert_bytes / e.migration_bytes_per_second
        st.rebalances.append(
            Rebalance(at, duration, moved, np.nan_to_num(before).tolist(), np.nan_to_num(after).tolist())
        )
        st.rebalances = st.rebalances[-50:]
        st.rebalances_total += 1
        st.phy2log = new

    @property
    def mean_balancedness(self) -> float:
        return float(self.state.balancedness.mean())
