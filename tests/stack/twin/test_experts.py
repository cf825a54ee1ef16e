"""The twin's expert routing makes the Experts page worth reading, and its accounting is exact."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from stack.twin.config import load_profile
from stack.twin.model import RackModel
from stack.twin.server import Twin


def quick(name: str = "deepseek-v4.1-flash", **eplb):
    """A smaller rack load and faster EPLB schedule, so the test runs in seconds."""
    p = load_profile(name).with_workload(agents=800)
    return dataclasses.replace(p, eplb=dataclasses.replace(p.eplb, **eplb))


@pytest.fixture(scope="module")
def ran():
    m = RackModel(quick(rebalance_interval_seconds=60.0, window_seconds=30.0, drift_per_minute=0.4), seed=9, start=0.0)
    m.advance(130.0)
    return m


def test_every_routed_token_is_counted_once_per_chosen_expert(ran):
    st = ran.experts.state
    decode_tokens = ran.decode[0].counters["generation_tokens"].sum()
    k = ran.profile.model.top_k
    assert np.allclose(st.logical_tokens.sum(axis=1), decode_tokens * k)
    assert np.allclose(st.rank_tokens.sum(axis=1), decode_tokens * k)


def test_layers_differ_in_skew(ran):
    share = ran.experts.state.logical_tokens / ran.experts.state.logical_tokens.sum(axis=1, keepdims=True)
    top = np.sort(share, axis=1)[:, -5:].sum(axis=1)
    assert top.max() > 1.5 * top.min()


def test_rebalances_happen_on_schedule_and_help(ran):
    rebs = ran.experts.state.rebalances
    assert [round(r.at) for r in rebs] == [60, 120]
    for r in rebs:
        assert np.mean(r.balancedness_planned) > np.mean(r.balancedness_before) + 0.05
        assert r.duration_seconds > 0 and r.moved_replicas > 0


@pytest.mark.slow("runs the rack's model for 130 s")
def test_hot_experts_drift_over_time():
    m = RackModel(quick(drift_per_minute=1.0), seed=2, start=0.0)
    m.advance(10.0)
    first = m.experts.popularity().argmax(axis=1)
    m.advance(130.0)
    later = m.experts.popularity().argmax(axis=1)
    assert (first != later).sum() >= 3  # some layers have a new hottest expert


def test_hash_routed_layers_follow_token_frequency_and_do_not_drift():
    m = RackModel(quick("deepseek-v4-flash"), seed=2, start=0.0)
    before = m.experts.popularity()[:3].copy()
    m.advance(60.0)
    assert np.allclose(m.experts.popularity()[:3], before)
    assert m.experts.popularity()[3:].std() > 0


@pytest.mark.slow("serves the whole twin rack")
def test_snapshot_endpoint_serves_the_matrices():
    twin = Twin(load_profile("deepseek-v4.1-flash"), seed=1)
    targets = twin.serve()
    try:
        import httpx

        decode = next(t for t in targets if t["role"] == "decode")
        base = str(decode["url"]).removesuffix("/metrics")
        snap = httpx.get(base + "/moemeter/experts", timeout=10).json()
        assert snap["schema"] == "moemeter.experts/1"
        assert np.asarray(snap["logical_tokens_total"]).shape == (40, 384)
        assert np.asarray(snap["phy2log"]).shape == (40, 448) and snap["ranks"] == 64
        prefill = next(t for t in targets if t["role"] == "prefill")
        assert httpx.get(str(prefill["url"]).removesuffix("/metrics") + "/moemeter/experts").status_code == 404
        page = httpx.get(str(decode["url"])).text
        assert 'moemeter_expert_rank_tokens_total{engine="63",layer="39"' in page
        json.dumps(snap)
    finally:
        twin.close()
