"""The twin is a model, calibrated to the write-up, and deterministic under a seed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stack.twin.config import load_profile
from stack.twin.model import RackModel, gpu_placements, p90_per_user_tokens_per_second
from stack.twin.server import Twin


@pytest.fixture(scope="module")
def profile():
    return load_profile("deepseek-v4.1-flash")


def run(profile, seconds: float, warm: float = 60.0, seed: int = 1):
    m = RackModel(profile, seed=seed, start=0.0)
    m.advance(warm)
    before = dict(m.totals)
    m.finished_tpot.clear()
    m.advance(warm + seconds)
    return m, {k: m.totals[k] - before[k] for k in before}


@pytest.fixture(scope="module")
def loaded(profile):
    return run(profile, 240.0)


def test_default_load_is_calibrated_to_the_write_up(profile, loaded):
    m, totals = loaded
    gpus = profile.topology.total_gpus
    logical = (totals["prompt_tokens"] + totals["generation_tokens"]) / 240.0 / gpus
    assert logical == pytest.approx(954_000, rel=0.10)
    assert p90_per_user_tokens_per_second(m.finished_tpot) == pytest.approx(196, rel=0.10)


@pytest.mark.slow("runs the rack's model for 10 minutes to finish 50 requests")
def test_a_single_user_alone_decodes_near_826_tokens_per_second(profile):
    m, _ = run(profile.with_workload(agents=1, users=1), 600.0)
    assert len(m.finished_tpot) > 50
    assert 1.0 / np.median(m.finished_tpot) == pytest.approx(826, rel=0.10)


def test_agentx_contexts_pass_100k_tokens_with_prefix_cache_hits_above_90_percent(loaded):
    m, _ = loaded
    assert m.context.max() > 100_000
    hits = sum(i.counters["prompt_local_cache_hit"].sum() for i in m.prefill)
    prompt = sum(i.counters["prompt_tokens"].sum() for i in m.prefill)
    assert hits / prompt > 0.90


@pytest.mark.slow("runs the whole rack's model three times for 30 s")
def test_step_time_follows_batch_and_context(profile):
    light, _ = run(profile.with_workload(agents=400), 30.0)
    heavy, _ = run(profile, 30.0)
    assert heavy.decode_batch.max() > light.decode_batch.max()
    assert heavy.decode_step_seconds > light.decode_step_seconds
    long_ctx = dataclasses.replace(
        profile,
        performance=dataclasses.replace(
            profile.performance,
            decode_step_per_context_token_seconds=4 * profile.performance.decode_step_per_context_token_seconds,
        ),
    )
    slower, _ = run(long_ctx, 30.0)
    assert slower.decode_step_seconds > heavy.decode_step_seconds


def test_kv_transfer_time_follows_bytes_moved(loaded):
    m, _ = loaded
    h = m.decode[0].histograms
    mean_bytes = h["vllm:nixl_bytes_transferred"].sums.sum() / h["vllm:nixl_bytes_transferred"].counts.sum()
    mean_time = h["vllm:nixl_xfer_time_seconds"].sums.sum() / h["vllm:nixl_xfer_time_seconds"].counts.sum()
    perf = m.profile.performance
    assert mean_time == pytest.approx(
        perf.kv_transfer_latency_seconds + mean_bytes / perf.kv_transfer_bandwidth_bytes_per_second, rel=1e-6
    )
    # bytes = prompt tokens x the model's KV bytes per token
    prompt = m.decode[0].counters["prompt_external_kv_transfer"].sum()
    assert mean_bytes > 0 and prompt > 0


@pytest.mark.slow("runs the whole rack's model three times")
def test_same_seed_same_pages_and_other_seed_differs(profile):
    a = Twin(profile, seed=5, start=1000.0).pages(1060.0)
    b = Twin(profile, seed=5, start=1000.0).pages(1060.0)
    c = Twin(profile, seed=6, start=1000.0).pages(1060.0)
    assert a == b
    assert a["decode-0"] != c["decode-0"]


def test_counters_never_decrease_while_running(profile):
    m = RackModel(profile, seed=2, start=0.0)
    last = None
    for t in range(10, 70, 10):
        m.advance(float(t))
        now = np.concatenate([c.ravel() for inst in m.prefill + m.decode for c in inst.counters.values()])
        if last is not None:
            assert (now >= last).all()
        last = now


def test_topology_places_72_gpus(profile):
    places = gpu_placements(profile)
    assert len(places) == 72
    assert sum(p.role == "prefill" for p in places) == 8
    assert sum(p.role == "decode" for p in places) == 64
    assert {p.tray for p in places} == set(range(18))


def test_the_v4_flash_profile_describes_the_predecessor():
    p = load_profile("deepseek-v4-flash")
    assert (p.model.num_layers, p.model.routed_experts, p.model.top_k, p.model.hash_routed_layers) == (43, 256, 6, 3)
