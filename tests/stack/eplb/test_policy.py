"""The planner's `vllm` policy is vLLM's placement exactly; `refined` is never worse, often better."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stack.eplb.policy import PlanError, PlanInput, evaluate, plan, plan_refined, plan_vllm, replicate

FIXTURES = Path(__file__).parents[2] / "fixtures" / "eplb"
KEYS = ("weight", "num_replicas", "num_groups", "num_nodes", "num_gpus")
RECORDED = json.loads((FIXTURES / "vllm-0.32-default-policy-recorded.json").read_text())["cases"]


def test_the_shared_vector_matches_exactly():
    case = json.loads((FIXTURES / "vllm-default-policy-vector.json").read_text())
    got = plan_vllm(PlanInput.from_dict({k: case[k] for k in KEYS}))
    assert got.phy2log.tolist() == case["phy2log"]
    counts = [np.bincount(row, minlength=12).tolist() for row in got.phy2log]
    assert counts == case["logcnt"]


@pytest.mark.parametrize("case", RECORDED, ids=[f"{c['kind']}-{len(c['weight'])}x{len(c['weight'][0])}-n{c['num_nodes']}"
                                                for c in RECORDED])  # fmt: skip
def test_placements_recorded_from_vllm_032_match_exactly(case):
    assert plan_vllm(PlanInput.from_dict({k: case[k] for k in KEYS})).phy2log.tolist() == case["phy2log"]


@pytest.mark.parametrize("case", RECORDED[::3])
def test_refined_never_has_a_higher_max_rank_load_than_vllm(case):
    inp = PlanInput.from_dict({k: case[k] for k in KEYS})
    base = plan_vllm(inp)
    refined = plan_refined(inp, base)
    assert (refined.rank_load.max(axis=1) <= base.rank_load.max(axis=1) + 1e-9).all()


def zipf_layers(layers: int, experts: int, s: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(1e6 / np.arange(1, experts + 1) ** s) for _ in range(layers)])


def test_refined_is_clearly_lower_on_skewed_loads_when_vllm_packs_hierarchically():
    inp = PlanInput(zipf_layers(8, 256, 1.0), 320, 8, 8, 64).validated()
    ratio = plan_refined(inp).rank_load.max(axis=1) / plan_vllm(inp).rank_load.max(axis=1)
    assert ratio.max() < 0.6  # every layer at least 40% lower


def test_refined_reaches_the_lower_bound_on_the_reference_shape():
    w = zipf_layers(6, 256, 1.0, seed=3)
    inp = PlanInput(w, 320, 8, 1, 64).validated()
    refined = plan_refined(inp)
    bound = [max(row.sum() / 64, (row / replicate(row, 320)[1]).max()) for row in w]
    assert (refined.rank_load.max(axis=1) / np.array(bound)).max() < 1.005


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.sampled_from([(8, 12, 4, 1, 4, 2), (16, 20, 4, 2, 4, 2), (12, 16, 3, 2, 8, 4)]),
       st.integers(0, 2**31 - 1))  # fmt: skip
def test_every_plan_is_a_valid_placement(layers, shape, seed):
    experts, slots, groups, nodes, gpus, _ = shape
    w = np.random.default_rng(seed).integers(0, 50, (layers, experts)).astype(float)
    inp = PlanInput(w, slots, groups, nodes, gpus).validated()
    for policy in ("vllm", "refined"):
        p = plan(inp, policy)
        assert p.phy2log.shape == (layers, slots)
        for row in p.phy2log:
            assert set(row.tolist()) == set(range(experts))  # every logical expert at least once
        rank_load, bal = evaluate(w, p.phy2log, gpus)
        assert np.allclose(rank_load.sum(axis=1), w.sum(axis=1))  # no load lost or made up
        assert np.allclose(p.rank_load, rank_load)


def base(**over):
    return {"weight": [[1, 2, 3, 4], [4, 3, 2, 1]], "num_replicas": 6, "num_groups": 2, "num_nodes": 1,
            "num_gpus": 2, **over}  # fmt: skip


@pytest.mark.parametrize("data,match", [
    (base(weight=[[1, 2, 3]]), "3 logical experts do not divide into num_groups=2"),
    (base(num_replicas=5), "num_replicas=5 slots do not divide over num_gpus=2"),
    (base(num_replicas=2), "fewer than the 4 logical experts"),
    (base(weight=[[1, -2, 3, 4]]), r"weight\[0\]\[1\] = -2.0 is negative"),
    (base(weight=[[1, float("nan"), 3, 4]]), r"weight\[0\]\[1\] is not finite"),
    (base(weight=[[1, 2, 3, float("inf")]]), "not finite"),
    (base(weight=[[1, 2, 3, 4], []]), "weight layer 1 is empty"),
    (base(weight=[]), "non-empty list of layers"),
    (base(weight=[[1, 2, 3, 4], [1, 2]]), "layer 1 has 2 experts, layer 0 has 4"),
    (base(weight=[[1, "x", 3, 4]]), "numbers only"),
    (base(num_gpus=0), "num_gpus must be a positive integer"),
    (base(num_nodes=3), "num_gpus=2 does not divide over num_nodes=3"),
    ({"weight": [[1]]}, "missing keys"),
])  # fmt: skip
def test_bad_inputs_name_the_constraint(data, match):
    with pytest.raises(PlanError, match=match):
        PlanInput.from_dict(data)


def test_unknown_policy():
    with pytest.raises(PlanError, match="unknown policy"):
        plan(PlanInput.from_dict(base()), "random")
