"""Real vLLM running its own EPLB on this CPU (the plugin's patches: stack/vllm_plugin/
moemeter_vllm_plugin/cpu_eplb.py): data parallel 2 x expert parallel over the two cores, one
engine on each, the tiny MoE with 2 redundant experts (34 slots, 17 per rank), vLLM rearranging
every 24 steps on an 8-step window; synchronously, and asynchronously (vLLM's default: a worker
thread moves the weights, the engine commits one layer per step).

Referees: vLLM's own state, read inside each worker (referee/eplb_referee.py, over vLLM's
dev-mode /collective_rpc), vLLM's own log ("Rearranged experts") and its own token counters."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from stack.localstack import MODEL_NAME
from stack.ready import scaled

from .test_vllm_plugin import _metrics, _value
from .vllm_server import EXPERTS, MOE_LAYERS, ROOT, TOP_K, serve

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
EPLB = {"window_size": 8, "step_interval": 24, "num_redundant_experts": 2, "communicator": "torch_gloo"}
SLOTS = EXPERTS + EPLB["num_redundant_experts"]
INITIAL = list(range(EXPERTS)) + [0, 1]  # vLLM's first placement: every expert, then replicas of 0 and 1


@pytest.fixture(scope="module", params=["sync", "async"])
def eplb_server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"vllm-eplb-{request.param}")
    config = json.dumps({**EPLB, "use_async": request.param == "async"})
    args = ["--data-parallel-size", "2", "--enable-expert-parallel", "--enable-eplb", "--eplb-config", config]
    env = {
        "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc, for the referee
        "PYTHONPATH": str(ROOT / "tests" / "integration" / "referee"),
    }
    args += ["--worker-extension-cls", "eplb_referee.EplbReferee"]
    with serve(tmp, *args, bind="0|1", env=env, start_seconds=600) as url:  # one core per engine
        yield url, tmp, request.param


def _truth(url: str, directory: Path) -> list[dict]:
    """vLLM's own EPLB state on each EP rank (every engine writes its own; vLLM answers with the first's)."""
    directory.mkdir()
    r = httpx.post(url + "/collective_rpc", json={"method": "eplb_truth", "args": [str(directory)]}, timeout=60)
    r.raise_for_status()
    assert r.json()["results"][0] == json.loads((directory / "ep-rank-0.json").read_text())
    return [json.loads(f.read_text()) for f in sorted(directory.glob("ep-rank-*.json"))]


def _settled_snapshot(url: str) -> dict:
    """The snapshot once the plugin has handed over everything: two in a row, a hand-over apart
    (0.5 s) and more, that agree."""
    deadline = time.monotonic() + scaled(30)
    last = None
    while True:
        snap = httpx.get(url + "/moemeter/experts").json()
        body = {k: v for k, v in snap.items() if k != "time"}
        if body == last:
            return snap
        assert time.monotonic() < deadline, "the plugin's expert snapshot kept changing with the engines idle"
        last = body
        time.sleep(1.5)


@pytest.fixture(scope="module")
def served(eplb_server, tmp_path_factory):
    """Traffic through vLLM's EPLB, the collectors storing a snapshot before and after it; then
    the settled snapshot, vLLM's own state, and the warehouse."""
    from collectors.scrape import http_fetch
    from collectors.service import Collector
    from warehouse.db import Warehouse

    url, tmp, mode = eplb_server
    targets = tmp / "targets.json"
    targets.write_text(
        json.dumps([{"name": "decode-0", "url": url + "/metrics", "role": "decode", "gpus": 2, "stack": "local-cpu"}])
    )
    wh = Warehouse(tmp_path_factory.mktemp("eplb-warehouse") / "w.duckdb")
    collector = Collector(wh, targets, interval=2.0, snapshot_every=1)

    async def traffic() -> tuple[list[dict], dict]:
        async with httpx.AsyncClient(timeout=300) as client, http_fetch() as fetch:
            await collector.round(fetch)
            usage = []
            for i in range(6):
                body = {"model": MODEL_NAME, "prompt": f"Request {i}: balance the experts", "max_tokens": 40}
                r = await client.post(url + "/v1/completions", json={**body, "ignore_eos": True})
                usage.append(r.json()["usage"])
            snap = await asyncio.to_thread(_settled_snapshot, url)
            await collector.round(fetch)
            return usage, snap

    usage, snap = asyncio.run(traffic())
    yield {
        "mode": mode,
        "url": url,
        "log": (tmp / "vllm.log").read_text(),
        "usage": usage,
        "snap": snap,
        "truth": _truth(url, tmp / "truth"),
        "wh": wh,
    }
    wh.close()


