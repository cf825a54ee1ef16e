"""warehouse/spec.py: the spec-decode figures of a window equal vLLM's own formulas over the
counters' increases (vllm/v1/spec_decode/metrics.py, SpecDecodingLogging and `vllm bench serve`
both sum first and divide once), per pool, instance and engine, and the report's formats."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import duckdb
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.parse import parse_page
from moemeter.contract import TargetInfo
from stack.twin.config import load_profile
from stack.twin.server import Twin
from warehouse.api import LocalQuery
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.spec import KEYS, REJECTED_BASIS, counts, over_time, spec_report

SCRAPES = (60.0, 90.0, 120.0)


def totals(page: str) -> dict[str, dict[str, float]]:
    """Per engine: vLLM's spec-decode counters and generated tokens, position counters as `pos<i>`."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name.startswith(("vllm:spec_decode", "vllm:generation_tokens_total")) and s.name.endswith("_total"):
                key = s.name + (f"pos{s.labels['position']}" if "position" in s.labels else "")
                out.setdefault(s.labels["engine"], {})[key] = s.value
    return out


@pytest.fixture(scope="module")
def drafted(tmp_path_factory):
    """The twin's decode-0 and prefill-0 pages scraped three times, 30 s apart, an hour ago."""
    start = (datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1)).replace(microsecond=0)
    epoch = (start - datetime(1970, 1, 1)).total_seconds()
    twin = Twin(load_profile("deepseek-v4.1-flash"), seed=9, start=epoch)
    db = tmp_path_factory.mktemp("spec") / "w.duckdb"
    pages = []
    wh = Warehouse(db)
    try:
        for at in SCRAPES:
            rendered = twin.pages(epoch + at)
            pages.append(rendered["decode-0"])
            for name, role, gpus in (("decode-0", "decode", 64), ("prefill-0", "prefill", 2)):
                body = rendered[name].encode()
                target = TargetInfo(name, f"http://twin/{name}", role, gpus)
                batch = ScrapeBatch(target, start + timedelta(seconds=at), True, 0.0, parse_page(body, "text/plain"))
                wh.write(lambda con, batch=batch: Ingestor().write(con, batch))
    finally:
        wh.close()
    return db, start, pages


def vllms_figures(first: str, last: str, engines: set[str] | None = None) -> dict[str, object]:
    """SpecDecodingLogging's arithmetic over the increases between two pages."""
    a, b = totals(first), totals(last)
    picked = sorted(engines or b)
    inc = {k: sum(b[e][k] - a[e][k] for e in picked) for k in b[picked[0]]}
    drafts = inc["vllm:spec_decode_num_drafts_total"]
    accepted = inc["vllm:spec_decode_num_accepted_tokens_total"]
    drafted = inc["vllm:spec_decode_num_draft_tokens_total"]
    positions = sorted(k for k in inc if "per_pos" in k)
    return {
        "drafts": drafts,
        "acceptance_rate": accepted / drafted,
        "mean_acceptance_length": 1 + accepted / drafts,
        "position_rates": [inc[k] / drafts for k in positions],
        "rejected_share": (drafted - accepted) / (inc["vllm:generation_tokens_total"] + drafted - accepted),
    }


def read(db, fn):
    with duckdb.connect(str(db), read_only=True) as con:
        return fn(LocalQuery(con))


def report(db, start, by, **kw):
    window = (start + timedelta(seconds=SCRAPES[0]), start + timedelta(seconds=SCRAPES[-1], microseconds=1))
    return read(db, lambda q: spec_report(q, *window, by, **kw))


