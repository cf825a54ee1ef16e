"""`make bench`: ingest, history, page queries, Prometheus, plugin and gateway overheads, as ratios in one run.

1. Ingest: the twin runs in its own process; this process scrapes the whole rack over HTTP,
   parses and inserts, N rounds. Baseline in the same run: the same pages parsed by
   prometheus_client's parser alone.
2. Live page: every Live query over a 15-minute window of fast-forwarded twin history
   (the page's default range), repeated; p50 and p95.
3. Against Prometheus: the whole rack scraped by Debian's Prometheus, then by `moemeter serve`
   (which also reads the gateway's request feed and the engines' expert snapshots), then by
   `moemeter serve` reading the same targets as metrics endpoints alone, as Prometheus does: CPU
   per 1,000 samples and peak memory of each, three times over; each ratio is the median of the
   three repeats' ratios.
4. Plugin overhead: real vLLM on CPU with and without the moemeter plugin, inter-token latency.
5. History: the twin fast-forwards a day (MOEMETER_BENCH_HISTORY, default 24h) of the whole
   rack, expert snapshots included, through the ingest path at a 60 s scrape interval: wall
   time, file size, peak memory; then every page's queries (benchmarks/pages.py) over 1 h,
   24 h and 7 days. Then, for a day, the day copied into a month as retention would leave it
   (benchmarks/month.py) and every page at 30 days. MOEMETER_BENCH_KEEP_DB=PATH keeps the file
   (the month, if one was made).
6. Gateway: the metering gateway and the twin's simulated OpenAI server in their own processes;
   one request at a time, non-streaming, direct to the upstream and through the gateway,
   interleaved: latency the gateway adds at p50 and p99; and streams direct and through it,
   tokens/s ratio: 4,000 tokens as fast as the upstream writes them (every process of the three
   then saturates a core: a worst case), and 1,000 tokens paced at ~1 ms (above the write-up's
   826 tokens/s for a single user).
Results go to benchmarks/results/latest.json, one entry per section with its date and commit, and
are printed. `python -m benchmarks.run SECTION ...` runs only the sections named (planner, ingest,
live_page, vs_prometheus, serve_memory, plugin_overhead, history, gateway, query_storm, fleet, storage),
replacing their entries.
7. Query storm: `moemeter serve` on the twin, rounds stored per minute with the query API quiet
   and with six readers keeping runaway queries going; /health latency during the storm.
8. Fleet (benchmarks/fleet.py): twenty racks x seven days of minute rollups published to one
   DuckLake on a real PostgreSQL: publish CPU per rack-minute, lake bytes per rack-day against the
   rack's DuckDB file, the Fleet page's reads p50/p95.
9. Storage (benchmarks/storage.py): 15 minutes of the rack at a 5 s scrape interval, raw bytes
   on disk per scraped sample, against Prometheus's TSDB blocks of the same samples (promtool).
10. Serve's memory: `moemeter serve` under its default memory cap and Debian's Prometheus side by
   side on the twin for an hour (MOEMETER_BENCH_SERVE_MINUTES): resident memory each minute.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import httpx
from prometheus_client.parser import text_string_to_metric_families

from collectors.scrape import http_fetch
from collectors.service import Collector
from collectors.targets import load_targets
from dashboard.data import live
from moemeter.contract import DEFAULT_INTERVAL
from stack.localstack import vllm_server_command, vllm_server_env
from stack.ready import wait_http
from warehouse.api import LocalQuery, QueryClient
from warehouse.db import Warehouse
from warehouse.read import Holdings, plan, served_by

from . import fleet, month, pages, storage

ROOT = Path(__file__).parents[1]
ROUNDS = 10
QUERY_REPEATS = 15


def bench_ingest(tmp: Path) -> dict[str, float]:
    targets = tmp / "targets.json"
    twin = subprocess.Popen(
        [sys.executable, "-m", "moemeter", "twin", "--targets-out", str(targets)], cwd=ROOT, stdout=subprocess.DEVNULL
    )
    try:
        while not targets.exists():
            time.sleep(0.2)
        time.sleep(1.0)
        pages = [httpx.get(t.url, timeout=30).text for t in load_targets(targets)]
        t0 = time.process_time()
        for _ in range(3):
            samples = sum(len(f.samples) for p in pages for f in text_string_to_metric_families(p))
        baseline_cpu = (time.process_time() - t0) / 3
        wh = Warehouse(tmp / "ingest.duckdb")
        collector = Collector(wh, targets, interval=DEFAULT_INTERVAL)

        async def rounds() -> tuple[float, float]:
            async with http_fetch() as fetch:
                await collector.round(fetch)  # first round creates the series
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for _ in range(ROUNDS):
                    await collector.round(fetch)
                    await asyncio.sleep(0.5)
                return (time.process_time() - cpu0) / ROUNDS, (time.perf_counter() - wall0) / ROUNDS - 0.5

        twin_cpu0, twin_wall0 = _cpu_seconds(twin.pid), time.perf_counter()
        cpu, wall = asyncio.run(rounds())
        twin_share = (_cpu_seconds(twin.pid) - twin_cpu0) / (time.perf_counter() - twin_wall0)
        wh.close()
    finally:
        twin.terminate()
        twin.wait(10)
    return {
        "samples_per_round": samples,
        "pipeline_cpu_seconds_per_round": round(cpu, 3),
        "pipeline_wall_seconds_per_round": round(wall, 3),
        "pipeline_samples_per_cpu_second": round(samples / cpu),
        "baseline_parse_cpu_seconds_per_round": round(baseline_cpu, 3),
        "baseline_samples_per_cpu_second": round(samples / baseline_cpu),
        "pipeline_over_baseline_cpu_ratio": round(cpu / baseline_cpu, 2),
        "share_of_5s_interval_on_one_core": round(cpu / DEFAULT_INTERVAL, 3),
        "twin_cpu_share_of_one_core_while_scraped": round(twin_share, 3),
    }


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _scrape_config(targets: Path, out: Path) -> Path:
    """Prometheus's config for the twin's rack at serve's interval, once the twin has written its
    targets file."""
    while not targets.exists():
        time.sleep(0.2)
    hosts = [t.url.split("//")[1].split("/")[0] for t in load_targets(targets)]
    config = {
        "global": {"scrape_interval": f"{DEFAULT_INTERVAL:g}s", "scrape_timeout": f"{DEFAULT_INTERVAL:g}s"},
        "scrape_configs": [{"job_name": "rack", "static_configs": [{"targets": hosts}]}],
    }
    out.write_text(json.dumps(config))
    return out


def bench_vs_prometheus(tmp: Path, seconds: float = 60.0, repeats: int = 3) -> dict[str, object]:
    """The same rack scraped every 5 s by Debian's Prometheus and by `moemeter serve`, one after
    the other for `seconds` each, `repeats` times over: CPU-seconds per 1,000 samples and peak
    memory of each process. A ratio is taken within each repeat (the runs next to each other in
    time) and the median of the repeats is reported: one run's ratio moved by 15% from run to run
    on the same commit."""
    import shutil

    prometheus = shutil.which("prometheus")
    if prometheus is None:
        return {"skipped": "no prometheus binary (Debian package prometheus)"}
    targets = tmp / "vs.json"
    twin = subprocess.Popen(
        [sys.executable, "-m", "moemeter", "twin", "--targets-out", str(targets)], cwd=ROOT, stdout=subprocess.DEVNULL
    )
    out: dict[str, object] = {"seconds_each": seconds, "scrape_interval_seconds": DEFAULT_INTERVAL, "repeats": repeats}
    names = ("prometheus", "moemeter_collector", "moemeter_collector_metrics_only")
    labels = {"moemeter_collector": "collector", "moemeter_collector_metrics_only": "metrics_only"}
    runs: list[dict[str, dict[str, float]]] = []
    try:
        _scrape_config(targets, tmp / "prom.yml")
        # The same targets as metrics endpoints alone: Prometheus reads neither the gateway's
        # request feed (~10,000 records a round here) nor the engines' expert snapshots, and serve
        # reads them only from targets of those roles.
        metrics_only = tmp / "vs-metrics.json"
        entries = json.loads(targets.read_text())
        metrics_only.write_text(json.dumps([{**e, "role": "router" if e["role"] != "gpu" else "gpu"} for e in entries]))

        def command(name: str, repeat: int) -> tuple[list[str], str]:
            if name == "prometheus":
                return [
                    prometheus,
                    f"--config.file={tmp / 'prom.yml'}",
                    f"--storage.tsdb.path={tmp / f'tsdb{repeat}'}",
                    "--web.listen-address=127.0.0.1:19090",
                ], "http://127.0.0.1:19090/-/ready"
            which = targets if name == "moemeter_collector" else metrics_only
            db = tmp / f"{name}-{repeat}.duckdb"
            serve = ["-m", "moemeter", "serve", "--targets", str(which), "--db", str(db), "--api-port", "18431"]
            return [sys.executable, *serve], "http://127.0.0.1:18431/health"

        for repeat in range(repeats):
            run: dict[str, dict[str, float]] = {}
            for name in names:
                cmd, ready = command(name, repeat)
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    wait_http(ready, 60)
                    time.sleep(12)  # past the first scrapes, which create every series
                    cpu0 = _cpu_seconds(proc.pid)
                    before = _samples_seen(name)
                    time.sleep(seconds)
                    cpu = _cpu_seconds(proc.pid) - cpu0
                    samples = _samples_seen(name) - before
                    run[name] = {
                        "cpu_seconds": round(cpu, 3),
                        "samples": samples,
                        "cpu_seconds_per_1000_samples": round(1000 * cpu / max(samples, 1), 5),
                        "peak_rss_megabytes": round(_peak_rss_mb(proc.pid)),
                    }
                finally:
                    proc.terminate()
                    proc.wait(30)
            runs.append(run)
    finally:
        twin.terminate()
        twin.wait(10)
    out["runs"] = runs
    if not runs:
        return out
    for name in names:
        out[name] = {k: statistics.median(r[name][k] for r in runs) for k in runs[0][name]}
    p = "prometheus"
    for name, label in labels.items():
        per_sample = [
            r[name]["cpu_seconds_per_1000_samples"] / max(r[p]["cpu_seconds_per_1000_samples"], 1e-9) for r in runs
        ]
        memory = [r[name]["peak_rss_megabytes"] / r[p]["peak_rss_megabytes"] for r in runs]
        out[f"{label}_over_prometheus_cpu_per_sample"] = round(statistics.median(per_sample), 2)
        out[f"{label}_over_prometheus_cpu_per_sample_each_repeat"] = [round(x, 2) for x in per_sample]
        out[f"{label}_over_prometheus_peak_memory"] = round(statistics.median(memory), 2)
    return out


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_serve_memory(tmp: Path) -> dict[str, object]:
    """`moemeter serve` (its default memory cap) and Debian's Prometheus side by side on the twin's
    rack at 5 s for MOEMETER_BENCH_SERVE_MINUTES (default 60): each one's resident memory once a
    minute, the peaks' ratio, and how much `serve` grew after its first 10 minutes (its most at
    any later minute over its most in the first 10)."""
    import shutil

    minutes = int(os.environ.get("MOEMETER_BENCH_SERVE_MINUTES", "60"))
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        return {"skipped": "no prometheus binary (Debian package prometheus)"}
    targets = tmp / "mem.json"
    twin = subprocess.Popen(
        [sys.executable, "-m", "moemeter", "twin", "--targets-out", str(targets)], cwd=ROOT, stdout=subprocess.DEVNULL
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        _scrape_config(targets, tmp / "mem-prom.yml")
        serve = [sys.executable, "-m", "moemeter", "serve", "--targets", str(targets), "--db", str(tmp / "mem.duckdb")]
        prom = [prometheus, f"--config.file={tmp / 'mem-prom.yml'}", f"--storage.tsdb.path={tmp / 'mem-tsdb'}"]
        for cmd, ready in (
            ([*serve, "--api-port", "18431"], "http://127.0.0.1:18431/health"),
            ([*prom, "--web.listen-address=127.0.0.1:19090"], "http://127.0.0.1:19090/-/ready"),
        ):
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(ready, 60)
        rss: dict[str, list[float]] = {"serve": [], "prometheus": []}
        for _ in range(minutes):
            time.sleep(60)
            for name, proc in zip(rss, procs, strict=True):
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} during the memory run")
                rss[name].append(round(_rss_mb(proc.pid)))
        peaks = {name: round(_peak_rss_mb(proc.pid)) for name, proc in zip(rss, procs, strict=True)}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
        twin.terminate()
        twin.wait(10)
    first, later = max(rss["serve"][:10]), rss["serve"][10:]
    return {
        "minutes": minutes,
        "scrape_interval_seconds": DEFAULT_INTERVAL,
        "serve_rss_megabytes_each_minute": rss["serve"],
        "prometheus_rss_megabytes_each_minute": rss["prometheus"],
        "serve_peak_rss_megabytes": peaks["serve"],
        "prometheus_peak_rss_megabytes": peaks["prometheus"],
        "serve_over_prometheus_peak_rss": round(peaks["serve"] / peaks["prometheus"], 2),
        "serve_growth_after_10_minutes": round(max(later) / first, 3) if later else None,  # None: 10 minutes or less
    }


def _samples_seen(name: str) -> int:
    """Samples appended so far: Prometheus' own counter, or the warehouse's scrape log."""
    if name == "prometheus":
        page = httpx.get("http://127.0.0.1:19090/metrics").text
        return int(
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in page.splitlines()
                if line.startswith("prometheus_tsdb_head_samples_appended_total")
            )
        )
    r = httpx.post(
        "http://127.0.0.1:18431/query",
        json={"sql": "SELECT coalesce(sum(samples), 0) FROM scrapes WHERE up", "format": "json"},
    ).json()
    return int(r["rows"][0][0])


def bench_live_page(tmp: Path) -> dict[str, float]:
    db = tmp / "history.duckdb"
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "moemeter", "twin", "--fast-forward", "15m", "--db", str(db)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    history_wall = time.perf_counter() - t0
    wh = Warehouse(db)
    with wh.cursor() as cur:
        q = LocalQuery(cur)
        end = live.latest_scrape_time(q)
        assert end is not None
        result: dict[str, object] = {}
        for label, seconds in (("15min_raw", 900), ("6h_rollups", 6 * 3600)):
            w = live.Window.ending(end, seconds)
            p50, p95 = pages.timed(lambda w=w: pages.live_queries(q, w), QUERY_REPEATS)  # type: ignore[misc]
            result[f"live_page_{label}_p50_seconds"], result[f"live_page_{label}_p95_seconds"] = p50, p95
            result[f"live_page_{label}_tables"] = ",".join(
                served_by(plan(w.start, w.end, w.step_seconds, Holdings.of(q)))
            )
        rows = cur.execute("SELECT count(*) FROM samples").fetchall()[0][0]
    wh.close()
    return {
        "history_minutes": 15,
        "history_samples": rows,
        "history_fast_forward_wall_seconds": round(history_wall, 1),
        "db_megabytes": round(db.stat().st_size / 1e6, 1),
        **result,
    }


def bench_history(tmp: Path) -> dict[str, object]:
    span = os.environ.get("MOEMETER_BENCH_HISTORY", "24h")
    keep = os.environ.get("MOEMETER_BENCH_KEEP_DB")  # a path: the history stays there for `benchmarks.pages`
    db = Path(keep) if keep else tmp / "day.duckdb"
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "moemeter", "twin", "--fast-forward", span, "--interval", "60", "--db", str(db)],
        cwd=ROOT,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    ff = json.loads(out.strip().splitlines()[-1])
    result: dict[str, object] = {
        "span": span,
        "scrape_interval_seconds": 60,
        "wall_seconds": round(time.perf_counter() - t0),
        "samples": ff["samples"],
        "db_megabytes": ff["db_megabytes"],
        "peak_rss_megabytes": ff["peak_rss_megabytes"],
        "twin_peak_rss_megabytes": ff["twin_peak_rss_megabytes"],
    }
    with duckdb.connect(str(db), read_only=True) as con:
        for table in (
            "samples",
            "increments",
            "increments_1m",
            "increments_6m",
            "increments_1h",
            "pool_histograms_1m",
            "expert_load",
            "requests",
        ):
            result[f"rows_{table}"] = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
    result["pages"] = pages.time_pages(db)
    if span == "24h" and (short := month.room(db)) is not None:
        result["month"] = {"not_made": short}
    elif span == "24h":
        t0 = time.perf_counter()
        rows = month.extend(db)
        result["month"] = {
            "days": month.DAYS,
            "build_wall_seconds": round(time.perf_counter() - t0),
            "db_megabytes": round(db.stat().st_size / 1e6),
            **{f"rows_{t}": n for t, n in rows.items()},
            "pages": pages.time_pages(db, spans=("30d",)),
        }
    return result


def bench_plugin_overhead(tmp: Path, requests: int = 12, tokens: int = 48) -> dict[str, object]:
    """Real vLLM on CPU, the tiny MoE, one request at a time: the mean inter-token latency
    (vLLM's own histogram, i.e. the engine step for a batch of one) with the plugin and without
    it (VLLM_PLUGINS= loads no plugin), the two servers run one after the other, three rounds."""
    python = ROOT / ".vllm-venv" / "bin" / "python"
    if not python.exists():
        return {"skipped": "no .vllm-venv (make vllm-env)"}
    model = tmp / "tiny-model"
    subprocess.run(
        [str(python), str(ROOT / "stack/profiles/local-cpu/make_model.py"), str(model)], check=True, capture_output=True
    )
    itl: dict[str, list[float]] = {"with_plugin": [], "without_plugin": []}
    for _ in range(3):
        for label, plugins in (("with_plugin", "moemeter"), ("without_plugin", "")):
            proc = subprocess.Popen(
                vllm_server_command(python, model, 18291, 2048, "--load-format", "dummy"),
                env=vllm_server_env("0", {"VLLM_PLUGINS": plugins}),  # "": vLLM loads no plugin
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                url = "http://127.0.0.1:18291"
                wait_http(url + "/health", 300)
                body = {"model": "tiny-moe", "prompt": "warm up", "max_tokens": 4, "ignore_eos": True}
                httpx.post(url + "/v1/completions", json=body, timeout=120)
                before = _itl(url)
                for i in range(requests):
                    body = {
                        "model": "tiny-moe",
                        "prompt": f"request {i} about experts",
                        "max_tokens": tokens,
                        "ignore_eos": True,
                    }
                    httpx.post(url + "/v1/completions", json=body, timeout=300)
                after = _itl(url)
                itl[label].append((after[0] - before[0]) / (after[1] - before[1]))
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)
    med = {k: statistics.median(v) for k, v in itl.items()}
    return {
        "requests_per_round": requests,
        "tokens_per_request": tokens,
        "rounds": 3,
        "itl_ms_with_plugin": [round(1000 * x, 3) for x in itl["with_plugin"]],
        "itl_ms_without_plugin": [round(1000 * x, 3) for x in itl["without_plugin"]],
        "step_time_with_over_without_median": round(med["with_plugin"] / med["without_plugin"], 4),
        "gpu": "not measured: no GPU is lent to this project's machines",
    }


def _itl(url: str) -> tuple[float, float]:
    page = httpx.get(url + "/metrics").text
    total = count = 0.0
    for line in page.splitlines():
        if line.startswith("vllm:inter_token_latency_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:inter_token_latency_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def bench_planner() -> dict[str, object]:
    """Both EPLB policies on the reference shape: 43 layers, 256 experts, 320 slots, 64 GPUs."""
    import numpy as np

    from moemeter.contract.eplb import PlanInput, plan_refined, plan_vllm

    rng = np.random.default_rng(0)
    loads = {
        "zipf_s1.0": np.stack([rng.permutation(1e6 / np.arange(1, 257) ** 1.0) for _ in range(43)]),
        "zipf_s1.2": np.stack([rng.permutation(1e6 / np.arange(1, 257) ** 1.2) for _ in range(43)]),
        "hot_experts": rng.integers(50, 150, (43, 256)).astype(float) * np.where(rng.random((43, 256)) < 0.02, 20, 1),
    }
    out: dict[str, object] = {}
    for name, w in loads.items():
        for nodes in (1, 8):
            inp = PlanInput(w, 320, 8, nodes, 64).validated()
            tv, tr = [], []
            for _ in range(3):
                t = time.perf_counter()
                base = plan_vllm(inp)
                tv.append(time.perf_counter() - t)
                t = time.perf_counter()
                refined = plan_refined(inp, base)
                tr.append(time.perf_counter() - t)
            ratio = refined.rank_load.max(axis=1) / base.rank_load.max(axis=1)
            out[f"{name}_nodes{nodes}"] = {
                "vllm_ms": round(1000 * statistics.median(tv), 1),
                "refined_ms_excluding_vllm": round(1000 * statistics.median(tr), 1),
                "max_rank_load_refined_over_vllm_mean": round(float(ratio.mean()), 3),
                "max_rank_load_refined_over_vllm_best_layer": round(float(ratio.min()), 3),
                "balancedness_vllm_mean": round(float(np.nanmean(base.balancedness)), 3),
                "balancedness_refined_mean": round(float(np.nanmean(refined.balancedness)), 3),
            }
    return out


UPSTREAM_SCRIPT = """
import sys
from aiohttp import web
from stack.twin.upstream import SimulatedUpstream
web.run_app(SimulatedUpstream(model="bench").app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None,
            print=None)
"""


def _quantile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def _gateway_rounds(
    direct: str, through: str, requests: int, stream_tokens: int, streams: int
) -> dict[str, list[float]]:
    import aiohttp

    out: dict[str, list[float]] = {
        "direct": [],
        "through": [],
        "stream_direct": [],
        "stream_through": [],
        "paced_direct": [],
        "paced_through": [],
    }
    body = {"model": "bench", "prompt": "one two three four five six seven eight", "max_tokens": 16}
    long: dict[str, Any] = {"model": "bench", "prompt": "a b c", "max_tokens": stream_tokens, "stream": True}
    async with aiohttp.ClientSession() as session:
        for url in (direct, through):  # warm up both paths (connections, the gateway's model list)
            for _ in range(50):
                async with session.post(url + "/v1/completions", json=body) as r:
                    await r.read()
        for i in range(requests):
            for name, url in (("direct", direct), ("through", through))[:: 1 if i % 2 else -1]:
                t = time.perf_counter()
                async with session.post(url + "/v1/completions", json=body) as r:
                    await r.read()
                    assert r.status == 200, r.status
                out[name].append(time.perf_counter() - t)
        paced = {**long, "max_tokens": 1000, "twin_itl_seconds": 0.001}  # ~1,000 tok/s, above the 826 single-user
        for kind, req in (("stream", long), ("paced", paced)):
            for i in range(streams):
                for name, url in ((f"{kind}_direct", direct), (f"{kind}_through", through))[:: 1 if i % 2 else -1]:
                    t = time.perf_counter()
                    async with session.post(url + "/v1/completions", json=req) as r:
                        async for _ in r.content:
                            pass
                    out[name].append(req["max_tokens"] / (time.perf_counter() - t))
    return out


def bench_gateway(tmp: Path, requests: int = 3000, stream_tokens: int = 4000, streams: int = 10) -> dict[str, object]:
    from tests.e2e.test_browser import free_port

    up_port, gw_port = free_port(), free_port()
    up = subprocess.Popen([sys.executable, "-c", UPSTREAM_SCRIPT, str(up_port)], cwd=ROOT)
    gw = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "gateway",
            "--upstream",
            f"http://127.0.0.1:{up_port}",
            "--port",
            str(gw_port),
            "--records",
            str(tmp / "gateway.sqlite"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{up_port}/v1/models", 30)
        wait_http(f"http://127.0.0.1:{gw_port}/health", 30)
        t = asyncio.run(
            _gateway_rounds(
                f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}", requests, stream_tokens, streams
            )
        )
        gw_cpu = _cpu_seconds(gw.pid)
    finally:
        for p in (gw, up):
            p.terminate()
            p.wait(10)
    d50, t50 = _quantile(t["direct"], 0.5), _quantile(t["through"], 0.5)
    d99, t99 = _quantile(t["direct"], 0.99), _quantile(t["through"], 0.99)
    sd, st = statistics.median(t["stream_direct"]), statistics.median(t["stream_through"])
    pd_, pt = statistics.median(t["paced_direct"]), statistics.median(t["paced_through"])
    return {
        "requests_each_way": requests,
        "direct_p50_ms": round(d50 * 1e3, 3),
        "through_p50_ms": round(t50 * 1e3, 3),
        "added_p50_ms": round((t50 - d50) * 1e3, 3),
        "added_p99_ms": round((t99 - d99) * 1e3, 3),
        "through_over_direct_p50": round(t50 / d50, 3),
        "stream_tokens": stream_tokens,
        "stream_direct_tokens_per_second": round(sd),
        "stream_through_tokens_per_second": round(st),
        "stream_through_over_direct": round(st / sd, 3),
        "paced_stream_direct_tokens_per_second": round(pd_),
        "paced_stream_through_tokens_per_second": round(pt),
        "paced_stream_through_over_direct": round(pt / pd_, 4),
        "gateway_cpu_seconds": round(gw_cpu, 2),
    }


def bench_query_storm(tmp: Path, seconds: float = 60.0, clients: int = 6, timeout: float = 10.0) -> dict[str, object]:
    """`moemeter serve` on the twin: rounds stored per minute while the query API is quiet, then
    while `clients` readers keep runaway queries going (each stopped at `timeout`); /health's
    latency throughout the storm."""
    from tests.e2e.test_browser import free_port

    targets, db, port = tmp / "storm-targets.json", tmp / "storm.duckdb", free_port()
    api = f"http://127.0.0.1:{port}"
    twin = subprocess.Popen(
        [sys.executable, "-m", "moemeter", "twin", "--targets-out", str(targets)], cwd=ROOT, stdout=subprocess.DEVNULL
    )
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "serve",
            "--targets",
            str(targets),
            "--db",
            str(db),
            "--api-port",
            str(port),
            "--wait-targets",
            "600",
            "--query-timeout",
            str(timeout),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stop = threading.Event()
    answers: list[tuple[int, float]] = []

    def storm() -> None:
        with httpx.Client() as c:
            while not stop.is_set():
                asked = time.perf_counter()
                r = c.post(f"{api}/query", json={"sql": "SELECT sum(range) FROM range(10000000000000)"}, timeout=60)
                answers.append((r.status_code, time.perf_counter() - asked))

    def rounds(a: float, b: float) -> int:
        sql = "SELECT count(DISTINCT ts) n FROM scrapes WHERE ts >= to_timestamp(?)::TIMESTAMP AND ts < to_timestamp(?)::TIMESTAMP"
        return int(QueryClient(api)(sql, [a, b])["n"][0])

    try:
        wait_http(f"{api}/health", 600, {"serve": serve, "twin": twin})
        while not rounds(0, time.time() + 1):  # the first round is in
            time.sleep(0.5)
        quiet0 = time.time()
        time.sleep(seconds)
        storm0 = time.time()
        threads = [threading.Thread(target=storm) for _ in range(clients)]
        for t in threads:
            t.start()
        health: list[float] = []
        while time.time() < storm0 + seconds:
            asked = time.perf_counter()
            httpx.get(f"{api}/health", timeout=30).raise_for_status()
            health.append(time.perf_counter() - asked)
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
        storm1 = time.time()
        quiet, stormy = rounds(quiet0, storm0), rounds(storm0, storm0 + seconds)
    finally:
        for p in (serve, twin):
            p.terminate()
            p.wait(30)
    stopped = [d for code, d in answers if code == 504]
    return {
        "seconds_per_phase": seconds,
        "clients": clients,
        "query_timeout_seconds": timeout,
        "rounds_quiet": quiet,
        "rounds_during_storm": stormy,
        "storm_over_quiet_rounds": round(stormy / quiet, 3),
        "runaway_queries_stopped": len(stopped),
        "other_answers": sorted({c for c, _ in answers if c != 504}),
        "runaway_seconds_max": round(max(stopped), 2) if stopped else None,
        "health_seconds_p50": round(_quantile(health, 0.5), 4),
        "health_seconds_max": round(max(health), 4),
        "storm_wall_seconds": round(storm1 - storm0, 1),
    }


SECTIONS = {
    "planner": lambda tmp: bench_planner(),
    "ingest": bench_ingest,
    "live_page": bench_live_page,
    "vs_prometheus": bench_vs_prometheus,
    "serve_memory": bench_serve_memory,
    "plugin_overhead": bench_plugin_overhead,
    "gateway": bench_gateway,
    "history": bench_history,
    "query_storm": bench_query_storm,
    "fleet": fleet.bench_fleet,
    "storage": storage.bench_storage,
}


RESULTS = ROOT / "benchmarks" / "results" / "latest.json"

TARGETS = (
    # (what, section, how the figure is read from it, at most)
    ("raw storage, bytes per scraped sample", "storage", lambda r: r["raw_bytes_per_sample"], 1.5),
    ("a request record, bytes", "storage", lambda r: r.get("request_bytes_per_record"), 16.0),
    (
        "ingest CPU per sample, metrics alone, x Prometheus's",
        "vs_prometheus",
        lambda r: r["metrics_only_over_prometheus_cpu_per_sample"],
        1.0,
    ),
    (
        "ingest CPU per sample, with the request feed, x Prometheus's",
        "vs_prometheus",
        lambda r: r["collector_over_prometheus_cpu_per_sample"],
        1.5,
    ),
    (
        "serve's peak memory, x Prometheus's, side by side",
        "serve_memory",
        lambda r: r["serve_over_prometheus_peak_rss"],
        2.0,
    ),
    (
        "serve's memory after its first 10 minutes, x its most in them",
        "serve_memory",
        lambda r: r["serve_growth_after_10_minutes"],
        1.1,
    ),
    (
        "slowest page's p95 at 24 h, seconds",
        "history",
        lambda r: max(v for k, v in r["pages"].items() if k.endswith("_24h_p95_seconds")),
        0.15,
    ),
    (
        "slowest page's p95 at 30 days, seconds",
        "history",
        lambda r: (
            max(v for k, v in r["month"]["pages"].items() if k.endswith("_30d_p95_seconds"))
            if "pages" in r.get("month", {})
            else None
        ),
        0.25,
    ),
    ("a day fast-forwarded at 60 s, minutes", "history", lambda r: r["wall_seconds"] / 60, 20.0),
    ("a day fast-forwarded at 60 s, peak memory, GB", "history", lambda r: r["peak_rss_megabytes"] / 1000, 4.0),
)
"""The targets (docs/operations.md; issue #51's), each read from its section's last result."""


def targets(result: dict[str, Any]) -> list[str]:
    """A line per target: the figure, the bound, met or not, and which run measured it."""
    lines = []
    for what, name, read, bound in TARGETS:
        section = result.get(name)
        if section is None or (name == "history" and section.get("span") != "24h"):
            lines.append(f"{what}: not measured (run `python -m benchmarks.run {name}`)")
            continue
        figure = read(section)
        if figure is None:
            lines.append(f"{what}: not measured in the last run of {name} (its entry in {RESULTS.name} says why)")
            continue
        verdict = "met" if figure <= bound else "NOT met"
        lines.append(
            f"{what}: {figure:.3g} (at most {bound:g}: {verdict}) - {section['commit']}, {section['measured_at']}"
        )
    return lines


def main() -> None:
    names = sys.argv[1:] or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        sys.exit(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    path = RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    changed = ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"]
    if subprocess.run(changed, cwd=ROOT, capture_output=True, text=True).stdout.strip():
        commit = commit.strip() + "+changes"  # measured on a tree that commit does not hold
    with tempfile.TemporaryDirectory() as d:
        for name in names:  # each section replaces its own entry; the others keep theirs, with their own date
            measured = {"measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit.strip()}
            section: dict[str, object] = SECTIONS[name](Path(d))  # type: ignore[operator, assignment]
            result[name] = {**measured, **section}
            path.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps({name: result[name]}, indent=2), flush=True)
    print("\n".join(["targets:", *targets(result)]))


if __name__ == "__main__":
    main()
