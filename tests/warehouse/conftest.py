"""The rack the cost test checks to the cent (tests/warehouse/test_cost.py gives the numbers by hand):
five real vLLM 0.32 pages per instance with known token counters, and three gateway records."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from collectors.parse import parse_page
from moemeter.contract import TargetInfo
from moemeter.contract.requests import RequestRecord
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.requests import RequestIngestor

FIXTURES = Path(__file__).parents[1] / "fixtures"
T0 = datetime(2026, 11, 29, 10, 0, 5)
TIMES = [
    T0,
    T0 + timedelta(minutes=30),
    T0 + timedelta(minutes=60),
    T0 + timedelta(minutes=90),
    datetime(2026, 11, 29, 11, 59, 55),
]
PREFILL_PROMPT = [0, 1_000_000, 3_000_000, 500_000, 1_500_000]  # the engine restarted before the 4th scrape
PREFILL_HITS = [0, 400_000, 1_000_000, 100_000, 300_000]
DECODE_GENERATED = [0, 200_000, 500_000, 1_000_000, 1_000_000]


def page(capture: str, values: dict[str, float]) -> str:
    """The real capture with the named counters set (`metric` or `metric{source}` keys)."""
    text = (FIXTURES / capture).read_text()
    for key, v in values.items():
        metric, _, source = key.partition("|")
        label = f',source="{source}"' if source else ""
        text, n = re.subn(
            rf'^({re.escape(metric)}\{{engine="0",model_name="tiny-deepseek"{label}\}}) \S+$',
            rf"\g<1> {float(v)}",
            text,
            flags=re.M,
        )
        assert n == 1, key
    return text


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cost")
    db = tmp / "w.duckdb"
    for k, at in enumerate(TIMES):
        pf = tmp / f"prefill-{k}.txt"
        pf.write_text(
            page(
                "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt",
                {
                    "vllm:prompt_tokens_total": PREFILL_PROMPT[k],
                    "vllm:prompt_tokens_by_source_total|local_cache_hit": PREFILL_HITS[k],
                    "vllm:generation_tokens_total": 7 * k,
                },
            )
        )  # a prefill's single tokens are not output
        dc = tmp / f"decode-{k}.txt"
        dc.write_text(
            page(
                "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt",
                {
                    "vllm:prompt_tokens_total": 999 * k,  # arrived by KV transfer: never counted again
                    "vllm:generation_tokens_total": DECODE_GENERATED[k],
                },
            )
        )
        for name, f, role, gpus in (("prefill-0", pf, "prefill", 2), ("decode-0", dc, "decode", 4)):
            body = f.read_bytes()
            target = TargetInfo(name, f"file://{f.resolve()}", role, gpus)
            batch = ScrapeBatch(target, at, True, 0.0, parse_page(body, "text/plain"), bytes=len(body))
            wh = Warehouse(db)
            try:
                wh.write(lambda con, batch=batch: Ingestor().write(con, batch))
            finally:
                wh.close()
    wh = Warehouse(db)
    recs = [
        RequestRecord(
            "r1",
            (T0 - datetime(1970, 1, 1)).total_seconds() + 600,
            "alice",
            "acme",
            "m",
            "completions",
            False,
            200,
            "ok",
            300,
            100,
            50,
            e2e_seconds=2.0,
        ),
        RequestRecord(
            "r2",
            (T0 - datetime(1970, 1, 1)).total_seconds() + 4000,
            "bob",
            "acme",
            "m",
            "completions",
            False,
            200,
            "ok",
            100,
            0,
            150,
            e2e_seconds=2.0,
        ),
        RequestRecord(
            "r3",
            (T0 - datetime(1970, 1, 1)).total_seconds() + 9000,
            "carol",
            "acme",
            "m",
            "completions",
            False,
            200,
            "ok",
            100,
            0,
            150,
            e2e_seconds=2.0,
        ),
    ]  # r3 finishes after the window
    feed = {
        "schema": "moemeter.requests/1",
        "log_id": "A",
        "records": [{"seq": i + 1, **r.to_json()} for i, r in enumerate(recs)],
    }
    wh.write(lambda con: RequestIngestor().write(con, "gateway", feed, TIMES[-1]))
    wh.close()
    targets = tmp / "targets.json"
    targets.write_text(
        json.dumps(
            [
                {"name": "prefill-0", "url": "http://p/metrics", "role": "prefill", "gpus": 2},
                {"name": "decode-0", "url": "http://d/metrics", "role": "decode", "gpus": 4},
                {"name": "router", "url": "http://r/metrics", "role": "router", "gpus": 0},
            ]
        )
    )
    return db, targets


def contract_sheet(tmp_path: Path, decode_repriced: str) -> Path:
    """A price sheet: $3/GPU-hour for every pool from 2026, $4 for decode from `decode_repriced`."""
    sheet = tmp_path / "prices.toml"
    sheet.write_text(f"""name = "contract"
[[gpu]]
effective = "2026-01-01T00:00:00Z"
pool = "*"
usd_per_gpu_hour = 3.00
source = "rental contract 2026"
[[gpu]]
effective = "{decode_repriced}"
pool = "decode"
usd_per_gpu_hour = 4.00
source = "decode GPUs repriced"
""")
    return sheet