def test_the_pools_figures_are_vllms_over_the_same_window(drafted):
    db, start, pages = drafted
    data = report(db, start, "pool").as_json()
    [row] = data["rows"]  # prefill drafts nothing: no row
    want = vllms_figures(pages[0], pages[-1])
    assert row["pool"] == "decode" and row["drafts"] == want["drafts"] > 10_000
    for key in ("acceptance_rate", "mean_acceptance_length", "rejected_share"):
        assert row[key] == pytest.approx(want[key], abs=1e-6), key
    assert row["position_rates"] == pytest.approx(want["position_rates"], abs=1e-6)
    assert 2.0 < row["mean_acceptance_length"] < 3.2 and data["rejected_share_basis"] == REJECTED_BASIS


def test_each_engine_is_its_own_figure(drafted):
    db, start, pages = drafted
    rows = report(db, start, "engine").as_json()["rows"]
    assert len(rows) == 64
    for row in rows[:5]:
        want = vllms_figures(pages[0], pages[-1], {row["engine"]})
        assert row["mean_acceptance_length"] == pytest.approx(want["mean_acceptance_length"], abs=1e-6)


def test_per_step_figures_without_position_rates_are_the_same_figures(drafted):
    db, start, _ = drafted
    window = (start + timedelta(seconds=SCRAPES[0]), start + timedelta(seconds=SCRAPES[-1], microseconds=1))
    long = read(db, lambda q: counts(q, *window, 30))
    whole, lean = over_time(long, KEYS["engine"]), over_time(long, KEYS["engine"], positions=False)
    steps = whole.groupby("bucket")["engine"].nunique()
    assert len(steps) >= 2 and steps.eq(64).all() and lean["position_rates"].isna().all()  # 64 engines a step
    assert whole["position_rates"].map(len).eq(3).all()  # the twin's three draft positions
    pd.testing.assert_frame_equal(lean.drop(columns="position_rates"), whole.drop(columns="position_rates"))


def test_the_decode_cost_splits_into_accepted_output_and_rejected_drafts(drafted):
    db, start, pages = drafted
    data = report(db, start, "pool", decode_cost_usd=1234.5).as_json()["decode_cost"]
    share = vllms_figures(pages[0], pages[-1])["rejected_share"]
    assert data["usd_per_mtok_output"] == pytest.approx(1234.5 / (data["generated_tokens"] / 1e6), rel=1e-6)
    assert data["rejected_drafts"] == pytest.approx(data["usd_per_mtok_output"] * share, rel=1e-5)
    assert data["accepted_output"] + data["rejected_drafts"] == pytest.approx(data["usd_per_mtok_output"], rel=1e-6)


def test_csv_and_text_carry_the_same_figures(drafted):
    db, start, _ = drafted
    r = report(db, start, "instance")
    head, row = r.as_csv().splitlines()[:2]
    assert head.split(",")[:4] == ["pool", "instance", "engine", "drafts"]
    assert "position_2_rate" in head and row.startswith("decode,decode-0,,")
    [j] = r.as_json()["rows"]
    assert f"mean acceptance length {j['mean_acceptance_length']:.2f}" in r.as_text()
    json.dumps(r.as_json(), allow_nan=False)  # no NaN reaches JSON


def test_a_window_without_drafts_says_so(drafted):
    db, start, _ = drafted
    empty = read(db, lambda q: spec_report(q, start - timedelta(days=2), start - timedelta(days=1)))
    assert empty.as_json()["rows"] == [] and "no speculative decoding" in empty.as_text()


def test_an_unknown_grouping_is_refused(drafted):
    db, start, _ = drafted
    with pytest.raises(ValueError, match="--by must be one of pool, instance, engine"):
        report(db, start, "tenant")


def test_the_command_without_pools_or_drafts_in_its_window_says_so(drafted, capsys):
    from moemeter.cli import main

    db, start, _ = drafted
    window = ["--from", (start - timedelta(days=2)).isoformat(), "--to", (start - timedelta(days=1)).isoformat()]
    assert main(["report", "spec", "--db", str(db), *window]) == 0
    assert "no speculative decoding counted in the window" in capsys.readouterr().out
    assert main(["report", "spec", "--db", str(db), *window, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] == [] and "decode_cost" not in data
