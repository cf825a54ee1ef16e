"""Hostile spec-decode counters: a page's `vllm:spec_decode_*` families are read as vLLM writes
them and no other way. Positions that are not whole numbers in [0, 64) are not read (and never
relabel a real position); a broken exporter's counts give numbers, never NaN or infinity in JSON;
a restart counts from zero; two instances' engine 0 stay two rows. Each case is the real capture
(tests/fixtures/vllm-0.32.0-cpu-pd-decode-spec.metrics.txt) changed, stored by the real ingest
path, read by `report spec`."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import duckdb
import pytest

from collectors.parse import parse_page
from moemeter.contract import TargetInfo
from warehouse.api import LocalQuery
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.spec import spec_report

from ..conftest import FIXTURES

T0 = datetime(2026, 11, 29, 10, 0, 0)
CAPTURE = (FIXTURES / "vllm-0.32.0-cpu-pd-decode-spec.metrics.txt").read_text()
COUNTS = {"drafts": 71, "draft_tokens": 176, "accepted": 116, "pos": (56, 33, 27), "generated": 192}


def page(scale: float, extra: str = "", accepted: float | None = None) -> str:
    """The capture with its spec-decode and generated-token counters x scale (accepted set apart
    if given), and `extra` sample lines added to the per-position family."""

    def scaled(m: re.Match[str]) -> str:
        value = float(m.group(3)) * scale
        if accepted is not None and m.group(2) == "vllm:spec_decode_num_accepted_tokens_total":
            value = accepted
        return f"{m.group(1)} {value}"

    text = re.sub(
        r"^(((?:vllm:spec_decode_\w+_total|vllm:generation_tokens_total))\{[^}]*\}) (\S+)$", scaled, CAPTURE, flags=re.M
    )
    anchor = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-moe",position="2"}'
    line = next(x for x in text.splitlines() if x.startswith(anchor))
    return text.replace(line, line + extra)


def store(tmp_path, pages: list[tuple[str, str]]) -> duckdb.DuckDBPyConnection:
    """(target, page) in order, each target's scraped a minute after its last, from T0."""
    tmp_path.mkdir(exist_ok=True)
    db = tmp_path / "w.duckdb"
    wh = Warehouse(db)
    try:
        seen: dict[str, int] = {}
        for name, text in pages:
            k = seen[name] = seen.get(name, -1) + 1
            body = text.encode()
            target = TargetInfo(name, f"http://rack/{name}", "decode", 4)
            batch = ScrapeBatch(target, T0 + timedelta(minutes=k), True, 0.0, parse_page(body, "text/plain"))
            wh.write(lambda con, b=batch: Ingestor().write(con, b))
    finally:
        wh.close()
    return duckdb.connect(str(db), read_only=True)


def report(con, by: str = "pool") -> dict:
    data = spec_report(LocalQuery(con), T0, T0 + timedelta(hours=1), by).as_json()
    json.dumps(data, allow_nan=False)  # no NaN or infinity reaches a reader
    return data


def test_positions_that_are_no_position_are_not_read_and_relabel_nothing(tmp_path):
    bad = "".join(
        f'\nvllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="tiny-moe",position="{p}"}} {v}'
        for p, v in (("abc", 9e9), ("-1", 9e9), ("64", 9e9), ("1e99", 9e9), ("99999999999", 9e9), ("", 9e9))
    )
    con = store(tmp_path, [("decode-0", page(0, bad.replace(" 9e9", " 0"))), ("decode-0", page(100, bad))])
    [row] = report(con)["rows"]
    assert row["position_rates"] == pytest.approx([p / 71 for p in COUNTS["pos"]], abs=1e-6)
    assert (row["drafts"], row["accepted_tokens"]) == (7100, 11600)


def test_a_broken_exporters_counts_give_numbers_not_nan(tmp_path):
    # accepted ten times the draft tokens, and counters near the largest double
    con = store(tmp_path, [("decode-0", page(0)), ("decode-0", page(10, accepted=17600))])
    [row] = report(con)["rows"]
    assert row["acceptance_rate"] == pytest.approx(10.0) and row["rejected_tokens"] == 0 and row["rejected_share"] == 0
    con = store(tmp_path / "huge", [("decode-0", page(0)), ("decode-0", page(1e305))])
    [row] = report(con)["rows"]
    assert row["mean_acceptance_length"] == pytest.approx(1 + 116 / 71, abs=1e-6)


def test_a_restarted_engine_counts_from_zero(tmp_path):
    # 100x, then the engine restarts and counts 30x again: 130x in the hour, as vLLM counted them
    con = store(tmp_path, [("decode-0", page(0)), ("decode-0", page(100)), ("decode-0", page(30))])
    [row] = report(con)["rows"]
    assert row["drafts"] == 71 * 130 and row["accepted_tokens"] == 116 * 130


def test_two_instances_engine_0_stay_two_rows(tmp_path):
    pages = [("decode-0", page(0)), ("decode-1", page(0)), ("decode-0", page(10)), ("decode-1", page(1))]
    con = store(tmp_path, pages)
    rows = {(r["instance"], r["engine"]): r["drafts"] for r in report(con, "engine")["rows"]}
    assert rows == {("decode-0", "0"): 710, ("decode-1", "0"): 71}
    [pool] = report(con)["rows"]
    assert pool["drafts"] == 781


def test_a_pool_drafting_on_one_instance_only_shares_its_rejected_drafts_over_all_its_decode(tmp_path):
    """decode-0 drafts, decode-1 runs without a speculative config: the pool's acceptance is
    decode-0's, its rejected drafts' share is of both instances' decode compute (as the Roofline and
    Cost pages take it), and decode-1 has no row of its own."""
    plain = (FIXTURES / "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").read_text()

    def generated(n: float) -> str:
        return re.sub(r"^(vllm:generation_tokens_total\{[^}]*\}) \S+$", rf"\g<1> {n}", plain, flags=re.M)

    pages = [("decode-0", page(0)), ("decode-1", generated(0)), ("decode-0", page(10)), ("decode-1", generated(5000))]
    con = store(tmp_path, pages)
    [pool] = report(con)["rows"]
    rejected = (176 - 116) * 10
    assert pool["generated_tokens"] == 192 * 10 + 5000
    assert pool["rejected_share"] == pytest.approx(rejected / (192 * 10 + 5000 + rejected), abs=1e-6)
    assert pool["mean_acceptance_length"] == pytest.approx(1 + 116 / 71, abs=1e-6)
    assert [r["instance"] for r in report(con, "instance")["rows"]] == ["decode-0"]
