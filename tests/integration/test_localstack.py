"""The local CPU stack, for real: vLLM prefill + decode (NIXL KV transfer, each on its own
core, the plugin in both) behind vllm-router, the metering gateway in front, the load generator
sending through it, the collectors storing it all, and the Users, Experts and CPU overhead pages
rendering it. Needs .vllm-venv and .router-venv (`make test` builds both first)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from stack.ready import scaled
from tests.e2e.test_browser import free_port_block

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def localstack(tmp_path_factory):
    if not (ROOT / ".router-venv" / ".installed").exists():
        subprocess.run(["make", "router-env"], cwd=ROOT, check=True, timeout=600)
    if not (ROOT / ".vllm-venv" / ".installed").exists():
        subprocess.run(["make", "vllm-env"], cwd=ROOT, check=True, timeout=1800)
    tmp = tmp_path_factory.mktemp("localstack")
    base = free_port_block(10)  # router +0, vLLM +1 and +2, gateway +3, router metrics +9
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "localstack",
            "--workdir",
            str(tmp / "work"),
            "--targets-out",
            str(tmp / "targets.json"),
            "--base-port",
            str(base),
            "--traffic-sessions",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + scaled(400)
        while not (tmp / "targets.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-3000:]  # type: ignore[union-attr]
            time.sleep(1)
        yield tmp, base, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def cores_of(pid: int) -> set[frozenset[int]]:
    """The cores the threads of `pid` and the processes below it may run on."""
    from stack.localstack import tree_threads

    out = set()
    for t in tree_threads(pid):
        try:
            out.add(frozenset(os.sched_getaffinity(t)))
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    return out


def test_each_vllm_server_runs_on_its_own_core(localstack):
    from stack.localstack import process_tree

    _, base, proc = localstack
    cmdlines = {p: Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0") for p in process_tree(proc.pid)}
    servers = {int(c[c.index(b"--port") + 1]): p for p, c in cmdlines.items() if b"--kv-transfer-config" in c}
    assert sorted(servers) == [base + 1, base + 2]
    # NIXL moves the forward thread to the last core; the stack binds every thread back. Pinned
    # to one core (`taskset -c 0`), both share it.
    from stack.localstack import LocalCpuStack

    prefill, decode = LocalCpuStack.core("prefill-0"), LocalCpuStack.core("decode-0")
    assert (prefill != decode) == (len(os.sched_getaffinity(0)) >= 2)
    assert cores_of(servers[base + 1]) == {frozenset({prefill})}
    assert cores_of(servers[base + 2]) == {frozenset({decode})}


def test_pd_through_the_gateway_and_router_is_stored_and_shown(localstack, tmp_path, monkeypatch):
    import dataclasses

    from streamlit.testing.v1 import AppTest

    from collectors.scrape import http_fetch
    from collectors.service import Collector
    from stack.loadgen.run import LoadGen
    from stack.localstack import LOCAL_WORKLOAD, MODEL_NAME
    from warehouse.api import QueryServer
    from warehouse.db import Warehouse

    work, base, _ = localstack
    wh = Warehouse(tmp_path / "w.duckdb")
    collector = Collector(wh, work / "targets.json", interval=5.0, snapshot_every=2)
    gen = LoadGen(
        f"http://127.0.0.1:{base + 3}",
        MODEL_NAME,
        dataclasses.replace(LOCAL_WORKLOAD, sessions=6),
        seed=1,
        concurrency=2,
        progress=None,
    )

    async def rounds() -> None:
        async with http_fetch() as fetch:
            traffic = asyncio.create_task(gen.arun())
            await collector.round(fetch)
            while not traffic.done():  # collect while the load generator runs, as in production
                await asyncio.sleep(5.0)
                await collector.round(fetch)
            # Two more rounds, then until the feed is read to its end: both cores run vLLM (NIXL's UCX
            # threads busy-poll), so a feed read can time out, and then the next round reads what it missed.
            deadline = time.monotonic() + scaled(120)
            for k in range(100):
                await asyncio.sleep(5.0)
                await collector.round(fetch)
                stored = wh.query_df("SELECT count(*) n FROM requests").n[0]
                if k >= 1 and (stored >= len(gen.results) or time.monotonic() > deadline):
                    break

    asyncio.run(rounds())
    results = gen.results
    ok = [r for r in results if r.error is None]
    assert len(ok) >= 8, [r.error for r in results]
    # Every request exactly once, with its user and the token counts vLLM returned in `usage`.
    rows = wh.query_df("""SELECT request_id, user_id, prompt_tokens, generated_tokens, cached_prompt_tokens, stream,
                                 itl_mean_seconds, outcome FROM requests ORDER BY seq""")
    assert sorted(rows.request_id) == sorted(r.request_id for r in results) and rows.request_id.is_unique
    got = {
        r.request_id: (r.user_id, r.prompt_tokens, r.generated_tokens, r.cached_prompt_tokens)
        for r in rows.itertuples()
    }
    for r in ok:
        assert got[r.request_id] == (r.user, r.prompt_tokens, r.completion_tokens, r.cached_prompt_tokens), r
    assert (rows.outcome == "ok").sum() == len(ok)
    # A chunk per token, so the gaps are measured; a stream whose tokens all arrived in one read (the
    # machine stalled) has no gap to measure and records none.
    assert rows[rows.stream & (rows.outcome == "ok")].itl_mean_seconds.notna().mean() >= 0.75
    # Both cores run vLLM: a scrape may time out now and then, and is then recorded as down.
    up = wh.query_df("""SELECT target, count(*) FILTER (WHERE up) AS up, any_value(error) FILTER (WHERE NOT up) AS why
                        FROM scrapes GROUP BY target ORDER BY target""")
    assert up["target"].tolist() == ["decode-0", "gateway", "prefill-0", "router"] and (up["up"] >= 4).all(), up

    def inc(metric: str, target: str, **labels: str) -> float:
        where = "".join(f" AND json_extract_string(s.labels, '$.{k}') = '{v}'" for k, v in labels.items())
        df = wh.query_df(f"""SELECT coalesce(sum(i.delta), 0) AS d FROM increments i JOIN series s USING (series_id)
                             WHERE s.metric = '{metric}' AND s.target = '{target}' {where}""")
        return float(df["d"][0])

    # PD: the prefill instance computes prompts, the decode instance gets them by NIXL and generates.
    assert inc("vllm:prompt_tokens_by_source_total", "prefill-0", source="local_compute") > 0
    assert inc("vllm:prompt_tokens_by_source_total", "decode-0", source="local_compute") == 0
    assert inc("vllm:prompt_tokens_by_source_total", "decode-0", source="external_kv_transfer") > 0
    assert inc("vllm:nixl_xfer_time_seconds_count", "decode-0") > 0
    assert inc("vllm_router_pd_decode_requests_total", "router") > 0
    for target in ("prefill-0", "decode-0"):  # the plugin in both
        assert inc("moemeter_expert_rank_tokens_total", target) > 0
        assert inc("moemeter_step_phase_seconds_count", target, phase="forward") > 0
    # --custom-histogram-buckets as the profiles set them: 1 ms steps below 20 ms on real vLLM too.
    for target in ("prefill-0", "decode-0"):
        les = wh.query_df(f"""SELECT le FROM series WHERE target = '{target}'
                              AND metric = 'vllm:inter_token_latency_seconds_bucket'""")["le"].tolist()
        assert {0.001, 0.005, 0.011, 0.02, 80.0} <= set(les), sorted(les)
    snaps = wh.query_df("SELECT target, count(*) AS n FROM expert_snapshots GROUP BY target ORDER BY target")
    assert snaps["target"].tolist() == ["decode-0", "prefill-0"]

    api = QueryServer(wh)
    api.start()
    monkeypatch.setenv("MOEMETER_API", api.url)
    try:
        at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "live.py"), default_timeout=60)
        at.run()
        assert not at.exception, at.exception
        assert [m.value for m in at.metric if m.label == "Targets up"] and not at.error
        assert any("No GPU exporter" in i.value for i in at.info)  # CPUs only: said, not empty charts
        at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "overhead.py"), default_timeout=60)
        at.run()
        assert not at.exception, at.exception
        labels = [m.label for m in at.metric]
        assert "prefill: CPU overhead" in labels and "decode: CPU overhead" in labels
        at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "experts.py"), default_timeout=60)
        at.run()
        assert not at.exception, at.exception
        assert set(at.selectbox[0].options) == {"decode-0", "prefill-0"}
        at = AppTest.from_file(str(ROOT / "dashboard" / "views" / "users.py"), default_timeout=60)
        at.run()
        assert not at.exception, at.exception
        p90 = 1 / rows.itl_mean_seconds.quantile(0.9)  # pandas' linear quantile, as DuckDB's quantile_cont
        shown = next(m.value for m in at.metric if m.label == "P90 per-user tokens/s")
        assert float(shown.replace(",", "")) == pytest.approx(p90, abs=0.06)
    finally:
        api.shutdown()
        wh.close()


def test_repeated_prompts_are_served_from_the_prefix_cache_and_priced_as_cache_hits(localstack, tmp_path, capsys):
    """Real vLLM reports cache hits (prompt_tokens_details.cached_tokens) for a repeated prompt; the
    gateway records them, the prefill pool counts them (`local_cache_hit`), and `moemeter report cost`
    prices them at the cache-hit rate, not as computed prompt tokens."""
    from datetime import datetime, timedelta

    from collectors.scrape import http_fetch
    from collectors.service import Collector
    from moemeter.cli import main
    from stack.localstack import MODEL_NAME
    from warehouse.db import Warehouse

    work, base, _ = localstack
    url = f"http://127.0.0.1:{base + 3}"
    prompt = " ".join(f"word{i % 50}" for i in range(400))  # several KV blocks
    db = tmp_path / "w.duckdb"
    wh = Warehouse(db)
    collector = Collector(wh, work / "targets.json", interval=5.0)

    async def one_round() -> None:
        async with http_fetch() as fetch:
            await collector.round(fetch)

    def stored_users() -> list[str]:
        return wh.query_df("SELECT user_id FROM requests WHERE user_id = 'cache'").user_id.tolist()

    start = datetime.utcnow().replace(microsecond=0)
    try:
        asyncio.run(one_round())
        usage = [
            httpx.post(
                url + "/v1/completions",
                json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "user": "cache"},
                timeout=120,
            ).json()["usage"]
            for _ in range(2)
        ]
        deadline = time.monotonic() + scaled(120)
        while len(stored_users()) < 2:  # rounds until both records are stored
            assert time.monotonic() < deadline, "the gateway's two records were not stored"
            asyncio.run(one_round())
        asyncio.run(one_round())  # and the counters once more, after both
    finally:
        wh.close()
    first, again = ((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for u in usage)
    assert again > first and again >= usage[1]["prompt_tokens"] // 2, usage

    end = datetime.utcnow().replace(microsecond=0) + timedelta(seconds=1)
    # Prices large enough that a few hundred tokens come to dollars, and a miss costs 100 hits.
    hit, miss, out = 1_000.0, 100_000.0, 10_000.0
    sheet = tmp_path / "prices.toml"
    sheet.write_text(f"""name = "cache-test"