def test_the_exported_placement_is_vllms_own_on_every_rank(served):
    snap, truth = served["snap"], served["truth"]
    assert sorted(t["ep_rank"] for t in truth) == [0, 1], truth
    assert all(t["phy2log"] == snap["phy2log"] for t in truth)
    assert snap["ranks"] == 2 and snap["slots"] == SLOTS and len(snap["phy2log"]) == MOE_LAYERS
    assert any(row != INITIAL for row in snap["phy2log"]), "no rearrangement changed the placement"
    for t in truth:  # replica counts: vLLM's logical_replica_count, exported, is the placement's
        assert t["replicas"] == snap["logical_replicas"]
        assert t["replicas"] == [[row.count(e) for e in range(EXPERTS)] for row in snap["phy2log"]]


def test_each_rearrangement_is_one_event_with_its_pause(served):
    snap, log, mode, truth = served["snap"], served["log"], served["mode"], served["truth"]
    # vLLM's own lines, not the profile run's: a synchronous one logs when done, an async one
    # when it starts; one still moving its layers is no event yet.
    done = r"Rearranged experts\s+in " if mode == "sync" else r"Rearranging experts \(async mode\)\s+\.\.\."
    rearranged = len(re.findall(done, log)) - any(t["in_flight"] for t in truth)
    events = snap["rebalances"]
    assert rearranged >= 2 and len(events) == rearranged, (rearranged, len(events))
    assert all(e["duration_seconds"] > 0 and len(e["balancedness_planned"]) == MOE_LAYERS for e in events)
    assert [e["step"] for e in events] == sorted(e["step"] for e in events)
    assert {e["mode"] for e in events} == {mode}
    if mode == "sync":  # the engine waits for the whole move
        assert all(e["transfer_seconds"] == e["duration_seconds"] for e in events)
    else:  # the engine moves one layer per step; the worker thread's transfer spans those steps
        assert all(e["transfer_seconds"] > e["duration_seconds"] for e in events)
    # vLLM planned on its own window, in its unit: the snapshot's is vLLM's last_expert_load
    assert snap["eplb_window_load"] == truth[0]["last_expert_load"]
    m = _metrics(served["url"])
    assert _value(m, "moemeter_eplb_rebalances_total") == rearranged
    assert _value(m, "moemeter_eplb_last_rebalance_timestamp_seconds") == events[-1]["time"]


def test_physical_loads_add_up_to_the_logical_ones_and_to_vllms_tokens(served):
    snap, usage = served["snap"], served["usage"]
    m = _metrics(served["url"])
    # Every forwarded token goes to top-k experts in every MoE layer (the last one of a request is
    # sampled, never forwarded).
    computed = _value(m, "vllm:prompt_tokens_by_source_total", source="local_compute")
    forwarded = computed + sum(u["completion_tokens"] for u in usage) - len(usage)
    logical = [sum(row) for row in snap["logical_tokens_total"]]
    physical = [sum(row) for row in snap["physical_tokens_total"]]
    assert logical == physical == [TOP_K * forwarded] * MOE_LAYERS, (logical, physical, forwarded)
    per_rank = {
        (dict(lab)["engine"], dict(lab)["layer"]): v
        for (n, lab), v in m.items()
        if n == "moemeter_expert_rank_tokens_total"
    }
    assert {e for e, _ in per_rank} == {"0", "1"} and sum(per_rank.values()) == MOE_LAYERS * TOP_K * forwarded


def test_the_experts_page_shows_the_real_placement_and_rebalance(served, monkeypatch):
    from tests.conftest import run_page
    from warehouse.api import QueryServer

    api = QueryServer(served["wh"])
    api.start()
    try:
        at = run_page(str(ROOT / "dashboard" / "views" / "experts.py"), api.url, monkeypatch, timeout=120)
    finally:
        api.shutdown()
    events = served["snap"]["rebalances"]
    table = at.dataframe[1].value  # the rebalances table, newest first
    assert len(table) == len(events) and table["ts"].is_monotonic_decreasing
    heads = [h.value for h in at.subheader]
    assert any(h.startswith("Last rebalance (") for h in heads) and "Physical placement" in heads
    labels = {m.label: m for m in at.metric}
    assert labels["Pause"].value == f"{events[-1]['duration_seconds']:.2f} s"
    # What it bought: no tokens/s after the last rebalance measured yet is said so, not "did not rise".
    after_unknown = labels["Generated tok/s: before → after"].value.endswith("→ —")
    assert (labels["Tokens to win back"].delta == "tok/s after it not measured yet") == after_unknown


def test_every_cpu_patch_is_logged_once_per_process_and_documented(served):
    from stack.vllm_plugin.moemeter_vllm_plugin.cpu_eplb import PATCHES

    names = [name for name, _ in PATCHES]
    lines = re.findall(r"\((\w+) pid=(\d+)\).*EPLB on CPU patches applied: (.*)", served["log"])
    assert lines and all(applied.split(", ") == names for _, _, applied in lines), lines
    assert len({pid for _, pid, _ in lines}) == len(lines)  # once per process
    table = (ROOT / "docs" / "metrics.md").read_text()
    assert all(f"| `{name}` |" in table for name in names)
