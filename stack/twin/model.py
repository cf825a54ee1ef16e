"""The rack twin's behaviour: an AgentX-like closed-loop workload served by PD-disaggregated vLLM.

Each agent holds at most one request in flight: it asks, waits for the prefill pool (FIFO per
engine, session affinity to one prefill instance for prefix-cache hits), the KV hand-over
(NIXL, time = latency + bytes / bandwidth), then decodes on one data-parallel rank of the
Wide-EP decode instance, whose step time follows the largest batch and context on any rank
(all ranks step together), then thinks and asks again with a longer context.

Time advances in fixed ticks from a given start, so a seed and a start time give the same
counters whatever the wall clock does. The model writes stats.py's plain state only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import TwinProfile
from .experts import ExpertModel
from .faults import PREEMPTIONS_PER_SECOND, Fault, FaultMap
from .gateway_log import TwinGatewayLog
from .stats import GpuStats, InstanceStats, RouterStats

THINK, PREFILL, DECODE = 0, 1, 2
TICK_SECONDS = 0.1  # small, so a scrape sees counters at most this stale (real vLLM updates per step)
BLOCK_TOKENS = 64  # KV block size; cached prefixes are whole blocks
HARDWARE_SECONDS = 0.5  # GPU power, utilisation and energy are integrated at this step
STOP_SHARE = 0.93  # share of turns that end with a stop token rather than max_tokens


@dataclass(frozen=True)
class Placement:
    """Where a GPU sits: tray, index in tray, role, vLLM instance index and engine (DP rank)."""

    tray: int
    gpu: int
    role: str
    instance: int
    engine: int


def gpu_placements(profile: TwinProfile) -> list[Placement]:
    """Prefill GPUs fill the first trays, decode ranks the rest, in order."""
    topo = profile.topology
    out: list[Placement] = []
    for i in range(topo.total_gpus):
        tray, gpu = divmod(i, topo.gpus_per_tray)
        if i < topo.prefill_gpus:
            inst, eng = divmod(i, topo.prefill_dp)
            out.append(Placement(tray, gpu, "prefill", inst, eng))
        elif i < topo.prefill_gpus + topo.decode_gpus:
            inst, eng = divmod(i - topo.prefill_gpus, topo.decode_dp)
            out.append(Placement(tray, gpu, "decode", inst, eng))
        else:
            out.append(Placement(tray, gpu, "spare", -1, -1))
    return out


class RackModel:
    """State of the whole rack; `advance(t)` moves it forward to time t (epoch seconds)."""

    def __init__(
        self,
        profile: TwinProfile,
        seed: int = 0,
        start: float = 0.0,
        prefill_urls: list[str] | None = None,
        decode_urls: list[str] | None = None,
        tick: float = TICK_SECONDS,
        faults: tuple[Fault, ...] = (),
    ) -> None:
        self.profile = profile
        self.tick = tick
        self.faults = FaultMap(faults, profile.topology.decode_instances, profile.topology.decode_dp)
        self.fault_rng = np.random.default_rng([seed, 2])  # its own stream: no fault, the same rack
        self.preempt_carry = np.zeros(profile.topology.decode_instances * profile.topology.decode_dp)
        self.overhead_rng = np.random.default_rng(seed + 1_000_003)  # apart, so the workload stream is unchanged
        self.step_carry = np.zeros(profile.topology.decode_instances)
        self.spec_rng = np.random.default_rng([seed, 3])  # the draft path's own stream, likewise
        self.rng = np.random.default_rng(seed)
        self.now = start
        topo, wl = profile.topology, profile.workload
        m = profile.model
        # Each pool's engines in one block of state (series = the engine's index in the pool), its
        # instances views of their rows: a pass updates every instance of a pool at once.
        self.prefill_pool, self.decode_pool = (
            InstanceStats.new(role, role, gpus, m.max_model_len, profile.custom_histogram_buckets, start)
            for role, gpus in (("prefill", topo.prefill_gpus), ("decode", topo.decode_gpus))
        )
        spec = profile.speculative
        self.draft_tokens = spec.num_speculative_tokens if spec.enabled else 0
        if self.draft_tokens:  # vLLM exports the spec-decode families only with a speculative config
            self.decode_pool.counters["spec_drafts"] = np.zeros(topo.decode_gpus)
            self.decode_pool.counters["spec_accepted_per_pos"] = np.zeros((topo.decode_gpus, self.draft_tokens))
        self.prefill = [
            self.prefill_pool.rows(f"prefill-{i}", topo.prefill_dp, i * topo.prefill_dp)
            for i in range(topo.prefill_instances)
        ]
        self.decode = [
            self.decode_pool.rows(f"decode-{i}", topo.decode_dp, i * topo.decode_dp)
            for i in range(topo.decode_instances)
        ]
        self.router = RouterStats(
            prefill_urls or [f"prefill-{i}" for i in range(topo.prefill_instances)],
            decode_urls or [f"decode-{i}" for i in range(topo.decode_instances)],
        )
        self.placements = gpu_placements(profile)
        self._roles = np.array([p.role for p in self.placements])
        self.experts = ExpertModel(profile, np.random.default_rng([seed, 1]), start)
        self.gpus = [
            GpuStats(i, f"GPU-{seed:04x}{i:04x}-7e1d-4c2a-9b3f-{i:012x}", f"00000000:{0x10 + i % 4:02X}:00.0")
            for i in range(topo.total_gpus)
        ]
        n_pf = topo.prefill_gpus
        n_dc = topo.decode_gpus
        self.prefill_busy_until = np.full(n_pf, start)
        self.prefill_busy_seconds = np.zeros(n_pf)  # busy time since the last hardware update
        self._hardware_at = start
        self.decode_step_seconds = profile.performance.decode_step_base_seconds
        slots = (m.routed_experts + topo.eplb_redundant_experts) / topo.decode_dp  # physical experts per rank
        self.expert_weight_bytes = slots * profile.eplb.expert_bytes * m.num_layers
        self.decode_batch = np.zeros(n_dc)
        self.decode_context = np.zeros(n_dc)
        # One slot per agent: at most one request in flight each.
        n = wl.agents
        self.user = self.rng.integers(0, wl.users, n)
        self.state = np.full(n, THINK)
        self.wake = start + self.rng.exponential(wl.think_seconds_mean, n)
        self.context = np.zeros(n)  # tokens in the session so far (0 = new session)
        self.cached_prompt = np.zeros(n)  # prompt tokens of the previous turn (prefill-cached)
        self.turns_left = np.zeros(n, dtype=int)
        self.pf_engine = np.zeros(n, dtype=int)
        self.dc_engine = np.zeros(n, dtype=int)
        self.arrival = np.zeros(n)
        self.prompt = np.zeros(n)
        self.cached = np.zeros(n)
        self.target_out = np.zeros(n)
        self.stopped = np.zeros(n, dtype=bool)
        self.prefill_start = np.zeros(n)
        self.prefill_end = np.zeros(n)
        self.prefill_recorded = np.zeros(n, dtype=bool)
        self.kv_ready = np.zeros(n)
        self.first_token = np.full(n, np.nan)
        self.progress = np.zeros(n)
        self.speed = np.ones(n)
        self.workload_class = np.zeros(n, dtype=int)  # index into config.WORKLOAD_CLASSES
        self.acceptance = np.zeros(n)  # p: each drafted token accepted given the ones before it were
        self.steps = np.zeros(n)  # engine steps the request has decoded in (fractional, as progress)
        # Ground truth for calibration and tests: per-request mean inter-token gaps, recent.
        self.finished_tpot: list[float] = []
        self.totals = {"prompt_tokens": 0.0, "generation_tokens": 0.0, "requests": 0.0}
        self.gateway = TwinGatewayLog(seed, profile.model.name)

    # ------------------------------------------------------------------ time
    def advance(self, until: float) -> None:
        """Run whole ticks up to `until`."""
        while self.now + self.tick <= until:
            self._tick(self.now, self.now + self.tick)
            self.now += self.tick

    def _tick(self, t0: float, t1: float) -> None:
        self._admit(t0, t1)
        self._finish_prefill(t1)
        self._decode(t0, t1)
        self._gauges(t1)
        if t1 - self._hardware_at >= HARDWARE_SECONDS - 1e-9:
            self._hardware(t1 - self._hardware_at)
            self._hardware_at = t1

    # ------------------------------------------------------------ arrivals
    def _admit(self, t0: float, t1: float) -> None:
        wl, perf, topo = self.profile.workload, self.profile.performance, self.profile.topology
        due = np.flatnonzero((self.state == THINK) & (self.wake < t1))
        if due.size == 0:
            return
        due = due[np.argsort(self.wake[due], kind="stable")]
        rng = self.rng
        new_tokens = rng.exponential(wl.turn_tokens_mean, due.size).astype(int) + 64
        first_tokens = rng.exponential(wl.first_turn_tokens, due.size).astype(int) + 64
        out_tokens = np.minimum(rng.exponential(wl.output_tokens_mean, due.size).astype(int) + 16, 16384)
        keep = rng.random(due.size) < wl.prefix_cache_keep
        speed = np.exp(rng.normal(0.0, perf.decode_speed_jitter, due.size))
        stops = rng.random(due.size) < STOP_SHARE
        session_turns = rng.geometric(1.0 / wl.turns_per_session_mean, due.size)
        instances = rng.integers(0, topo.prefill_instances, due.size)
        # Each request on its own, all at once: an agent is due once a tick.
        sys_tokens, dp = wl.system_prompt_tokens, topo.prefill_dp
        context = self.context[due]
        fresh = (context == 0) | (self.turns_left[due] <= 0) | (context > wl.max_context_tokens)
        prompt = np.where(fresh, sys_tokens + first_tokens, context + new_tokens)
        self.context[due] = prompt
        self.cached_prompt[due] = np.where(fresh, sys_tokens, self.cached_prompt[due])
        self.turns_left[due] = np.where(fresh, session_turns, self.turns_left[due])
        pf = np.where(fresh, instances * dp, self.pf_engine[due])  # session affinity: instance
        cached = np.where(keep, self.cached_prompt[due], sys_tokens)
        cached = np.minimum(prompt - 1, (cached // BLOCK_TOKENS) * BLOCK_TOKENS)
        computed = prompt - cached
        service = (
            perf.prefill_step_base_seconds
            + computed / perf.prefill_tokens_per_second
            + cached * perf.prefill_per_cached_token_seconds
        )
        # In order of arrival, to the least busy engine of the instance (the first of equals).
        busy = self.prefill_busy_until.tolist()
        arrival = self.wake[due]
        start = np.empty(due.size)
        engine = np.empty(due.size, dtype=self.pf_engine.dtype)
        for k, (at, base, took) in enumerate(zip(arrival.tolist(), ((pf // dp) * dp).tolist(), service.tolist())):
            e = min(range(base, base + dp), key=busy.__getitem__)
            start[k] = begin = max(at, busy[e])
            busy[e] = begin + took
            engine[k] = e
        self.prefill_busy_until[:] = busy
        self.pf_engine[due] = engine
        self.arrival[due] = arrival
        self.prompt[due] = prompt
        self.cached[due] = cached
        self.target_out[due] = np.where(stops, out_tokens, np.maximum(out_tokens, 1024))
        self.stopped[due] = stops
        self.prefill_start[due] = start
        self.prefill_end[due] = start + service
        self.prefill_recorded[due] = False
        self.speed[due] = speed
        self._draw_acceptance(due)
        self.state[due] = PREFILL
        self.totals["requests"] += due.size
        # Busy time inside this tick (for GPU utilisation).
        idx = self.pf_engine[due]
        overlap = np.clip(np.minimum(self.prefill_end[due], t1) - np.maximum(self.prefill_start[due], t0), 0, None)
        np.add.at(self.prefill_busy_seconds, idx, overlap)

    def _finish_prefill(self, t1: float) -> None:
        """Prefill passes that ended before t1: record them, hand the KV over to a decode rank."""
        perf, topo, m = self.profile.performance, self.profile.topology, self.profile.model
        done = np.flatnonzero((self.state == PREFILL) & ~self.prefill_recorded & (self.prefill_end < t1))
        if done.size == 0:
            return
        self.prefill_recorded[done] = True
        pf_global = self.pf_engine[done]
        inst_idx = pf_global // topo.prefill_dp
        prompt, cached = self.prompt[done], self.cached[done]
        computed = prompt - cached
        queue = self.prefill_start[done] - self.arrival[done]
        service = self.prefill_end[done] - self.prefill_start[done]
        ttft = self.prefill_end[done] - self.arrival[done]
        e, c, h = pf_global, self.prefill_pool.counters, self.prefill_pool.histograms
        for name, vals in (
            ("prompt_tokens", prompt),
            ("prompt_local_compute", computed),
            ("prompt_local_cache_hit", cached),
            ("cached_device", cached),
            ("prefix_cache_queries", prompt),
            ("prefix_cache_hits", cached),
        ):
            np.add.at(c[name], e, vals)
        np.add.at(c["generation_tokens"], e, 1)
        np.add.at(c["success_length"], e, 1)
        np.add.at(c["estimated_flops"], e, 2e9 * m.active_params_billion * computed * m.prefill_layers / m.num_layers)
        np.add.at(c["estimated_read_bytes"], e, prompt * m.kv_bytes_per_token)
        np.add.at(c["estimated_write_bytes"], e, computed * m.kv_bytes_per_token)
        h["vllm:request_prompt_tokens"].observe(e, prompt)
        h["vllm:request_prefill_kv_computed_tokens"].observe(e, computed)
        h["vllm:iteration_tokens_total"].observe(e, computed)
        ones, zeros = np.ones(done.size), np.zeros(done.size)
        for fam in (
            "vllm:request_generation_tokens",
            "vllm:request_max_num_generation_tokens",
            "vllm:request_params_n",
            "vllm:request_params_max_tokens",
        ):
            h[fam].observe(e, ones)  # a prefill request asks for max_tokens 1 and gets one token
        h["vllm:request_num_preemptions"].observe(e, zeros)
        h["vllm:time_to_first_token_seconds"].observe(e, ttft)
        h["vllm:request_time_per_output_token_seconds"].observe(e, zeros)
        h["vllm:e2e_request_latency_seconds"].observe(e, ttft)
        h["vllm:request_queue_time_seconds"].observe(e, queue)
        h["vllm:request_inference_time_seconds"].observe(e, service)
        h["vllm:request_prefill_time_seconds"].observe(e, service)
        self._phases(self.prefill_pool, e, service, 1.0)
        h["vllm:request_decode_time_seconds"].observe(e, zeros)
        for inst, n in zip(self.prefill, np.bincount(inst_idx, minlength=len(self.prefill)), strict=True):
            if n:
                self._api_output(inst, float(n))
                inst.http_requests += n
        self.totals["prompt_tokens"] += prompt.sum()
        # KV hand-over to the least loaded decode rank (the decode instance's DP balancer).
        n_dc = topo.decode_gpus
        handed_over = (self.state == PREFILL) & self.prefill_recorded
        handed_over[done] = False
        load = np.bincount(self.dc_engine[(self.state == DECODE) | handed_over], minlength=n_dc).astype(float)
        kv_bytes = prompt * m.kv_bytes_per_token
        xfer = perf.kv_transfer_latency_seconds + kv_bytes / perf.kv_transfer_bandwidth_bytes_per_second
        order = np.argsort(self.prefill_end[done], kind="stable")
        noise = self.rng.random((done.size, n_dc)) * 0.5  # the draws one per request would give, at once
        for k, j in enumerate(order):
            a = done[j]
            d = int(np.argmin(load + noise[k]))
            load[d] += 1
            self.dc_engine[a] = d
            self.first_token[a] = np.nan
            self.progress[a] = 0.0
            self.steps[a] = 0.0
        # Faults (faults.py): a slow link to a straggler, failed transfers read a second time.
        fm, dc = self.faults, self.dc_engine[done]
        xfer = xfer * fm.kv_slowdown[dc]
        failed = np.zeros(done.size)
        if fm.failure_share.any():
            failed = (self.fault_rng.random(done.size) < fm.failure_share[dc]).astype(float)
            xfer = xfer * (1.0 + failed)
        self.kv_ready[done] = self.prefill_end[done] + xfer
        h = self.decode_pool.histograms
        h["vllm:nixl_xfer_time_seconds"].observe(dc, xfer)
        h["vllm:nixl_post_time_seconds"].observe(dc, np.full(done.size, perf.kv_transfer_latency_seconds * 0.4))
        h["vllm:nixl_bytes_transferred"].observe(dc, kv_bytes)
        h["vllm:nixl_num_descriptors"].observe(dc, np.ceil(prompt / BLOCK_TOKENS))
        np.add.at(self.decode_pool.counters["nixl_failed_transfers"], dc, failed)
        self._router_requests(done, pf_global, self.dc_engine[done], xfer)

    def _router_requests(
        self, agents: np.ndarray, pf_global: np.ndarray, dc_global: np.ndarray, xfer: np.ndarray
    ) -> None:
        r, topo = self.router, self.profile.topology
        chat = self.user[agents] % 10 < 7  # most agents speak the chat API
        r.requests_by_route[r.routes[0]] += float(chat.sum())
        r.requests_by_route[r.routes[1]] += float((~chat).sum())
        for url, n in zip(r.prefill_urls, np.bincount(pf_global // topo.prefill_dp, minlength=len(r.prefill_urls))):
            r.prefill_requests[url] += float(n)
        for url, n in zip(r.decode_urls, np.bincount(dc_global // topo.decode_dp, minlength=len(r.decode_urls))):
            r.decode_requests[url] += float(n)
        r.decode_pending_recent = np.concatenate([r.decode_pending_recent, xfer])[-2048:]
        r.decode_pending_sum += float(xfer.sum())
        r.decode_pending_count += float(xfer.size)

    # ---------------------------------------------------------------- decode
    def _decode(self, t0: float, t1: float) -> None:
        perf, topo, m = self.profile.performance, self.profile.topology, self.profile.model
        n_dc = topo.decode_gpus
        entering = np.flatnonzero((self.state == PREFILL) & self.prefill_recorded & (self.kv_ready < t1))
        self.state[entering] = DECODE
        active = np.flatnonzero(self.state == DECODE)
        ctx = self.prompt[active] + self.progress[active]
        batch = np.bincount(self.dc_engine[active], minlength=n_dc).astype(np.float64)
        context = np.bincount(self.dc_engine[active], weights=ctx, minlength=n_dc).astype(np.float64)
        self.decode_batch, self.decode_context = batch, context
        self._preempt(context, t1 - t0)
        # A sequence counts for the part of the tick it is in the batch (long fast-forward ticks
        # would otherwise charge every step with sequences that join late or leave early).
        begin = np.maximum(t0, self.kv_ready[active])
        # A request steps every `gap` seconds and emits `per_step` tokens a step: the bonus token and
        # the drafts accepted, 1 + p + ... + p^k on average (1 without a draft path).
        k = self.draft_tokens
        p = self._acceptance_now(active)
        per_step = 1.0 + (p * (1.0 - p**k) / (1.0 - p) if k else 0.0)
        leave = begin + (self.target_out[active] - self.progress[active]) * (
            self.decode_step_seconds * self.speed[active] / per_step
        )
        share = np.clip((np.minimum(leave, t1) - begin) / (t1 - t0), 0.0, 1.0)
        busy_batch = np.bincount(self.dc_engine[active], weights=share, minlength=n_dc)
        busy_context = np.bincount(self.dc_engine[active], weights=ctx * share, minlength=n_dc)
        # All ranks step together: the busiest rank's batch and context, and the MoE part
        # stretched by expert imbalance (the hottest rank's experts gate every layer). With a draft
        # path each request verifies its k drafts in the same pass, and the draft stage runs k passes.
        spec = self.profile.speculative
        step = (
            perf.decode_step_base_seconds
            + k * spec.draft_pass_seconds
            + perf.decode_step_per_request_seconds
            * (1.0 + spec.verify_cost * k)
            * busy_batch.max(initial=0)
            / self.experts.mean_balancedness
            + perf.decode_step_per_context_token_seconds * busy_context.max(initial=0)
        )
        self.decode_step_seconds = step
        if active.size == 0:
            self.experts.step(0.0, t0, t1)
            return
        gap = step * self.speed[active]
        itl = gap / per_step
        # The first token comes one step after the KV is in place.
        newly = np.isnan(self.first_token[active])
        self.first_token[active[newly]] = self.kv_ready[active[newly]] + step
        avail = np.clip(t1 - begin, 0.0, None)
        before = self.progress[active]
        after = before + avail / itl
        target = self.target_out[active]
        finished = after >= target
        after = np.minimum(after, target)
        emitted = np.floor(after) - np.floor(before)
        self.progress[active] = after
        steps_before = self.steps[active]
        stepped = (after - before) / per_step  # engine steps this tick (fractional, as progress is)
        self.steps[active] = steps_before + stepped
        finish_time = begin + (target - before) * itl
        dinst, deng = np.divmod(self.dc_engine[active], topo.decode_dp)
        # vLLM observes inter-token latency once per engine step that gave the request tokens (a
        # step's accepted drafts arrive together): the first step's gap is its TTFT, not counted.
        gaps = np.maximum(np.floor(steps_before + stepped) - np.floor(steps_before) - newly, 0)
        verified = stepped * (1.0 + k)  # positions the target model computed: emitted + rejected drafts
        for i, inst in enumerate(self.decode):
            sel = dinst == i
            e = deng[sel]
            np.add.at(inst.counters["generation_tokens"], e, emitted[sel])
            np.add.at(inst.counters["estimated_flops"], e, 2e9 * m.active_params_billion * verified[sel])
            np.add.at(inst.counters["estimated_read_bytes"], e, stepped[sel] * ctx[sel] * m.kv_bytes_per_token / 64)
            np.add.at(inst.counters["estimated_write_bytes"], e, verified[sel] * m.kv_bytes_per_token)
            inst.histograms["vllm:inter_token_latency_seconds"].observe(e, gap[sel], gaps[sel])
            if k:
                np.add.at(inst.counters["spec_drafts"], e, stepped[sel])
                accepted = stepped[sel, None] * p[sel, None] ** np.arange(1, k + 1)  # position i: p^(i+1)
                np.add.at(inst.counters["spec_accepted_per_pos"], e, accepted)
            steps = (t1 - t0) / step
            # Whole steps only (histogram counts are integers); the remainder carries to the next tick.
            self.step_carry[i] += steps
            whole = float(np.floor(self.step_carry[i]))
            self.step_carry[i] -= whole
            self._phases(inst, np.arange(inst.dp), np.full(inst.dp, step), whole)  # all ranks step together
            self._api_output(inst, whole * inst.dp)
            eng_batch = batch[i * topo.decode_dp : (i + 1) * topo.decode_dp]
            busy = np.flatnonzero(eng_batch > 0)
            scheduled = eng_batch[busy] * (1 + k)  # each request's bonus position and its k drafts
            inst.histograms["vllm:iteration_tokens_total"].observe(busy, scheduled, steps)
            # each step reads the rank's routed-expert weights once, whatever its batch (decode is
            # bound by these reads and the KV's, not by its FLOPs)
            inst.counters["estimated_read_bytes"][busy] += steps * self.expert_weight_bytes
        self.totals["generation_tokens"] += emitted.sum()
        self.experts.step(float(emitted.sum()), t0, t1)
        done = active[finished]
        if done.size:
            self._finish_decode(done, finish_time[finished])

    def _draw_acceptance(self, agents: np.ndarray) -> None:
        """Each new turn's class (tool call, code, free text) and its drafts' acceptance p."""
        spec, rng = self.profile.speculative, self.spec_rng
        cls = rng.choice(len(spec.class_shares), size=agents.size, p=np.asarray(spec.class_shares))
        mean = np.asarray(spec.class_acceptance)[cls]
        conc = spec.acceptance_concentration
        self.workload_class[agents] = cls
        self.acceptance[agents] = np.clip(rng.beta(mean * conc, (1.0 - mean) * conc), 1e-6, 1.0 - 1e-6)

    def _acceptance_now(self, agents: np.ndarray) -> np.ndarray:
        """p of each agent's request on the engine decoding it (a collapsed draft path drags it down)."""
        collapsed = self.faults.draft_collapse[self.dc_engine[agents]]
        return np.where(collapsed, self.profile.speculative.collapsed_acceptance, self.acceptance[agents])

    def _preempt(self, context: np.ndarray, dt: float) -> None:
        """A KV-saturated engine (faults.py) preempts while its sequences outgrow its cache."""
        capacity = self.faults.kv_capacity
        if (capacity == 1.0).all():
            return
        full = (capacity < 1.0) & (context > self.profile.performance.decode_kv_capacity_tokens * capacity)
        self.preempt_carry[full] += dt * PREEMPTIONS_PER_SECOND
        whole = np.floor(self.preempt_carry)
        self.preempt_carry -= whole
        dp = self.profile.topology.decode_dp
        for i, inst in enumerate(self.decode):
            inst.counters["num_preemptions"] += whole[i * dp : (i + 1) * dp]

    def _phases(self, stats: InstanceStats, engines: np.ndarray, step: np.ndarray, weight: float) -> None:
        """The plugin's view of `weight` engine steps of `step` seconds on each of `engines`."""
        o = self.profile.overhead
        shares = {
            "schedule": o.schedule_fraction,
            "prepare_inputs": o.prepare_inputs_fraction,
            "sample": o.sample_fraction,
            "update": o.update_fraction,
            "forward": o.forward_fraction(),
        }
        stats.phases["step"].observe(engines, step, weight)
        for phase, share in shares.items():
            stats.phases[phase].observe(engines, step * share, weight)

    def _api_output(self, inst: InstanceStats, steps: float) -> None:
        """The instance's API server handles each of `steps` engine steps' outputs once."""
        jitter = float(np.exp(self.overhead_rng.normal(0.0, 0.25)))
        inst.api_output.observe(0, self.profile.overhead.api_output_seconds * jitter, steps)

    def _finish_decode(self, agents: np.ndarray, finish: np.ndarray) -> None:
        topo, wl = self.profile.topology, self.profile.workload
        n_out = self.target_out[agents]
        prompt = self.prompt[agents]
        arrive = self.prefill_end[agents]  # the router posts to decode once prefill answers
        first = self.first_token[agents]
        decode_time = np.maximum(finish - first, 0.0)
        tpot = np.where(n_out > 1, decode_time / np.maximum(n_out - 1, 1), 0.0)
        e, c, h = self.dc_engine[agents], self.decode_pool.counters, self.decode_pool.histograms
        stopped = self.stopped[agents]
        for name in (
            "prompt_tokens",
            "prompt_external_kv_transfer",
            "cached_p2p",
            "external_prefix_cache_queries",
            "external_prefix_cache_hits",
        ):
            np.add.at(c[name], e, prompt)
        np.add.at(c["success_stop"], e, stopped)
        np.add.at(c["success_length"], e, ~stopped)
        kv_ready = self.kv_ready[agents]
        h["vllm:request_prompt_tokens"].observe(e, prompt)
        h["vllm:request_prefill_kv_computed_tokens"].observe(e, prompt)
        h["vllm:request_generation_tokens"].observe(e, n_out)
        h["vllm:request_max_num_generation_tokens"].observe(e, np.full(agents.size, 16384.0))
        h["vllm:request_params_max_tokens"].observe(e, np.full(agents.size, 16384.0))
        h["vllm:request_params_n"].observe(e, np.ones(agents.size))
        h["vllm:request_num_preemptions"].observe(e, np.zeros(agents.size))
        h["vllm:time_to_first_token_seconds"].observe(e, first - arrive)
        h["vllm:request_time_per_output_token_seconds"].observe(e, tpot)
        h["vllm:e2e_request_latency_seconds"].observe(e, finish - arrive)
        h["vllm:request_queue_time_seconds"].observe(e, kv_ready - arrive)
        h["vllm:request_inference_time_seconds"].observe(e, finish - kv_ready)
        h["vllm:request_prefill_time_seconds"].observe(e, first - kv_ready)
        h["vllm:request_decode_time_seconds"].observe(e, decode_time)
        for inst, n in zip(self.decode, np.bincount(e // topo.decode_dp, minlength=len(self.decode)), strict=True):
            inst.http_requests += n
        chat = self.user[agents] % 10 < 7
        r = self.router
        assert r.duration is not None
        r.duration.observe(np.where(chat, 0, 1), finish - self.arrival[agents])
        self.gateway.add(
            self.user[agents], self.arrival[agents], first, finish, prompt, self.cached[agents], n_out, tpot
        )
        self.finished_tpot.extend(tpot[n_out > 1].tolist())
        if len(self.finished_tpot) > 200_000:
            del self.finished_tpot[:100_000]
        # Next turn: the answer joins the context; the prompt just served is now prefix-cached.
        self.cached_prompt[agents] = prompt
        self.context[agents] = prompt + n_out
        self.turns_left[agents] -= 1
        self.state[agents] = THINK
        self.wake[agents] = finish + self.rng.exponential(wl.think_seconds_mean, agents.size)

    # ---------------------------------------------------------------- gauges
    def _gauges(self, t1: float) -> None:
        topo, perf = self.profile.topology, self.profile.performance
        n_pf, n_dc = topo.prefill_gpus, topo.decode_gpus
        in_pf = (self.state == PREFILL) & ~self.prefill_recorded
        running_pf = np.bincount(self.pf_engine[in_pf & (self.prefill_start <= t1)], minlength=n_pf)
        waiting_pf = np.bincount(self.pf_engine[in_pf & (self.prefill_start > t1)], minlength=n_pf)
        fetching = (self.state == PREFILL) & self.prefill_recorded
        waiting_dc = np.bincount(self.dc_engine[fetching], minlength=n_dc).astype(float)
        # Prefix-cache residency: contexts of sessions homed on each prefill engine.
        live = self.context > 0
        pf_ctx = np.bincount(self.pf_engine[live], weights=self.context[live], minlength=n_pf)
        for i, inst in enumerate(self.prefill):
            s = slice(i * topo.prefill_dp, (i + 1) * topo.prefill_dp)
            g = inst.gauges
            g["running"][:] = running_pf[s]
            g["waiting"][:] = waiting_pf[s]
            g["waiting_capacity"][:] = waiting_pf[s]
            g["kv_cache_usage"][:] = np.minimum(pf_ctx[s] / perf.prefill_kv_capacity_tokens, 1.0)
        for i, inst in enumerate(self.decode):
            s = slice(i * topo.decode_dp, (i + 1) * topo.decode_dp)
            g = inst.gauges
            g["running"][:] = self.decode_batch[s]
            g["waiting"][:] = waiting_dc[s]
            g["waiting_deferred"][:] = waiting_dc[s]
            g["kv_fetch_in_progress"][:] = waiting_dc[s]
            capacity = perf.decode_kv_capacity_tokens * self.faults.kv_capacity[s]
            g["kv_cache_usage"][:] = np.minimum(self.decode_context[s] / capacity, 1.0)
        r = self.router
        for i, url in enumerate(r.prefill_urls):
            s = slice(i * topo.prefill_dp, (i + 1) * topo.prefill_dp)
            sel = in_pf & (self.pf_engine // topo.prefill_dp == i)
            r.active_prefill_tokens[url] = float((self.prompt[sel] - self.cached[sel]).sum())
            r.prefill_occupancy[url] = float(np.minimum(running_pf[s], 1).mean())
        for i, url in enumerate(r.decode_urls):
            s = slice(i * topo.decode_dp, (i + 1) * topo.decode_dp)
            r.active_decode_requests[url] = float(self.decode_batch[s].sum())
            r.pending_decode_requests[url] = float(waiting_dc[s].sum())

    def _hardware(self, dt: float) -> None:
        """Every GPU's power, utilisation, memory and energy over the last `dt` seconds, at once."""
        topo, role = self.profile.topology, self._roles
        idle, peak = topo.gpu_power_idle_watts, topo.gpu_power_max_watts
        prefill, decode = role == "prefill", role == "decode"
        busy = np.zeros(len(role))
        intensity = np.zeros(len(role))
        kv = np.zeros(len(role))
        busy[prefill] = np.minimum(self.prefill_busy_seconds / dt, 1.0)
        intensity[prefill] = busy[prefill] * 0.85
        kv[prefill] = np.concatenate([s.gauges["kv_cache_usage"] for s in self.prefill])
        busy[decode] = 1.0 if self.decode_batch.sum() > 0 else 0.0  # ranks step together
        bmax = max(self.decode_batch.max(initial=0), 1.0)
        intensity[decode] = busy[decode] * (0.35 + 0.5 * self.decode_batch / bmax)
        kv[decode] = np.concatenate([s.gauges["kv_cache_usage"] for s in self.decode])
        noise = self.rng.normal(0, 0.01, len(role))  # one draw per GPU, in order
        util = np.clip(100 * busy - abs(noise) * 100, 0, 100)
        power = idle + (peak - idle) * np.clip(intensity + noise, 0, 1)
        columns = (
            util,
            np.clip(intensity * 0.8 + noise, 0, 1),
            np.clip(intensity * 0.6 + noise, 0, 1),
            power,
            power * dt * 1000.0,
            0.55 * topo.gpu_memory_mib + 0.4 * topo.gpu_memory_mib * kv,
            28 + 0.035 * power,
            intensity * 4e11 * dt,
        )
        for g, (u, tensor, dram, watts, joules, fb, temp, nvlink) in zip(
            self.gpus, zip(*(c.tolist() for c in columns)), strict=True
        ):
            g.util, g.tensor_active, g.dram_active, g.power_watts = u, tensor, dram, watts
            g.energy_mj += joules
            g.fb_used_mib, g.temp_c = fb, temp
            g.nvlink_bytes += nvlink
        self.prefill_busy_seconds[:] = 0.0


def p90_per_user_tokens_per_second(tpot_seconds: list[float]) -> float:
    """docs/definitions.md: 1 / (90th percentile over requests of mean inter-token latency)."""
    if not tpot_seconds:
        return math.nan
    return float(1.0 / np.percentile(np.asarray(tpot_seconds), 90))