[[gpu]]
effective = "2026-01-01T00:00:00Z"
pool = "*"
usd_per_gpu_hour = 1.0
source = "test"
[[tokens]]
effective = "2026-01-01T00:00:00Z"
usd_per_mtok_input_cache_hit = {hit}
usd_per_mtok_input_cache_miss = {miss}
usd_per_mtok_output = {out}
source = "test"
""")
    args = [
        "report",
        "cost",
        "--db",
        str(db),
        "--targets",
        str(work / "targets.json"),
        "--json",
        "--from",
        start.isoformat(),
        "--to",
        end.isoformat(),
        "--price-sheet",
        str(sheet),
    ]
    capsys.readouterr()
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    pf = r["pools"]["prefill"]
    # The prefill pool's own counters: the repeated prompt's blocks came from its cache.
    assert pf["cached_prompt_tokens"] >= again and pf["prompt_tokens"] >= sum(u["prompt_tokens"] for u in usage)
    assert pf["computed_prompt_tokens"] == pf["prompt_tokens"] - pf["cached_prompt_tokens"]
    # Revenue: cached tokens at the cache-hit price, the rest at the miss price.
    expected = (
        pf["cached_prompt_tokens"] * hit
        + pf["computed_prompt_tokens"] * miss
        + r["pools"]["decode"]["generated_tokens"] * out
    ) / 1e6
    assert r["total"]["revenue_usd"] == pytest.approx(expected, abs=0.01)
    # The user is charged for computed prompt tokens only: what vLLM told them was cached is not.
    [user] = [u for u in r["users"] if u["user"] == "cache"]
    assert user["cached_prompt_tokens"] == first + again and user["requests"] == 2
    assert user["computed_prompt_tokens"] == sum(u["prompt_tokens"] for u in usage) - first - again

    # The same window as FOCUS rows, refereed by the FinOps Foundation's validator: they add up to
    # the report, and the user's cache hits are a row of their own.
    import pandas as pd

    from tests.warehouse import focus_validator

    focus = tmp_path / "focus.csv"
    args[1] = "focus"
    args.remove("--json")
    assert main([*args, "--by", "user", "--basis", "usage", "--rack", "cpu-stack", "--out", str(focus)]) == 0
    rows = pd.read_csv(focus)
    assert round(rows["BilledCost"].sum(), 2) == r["total"]["cost_usd"]
    hits = rows[(rows["SkuId"] == "tokens-input-cache-hit") & rows["x_AllocatedResourceId"].str.endswith("/cache")]
    assert hits["ConsumedQuantity"].sum() == first + again and (hits["x_CacheSavings"] > 0).all()
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    focus_validator.check(focus_validator.validate(focus, verdicts))


def test_real_clients_streams_are_metered_whole(localstack):
    """The audit's repro on the real stack: streams delivered in full were recorded as 499 when the
    client closed right after [DONE] (3 of 7 from the `openai` SDK, 9 of 20 from a client that stops
    reading at [DONE]). And `"stream": "true"`, which vLLM streams, is metered as a stream."""
    import openai

    from stack.localstack import MODEL_NAME

    _, base, _ = localstack
    url = f"http://127.0.0.1:{base + 3}"
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    told: dict[str, list[int]] = {"sdk": [], "closer": [], "string": []}  # completion tokens the client was told
    ids: set[str] = set()  # response ids the clients saw
    for i in range(7):
        stream = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": f"count {i}"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
            user="sdk",
        )
        chunks = list(stream)
        told["sdk"].append(chunks[-1].usage.completion_tokens)
        ids.update(c.id for c in chunks)
        stream.close()
    with httpx.Client(timeout=120) as http:
        for i in range(20):
            body = {
                "model": MODEL_NAME,
                "prompt": f"say {i}",
                "max_tokens": 6,
                "stream": True,
                "user": "closer",
                "stream_options": {"include_usage": True},
            }
            with http.stream("POST", url + "/v1/completions", json=body) as r:
                text = b""
                for chunk in r.iter_raw():
                    text += chunk
                    if b"data: [DONE]" in text:
                        break  # and close at once
            usage = [json.loads(e[6:]) for e in text.split(b"\n\n") if e.startswith(b'data: {"') and b'"usage":{' in e]
            told["closer"].append(usage[-1]["usage"]["completion_tokens"])
            ids.add(usage[-1]["id"])
        r = http.post(
            url + "/v1/completions",
            content=json.dumps(
                {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 5, "stream": "true", "user": "string"}
            ),
        )
        assert r.headers["content-type"].startswith("text/event-stream") and r.text.endswith("data: [DONE]\n\n")
    deadline = time.monotonic() + 60
    while True:  # until the gateway's log has all 28 (a record is in the feed once it is durable)
        records = [
            r
            for r in httpx.get(url + "/moemeter/requests", params={"limit": 5000}).json()["records"]
            if r["user"] in told
        ]
        if len(records) >= 7 + 20 + 1 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    got = {u: [(r["status"], r["outcome"], r["generated_tokens"]) for r in records if r["user"] == u] for u in told}
    [(status, outcome, n)] = got.pop("string")
    assert (status, outcome) == (200, "ok") and 1 <= n <= 5
    assert got == {u: [(200, "ok", n) for n in told[u]] for u in ("sdk", "closer")}
    assert all(r["stream"] and r["usage_reported"] and r["prompt_tokens"] > 0 for r in records)
    # vllm-router names both instances in the ids it passes on; clients see the gateway's own ids.
    assert len(ids) == 27 and not any("addr" in i or "127.0.0.1" in i for i in ids), sorted(ids)[:3]


def test_a_client_that_hangs_up_mid_stream_is_metered_for_the_prompt_vllm_counted(localstack):
    """The audit's repro on the real stack: a streaming client that hung up early paid no input (the
    gateway stopped reading before vLLM's final usage chunk). The gateway asks vLLM for its running
    usage (continuous_usage_stats) and meters from it; the referee is vLLM's own count of the same
    prompt asked whole. The client, which asked for no usage, reads none."""
    from stack.localstack import MODEL_NAME

    _, base, _ = localstack
    url = f"http://127.0.0.1:{base + 3}"
    prompt = "Count slowly from one to one hundred, one number a line:"
    with httpx.Client(timeout=120) as http:
        whole = http.post(
            url + "/v1/completions", json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "user": "whole"}
        ).json()
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with http.stream("POST", url + "/v1/completions", json={**body, "user": "hangup"}) as r:
            seen = b""
            for chunk in r.iter_raw():
                seen += chunk
                if seen.count(b"data: {") >= 3:
                    break  # three chunks in, of 200 tokens: hang up
    assert b'"usage"' not in seen
    deadline = time.monotonic() + 60
    while True:  # until the gateway's log has the record (a record is in the feed once it is durable)
        feed = httpx.get(url + "/moemeter/requests", params={"limit": 5000}).json()["records"]
        records = [r for r in feed if r["user"] == "hangup"]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    [rec] = records
    assert (rec["outcome"], rec["usage_reported"]) == ("client_disconnect", True), rec
    assert rec["prompt_tokens"] == whole["usage"]["prompt_tokens"] > 0
    assert 1 <= rec["generated_tokens"] < 200


def test_an_engine_killed_under_traffic_leaves_monitoring_up_and_comes_back(localstack, tmp_path):
    """`kill -9` of the decode vLLM server: the stack keeps the gateway, the router and the prefill
    server serving, the outage is stored (decode-0 down, the failed request recorded), and the
    engine is started again, its orphans (EngineCore, workers, holding its ports) killed first."""
    from collectors.scrape import http_fetch
    from collectors.service import Collector
    from stack.localstack import MODEL_NAME, process_tree
    from warehouse.db import Warehouse

    work, base, proc = localstack
    gateway, decode_url = f"http://127.0.0.1:{base + 3}", f"http://127.0.0.1:{base + 2}"
    body = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 4}

    def decode_server() -> int:
        for p in process_tree(proc.pid):
            c = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            if b"--kv-transfer-config" in c and c[c.index(b"--port") + 1] == str(base + 2).encode():
                return p
        raise AssertionError("no decode server in the stack's process tree")

    wh = Warehouse(tmp_path / "w.duckdb")
    collector = Collector(wh, work / "targets.json", interval=5.0)

    async def one_round() -> None:
        async with http_fetch() as fetch:
            await collector.round(fetch)

    try:
        killed = decode_server()
        os.kill(killed, signal.SIGKILL)
        while Path(f"/proc/{killed}").exists() and open(f"/proc/{killed}/stat").read().split()[2] != "Z":
            time.sleep(0.1)
        failed = httpx.post(gateway + "/v1/completions", json={**body, "user": "during-outage"}, timeout=120)
        assert failed.status_code >= 500 and "error" in failed.json()
        asyncio.run(one_round())
        assert proc.poll() is None  # the stack itself keeps running
        assert httpx.get(gateway + "/health").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{base + 1}/health").status_code == 200  # the prefill server
        deadline = time.monotonic() + scaled(400)
        while True:  # started again
            try:
                if httpx.get(decode_url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the decode server did not come back"
            time.sleep(1)
        assert decode_server() != killed
        while True:  # the router finds it again
            ok = httpx.post(gateway + "/v1/completions", json={**body, "user": "after-outage"}, timeout=120)
            if ok.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert ok.status_code == 200, ok.text
        for _ in range(5):  # both cores run vLLM: a scrape may time out now and then
            asyncio.run(one_round())
            health = wh.query_df("SELECT target, list(up ORDER BY ts) AS ups FROM scrapes GROUP BY 1 ORDER BY 1")
            if dict(zip(health.target, health.ups))["decode-0"][-1]:
                break
    finally:
        wh.close()
    ups = dict(zip(health.target, health.ups))
    assert not ups["decode-0"][0] and ups["decode-0"][-1]  # the outage, stored; then back
    assert any(ups["prefill-0"]) and any(ups["gateway"])
    outage = [
        r
        for r in httpx.get(gateway + "/moemeter/requests", params={"limit": 5000}).json()["records"]
        if r["user"] in ("during-outage", "after-outage")
    ]
    assert [(r["user"], r["outcome"] == "ok") for r in outage][:1] == [("during-outage", False)]
    assert ("after-outage", True) in [(r["user"], r["outcome"] == "ok") for r in outage]


def test_it_stops_cleanly_on_sigterm(localstack):
    work, base, proc = localstack
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(60) == 0
    for port in (base, base + 1, base + 2, base + 3, base + 9):
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
