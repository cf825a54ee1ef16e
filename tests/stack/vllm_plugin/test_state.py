"""The plugin's hand-over between vLLM processes and its Prometheus families, without vLLM:
the parts that run in the API server process. (Real vLLM: tests/integration/test_vllm_plugin.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

from collectors.parse import parse_page
from stack.vllm_plugin.moemeter_vllm_plugin.exporter import PluginCollector, experts_snapshot
from stack.vllm_plugin.moemeter_vllm_plugin.state import BUCKETS, Hist, ProcessState, read_states, write_atomically
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
