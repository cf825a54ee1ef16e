"""The plugin's hand-over between vLLM processes and its Prometheus families, without vLLM:
the parts that run in the API server process. (Real vLLM: tests/integration/test_vllm_plugin.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from collectors.parse import parse_page
from moemeter.contract.eplb import evaluate
from stack.vllm_plugin.moemeter_vllm_plugin.exporter import PluginCollector, experts_snapshot
from stack.vllm_plugin.moemeter_vllm_plugin.state import (
    BUCKETS,
    Eplb,
    Hist,
    Merged,
    ProcessState,
    placement_balancedness,
    read_states,
    write_atomically,
)
from warehouse.experts import ExpertSnapshot


def engine_state(tokens: list[list[int]], steps: list[float]) -> ProcessState:
    s = ProcessState(model_name="tiny-moe", num_experts=len(tokens[0]))
    s.experts[0] = dict(enumerate(tokens))
    for seconds in steps:
        s.steps.setdefault(0, Hist()).observe(seconds)
        s.phases.setdefault((0, "forward"), Hist()).observe(seconds * 0.8)
    return s


def test_histogram_buckets_are_prometheus_le_semantics():
    h = Hist()
    for v in (0.0001, 0.00011, 10.0, 11.0):
        h.observe(v)
    cum = dict(h.cumulative())
    assert cum["0.0001"] == 1 and cum["0.00025"] == 2 and cum["10.0"] == 3 and cum["+Inf"] == 4
    assert len(h.counts) == len(BUCKETS) + 1 and Hist.from_json(h.as_json()) == h


def test_processes_merge_into_one_page_and_snapshot(tmp_path):
    write_atomically(tmp_path, engine_state([[3, 1, 0, 0], [0, 0, 2, 2]], [0.01, 0.02]).as_json(os.getpid(), 1.0))
    api = ProcessState()
    api.api_output.observe(0.001)
    write_atomically(tmp_path, api.as_json(os.getppid(), 1.0))  # another live process: the API server's
    page = _render(PluginCollector(tmp_path))
    samples = {(s.name, s.labels): s.value for s in parse_page(page.encode())}
    rank = {dict(k[1])["layer"]: v for k, v in samples.items() if k[0] == "moemeter_expert_rank_tokens_total"}
    assert rank == {"0": 4.0, "1": 4.0}
    step_count = [v for k, v in samples.items() if k[0] == "moemeter_step_seconds_count"]
    api_count = [v for k, v in samples.items() if k[0] == "moemeter_api_output_seconds_count"]
    assert step_count == [2.0] and api_count == [1.0]
    kinds = {s.family: s.kind for s in parse_page(page.encode())}
    assert kinds["moemeter_expert_rank_tokens"] == "counter" and kinds["moemeter_step_phase_seconds"] == "histogram"
    snap = ExpertSnapshot.from_json(experts_snapshot(tmp_path))  # what the collectors accept
    assert snap.logical_tokens_total.tolist() == [[3, 1, 0, 0], [0, 0, 2, 2]] and snap.ranks == 1


def test_hot_experts_and_balancedness_speak_of_the_window_since_the_last_scrape(tmp_path):
    c = PluginCollector(tmp_path)
    write_atomically(tmp_path, engine_state([[10, 0, 0, 0]], [0.01]).as_json(os.getpid(), 1.0))
    _render(c)
    write_atomically(tmp_path, engine_state([[10, 0, 0, 6]], [0.01]).as_json(os.getpid(), 2.0))
    hot = [s for s in parse_page(_render(c).encode()) if s.name == "moemeter_expert_hot_share"]
    assert [(dict(s.labels)["expert"], s.value) for s in hot] == [("3", 1.0)]  # only expert 3 took tokens since


def test_files_of_processes_that_are_gone_are_dropped(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_atomically(tmp_path, engine_state([[1, 1]], [0.01]).as_json(int(dead.stdout), 1.0))
    (tmp_path / "garbage.json").write_text("{not json")
    assert read_states(tmp_path) == []
    assert not (tmp_path / f"{int(dead.stdout)}.json").exists()
    assert _render(PluginCollector(tmp_path)) == ""  # nothing measured: no series at all
    assert experts_snapshot(tmp_path) is None


def _render(collector: PluginCollector) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


# ------------------------------------------------------------------ with EPLB
# Two EP ranks, 4 logical experts, 6 slots (3 per rank), one MoE layer. vLLM's initial placement
# is [0, 1, 2, 3, 0, 1]: rank 0 holds experts 0, 1, 2; rank 1 holds 3 and the replicas of 0 and 1.
INITIAL = [[0, 1, 2, 3, 0, 1]]


def ep_rank(rank: int, physical: list[int], logical: list[int], pid: int) -> dict:
    s = ProcessState(model_name="tiny-moe", num_experts=4)
    s.experts[rank] = {0: logical}
    s.eplb = Eplb(rank, 2, [list(INITIAL[0])], {0: physical}, steps=30)
    return s.as_json(pid, 1.0)


def test_placement_balancedness_is_the_planners_definition():
    rng = np.random.default_rng(7)
    for _ in range(50):
        load = rng.integers(0, 100, size=(3, 8)).astype(float)
        phy2log = np.stack([np.concatenate([rng.permutation(8), rng.integers(0, 8, size=4)]) for _ in range(3)])
        ranks = int(rng.choice([1, 2, 3, 4, 6]))
        expected = np.nan_to_num(evaluate(load, phy2log, ranks)[1], nan=1.0)
        got = [placement_balancedness(w.tolist(), p.tolist(), ranks) for w, p in zip(load, phy2log)]
        assert got == pytest.approx(expected.tolist())


def test_a_rebalance_is_recorded_with_what_it_moved_and_planned():
    # Window: experts 0..3 took 10, 10, 40, 20. Under INITIAL the replicas of 0 and 1 take 5 each:
    # rank 0 holds 5 + 5 + 40 = 50, rank 1 20 + 5 + 5 = 30, balancedness 40 / 50 = 0.8. The new
    # placement [0, 1, 2, 3, 2, 3] moves two slots (4: 0 -> 2, 5: 1 -> 3): rank 0 10 + 10 + 20 = 40,
    # rank 1 10 + 20 + 10 = 40, balancedness 1.0.
    window = [[10.0, 10.0, 40.0, 20.0]]
    view = Eplb(0, 2, [[0, 1, 2, 3, 2, 3]], steps=24)
    view.rebalanced(100.0, 24, 0.25, 0.25, "sync", INITIAL, window)
    (event,) = view.rebalances
    assert event["moved_replicas"] == 2 and event["step"] == 24 and event["duration_seconds"] == 0.25
    assert event["mode"] == "sync" and event["transfer_seconds"] == 0.25
    assert event["balancedness_before"] == [pytest.approx(0.8)] and event["balancedness_planned"] == [1.0]
    view.phy2log = [list(INITIAL[0])]  # and back again
    view.rebalanced(200.0, 48, 0.5, 3.0, "async", [[0, 1, 2, 3, 2, 3]], window)  # 3 s of transfer, 0.5 s paused
    last = view.rebalances[-1]
    assert last["balancedness_planned"] == [pytest.approx(0.8)] and view.rebalances_total == 2
    assert (last["mode"], last["step"], last["duration_seconds"], last["transfer_seconds"]) == ("async", 48, 0.5, 3.0)


def test_ep_ranks_merge_into_vllms_placement_and_per_rank_load(tmp_path):
    # Each rank counted the tokens it routed: rank 0's [5, 1, 0, 2, 3, 1] and rank 1's [1, 1, 4, 0, 1, 0].
    write_atomically(tmp_path, ep_rank(0, [5, 1, 0, 2, 3, 1], [8, 2, 0, 2], os.getpid()))
    write_atomically(tmp_path, ep_rank(1, [1, 1, 4, 0, 1, 0], [2, 1, 4, 0], os.getppid()))
    merged = Merged.of(read_states(tmp_path))
    assert merged.eplb.physical == {0: [6, 2, 4, 2, 4, 1]}
    # rank 0 holds slots 0..2 (6 + 2 + 4), rank 1 slots 3..5 (2 + 4 + 1)
    assert merged.rank_tokens() == {(0, 0): 12, (1, 0): 7}
    snap = experts_snapshot(tmp_path)
    assert snap["phy2log"] == INITIAL and snap["ranks"] == 2 and snap["slots"] == 6
    assert snap["physical_tokens_total"] == [[6, 2, 4, 2, 4, 1]] and snap["logical_tokens_total"] == [[10, 3, 4, 2]]
    parsed = ExpertSnapshot.from_json(snap)  # what the collectors accept
    assert parsed.ranks == 2 and parsed.phy2log.tolist() == INITIAL


def test_rebalance_families_come_from_rank_zeros_events(tmp_path):
    rank0 = ProcessState(model_name="tiny-moe", num_experts=4)
    rank0.experts[0] = {0: [1, 1, 1, 1]}
    rank0.eplb = Eplb(0, 2, [[0, 1, 2, 3, 2, 3]], {0: [1, 0, 1, 1, 1, 0]})
    rank0.eplb.rebalanced(1234.5, 0, 0.75, 0.75, "sync", INITIAL, [[10.0, 10.0, 40.0, 20.0]])
    write_atomically(tmp_path, rank0.as_json(os.getpid(), 1.0))
    samples = {s.name: s.value for s in parse_page(_render(PluginCollector(tmp_path)).encode())}
    assert samples["moemeter_eplb_rebalances_total"] == 1.0
    assert samples["moemeter_eplb_last_rebalance_duration_seconds"] == 0.75
    assert samples["moemeter_eplb_last_rebalance_timestamp_seconds"] == 1234.5
    (event,) = ExpertSnapshot.from_json(experts_snapshot(tmp_path)).rebalances
    assert event.moved_replicas == 2 and event.duration_seconds == 0.75
