"""The cost model, checked to the cent against hand-computed numbers.

Five scrapes of a prefill instance (2 GPUs) and a decode instance (4 GPUs), 10:00 .. 12:00 UTC:
real vLLM 0.32 pages (tests/fixtures) with the three token counters set to known values, one of
them through an engine restart, ingested with `moemeter ingest`. Expected, by hand:
  prefill prompt increases 1.0M + 2.0M + 0.5M (restart: counts from zero) + 1.0M = 4.5M
  prefill cache hits       0.4M + 0.6M + 0.1M (restart) + 0.2M                 = 1.3M -> computed 3.2M
  decode generated         0.2M + 0.3M + 0.5M + 0 (idle for the last 1790 s)   = 1.0M
  cost at $38.96/GPU-hour: prefill 2 x 2 h = $155.84, decode 4 x 2 h = $311.68, total $467.52
  $/M input 155.84 / 3.2 = $48.70; $/M output $311.68; blended 467.52 / 5.5 = $85.003636
  decode idle 4 GPUs x 1790 s = 1.988889 GPU-h = $77.49
  users (gateway records): alice 300 prompt (100 cached), 50 generated; bob 100 prompt, 150 generated
    alice = 155.84 x 200/300 + 311.68 x 50/200 = $181.81; bob = 155.84 x 100/300 + 311.68 x 150/200 = $285.71
  revenue at the default token sheet (peak until 16:30 UTC): hits 1.3M x $0.006 + misses 3.2M x $0.30
    + output 1.0M x $1.20 = $2.1678 -> margin $-465.35
  cache savings: 1.3M cached at $48.70/M computed input = $63.31
  usage basis: busy = the scrape intervals whose counter moved: prefill 7190 s x 2 GPUs = $155.623556
    (10 s before the first scrape unobserved), decode 3 x 1800 s x 4 GPUs = 6 GPU-h = $233.76 (1790 s
    idle, 10 s unobserved) -> $/M input 155.623556 / 3.2 = $48.632361, $/M output $233.76, blended
    389.383556 / 5.5 = $70.797010; alice = 155.623556 x 200/300 + 233.76 x 50/200 = $162.19, bob =
    155.623556 x 100/300 + 233.76 x 150/200 = $227.19; $78.14 idle and unobserved charged to nobody;
    cache savings 1.3M x $48.632361/M = $63.22; the bill ($467.52) the same
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from moemeter.cli import main
from warehouse.read import Holdings, plan

from .conftest import TIMES, contract_sheet


def report(capsys, rack, *extra: str) -> dict:
    db, targets = rack
    assert (
        main(
            [
                "report",
                "cost",
                "--db",
                str(db),
                "--targets",
                str(targets),
                "--from",
                "2026-11-29T10:00:00Z",
                "--to",
                "2026-11-29T12:00:00Z",
                "--json",
                *extra,
            ]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)


def test_the_report_matches_the_hand_computed_numbers_to_the_cent(rack, capsys) -> None:
    r = report(capsys, rack)
    assert r["window"]["hours"] == 2 and r["method"] == "tokens"
    pf, dc, tot = r["pools"]["prefill"], r["pools"]["decode"], r["total"]
    assert (pf["gpus"], pf["gpu_hours"], pf["cost_usd"]) == (2, 4.0, 155.84)
    assert (pf["prompt_tokens"], pf["cached_prompt_tokens"], pf["computed_prompt_tokens"]) == (
        4_500_000,
        1_300_000,
        3_200_000,
    )
    assert pf["usd_per_mtok_input"] == pytest.approx(48.70, abs=1e-9)
    assert (dc["gpus"], dc["gpu_hours"], dc["cost_usd"], dc["generated_tokens"]) == (4, 8.0, 311.68, 1_000_000)
    assert dc["usd_per_mtok_output"] == pytest.approx(311.68, abs=1e-9)
    assert (tot["cost_usd"], tot["tokens"]) == (467.52, 5_500_000)
    assert tot["usd_per_mtok_blended"] == pytest.approx(467.52 / 5.5, abs=1e-6)
    assert dc["idle_gpu_hours"] == pytest.approx(4 * 1790 / 3600, abs=1e-6) and dc["idle_cost_usd"] == 77.49
    assert pf["idle_cost_usd"] == 0.0
    assert [(u["user"], u["cost_usd"]) for u in r["users"]] == [("bob", 285.71), ("alice", 181.81)]
    assert tot["revenue_usd"] == 2.17 and tot["margin_usd"] == round(2.1678 - 467.52, 2)
    assert r["basis"] == "allocation" and pf["cache_savings_usd"] == tot["cache_savings_usd"] == 63.31
    assert (tot["charged_usd"], tot["uncharged_usd"]) == (467.52, 0.0)


def test_the_usage_basis_charges_busy_gpu_time_and_leaves_idle_its_own_line(rack, capsys) -> None:
    alloc, usage = report(capsys, rack), report(capsys, rack, "--basis", "usage")
    pf, dc, tot = usage["pools"]["prefill"], usage["pools"]["decode"], usage["total"]
    assert usage["basis"] == "usage"
    assert tot["cost_usd"] == alloc["total"]["cost_usd"] == 467.52  # the bill is the same
    assert (dc["cost_usd"], dc["idle_cost_usd"], dc["charged_usd"]) == (311.68, 77.49, 233.76)
    assert (dc["busy_gpu_hours"], dc["idle_gpu_hours"]) == (6.0, round(4 * 1790 / 3600, 6))
    assert dc["unobserved_gpu_hours"] == round(4 * 10 / 3600, 6)
    assert (pf["busy_gpu_hours"], pf["idle_gpu_hours"]) == (round(7190 * 2 / 3600, 6), 0.0)
    assert dc["usd_per_mtok_output"] == pytest.approx(233.76, abs=1e-6)
    assert pf["usd_per_mtok_input"] == pytest.approx(48.632361, abs=1e-6)
    assert tot["usd_per_mtok_blended"] == pytest.approx(70.797010, abs=1e-6)
    assert (tot["charged_usd"], tot["uncharged_usd"]) == (389.38, 78.14)
    assert pf["cache_savings_usd"] == 63.22
    users = {u["user"]: u["cost_usd"] for u in usage["users"]}
    assert users == {"alice": 162.19, "bob": 227.19}


def test_the_rollups_and_the_raw_counters_agree(rack, capsys) -> None:
    """The window is served from the hourly table and the raw rows not rolled up yet; they reconcile."""
    import duckdb

    db, _ = rack
    with duckdb.connect(str(db), read_only=True) as con:
        through = dict(con.execute("SELECT name, through FROM rollup_state").fetchall())
        raw = con.execute("""SELECT sum(delta) FROM increments JOIN series USING (series_id)
                             WHERE metric = 'vllm:prompt_tokens_total' AND target = 'prefill-0'""").fetchall()[0][0]
    p = plan(datetime(2026, 11, 29, 10), datetime(2026, 11, 29, 12), None, Holdings(through.get("1m")))
    assert (p["h0"], p["h1"]) == (datetime(2026, 11, 29, 10), datetime(2026, 11, 29, 12))  # every whole hour
    assert datetime(2026, 11, 29, 10) < p["through"] < TIMES[-1]  # the last scrapes are raw still
    assert raw == 4_500_000 == report(capsys, rack)["pools"]["prefill"]["prompt_tokens"]


def test_a_price_change_applies_from_its_effective_time_only(rack, capsys, tmp_path) -> None:
    sheet = contract_sheet(tmp_path, "2026-11-29T11:00:00Z")
    r = report(capsys, rack, "--price-sheet", str(sheet))
    assert r["pools"]["prefill"]["cost_usd"] == 2 * 2 * 3.00
    assert r["pools"]["decode"]["cost_usd"] == 4 * 1 * 3.00 + 4 * 1 * 4.00
    assert r["total"]["revenue_usd"] is None  # no token prices in this sheet: no revenue, not zero


def test_the_daily_statement(rack, capsys, tmp_path) -> None:
    db, targets = rack
    out = tmp_path / "daily.parquet"
    assert (
        main(
            [
                "report",
                "daily",
                "--db",
                str(db),
                "--targets",
                str(targets),
                "--from",
                "2026-11-28",
                "--to",
                "2026-11-30",
                "--json",
                "--parquet",
                str(out),
            ]
        )
        == 0
    )
    days = json.loads(capsys.readouterr().out)
    assert [d["day"] for d in days] == ["2026-11-28", "2026-11-29"]
    assert days[0]["note"] == "no data"
    d = days[1]
    assert (d["gpus_avg"], d["gpus_peak"], d["gpu_hours"], d["cost_usd"]) == (6.0, 6, 144.0, 5610.24)
    assert (d["input_tokens"], d["cache_hit_share"], d["output_tokens"]) == (4_500_000, round(1.3 / 4.5, 4), 1_000_000)
    assert d["revenue_usd"] == 2.17 and d["margin_usd"] == round(2.1678 - 5610.24, 2)
    import pandas as pd

    assert len(pd.read_parquet(out)) == 2


def test_an_empty_window_says_so(rack, capsys) -> None:
    db, targets = rack
    assert (
        main(
            [
                "report",
                "cost",
                "--db",
                str(db),
                "--targets",
                str(targets),
                "--from",
                "2026-11-20T00:00:00",
                "--to",
                "2026-11-21T00:00:00",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "no token counters stored for the pools" in err and "nan" not in err.lower()
    assert (
        main(
            ["report", "cost", "--db", str(db), "--targets", str(targets), "--from", "2026-11-21", "--to", "2026-11-20"]
        )
        == 2
    )
    assert "must end after it starts" in capsys.readouterr().err


def test_text_and_csv_forms(rack, capsys) -> None:
    db, targets = rack
    args = [
        "report",
        "cost",
        "--db",
        str(db),
        "--targets",
        str(targets),
        "--from",
        "2026-11-29T10:00:00",
        "--to",
        "2026-11-29T12:00:00",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "$48.7000/M input" in text and "$311.6800/M output" in text and "$467.52" in text
    assert main([*args, "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kind,name,gpus") and lines[3].startswith("total,,6,12.0,467.52")
    assert lines[4].startswith("user,bob,,,285.71")


def test_without_a_targets_file_the_pools_the_warehouse_saw(rack, capsys) -> None:
    db, _ = rack
    given = report(capsys, rack)
    args = ["report", "cost", "--db", str(db), "--from", "2026-11-29T10:00:00Z", "--to", "2026-11-29T12:00:00Z"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == given
