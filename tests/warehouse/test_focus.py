"""`moemeter report focus` on the held cost fixture (tests/warehouse/conftest.py; test_cost.py has
its hand-computed numbers): FOCUS rows that add up to `report cost` to the cent on both bases, a
price change inside the window, a window cut inside an hour, the restart's tokens, the allocation
to users and tenants, idle time as rows of its own; and the FinOps Foundation's validator on them.

By hand, 10:00 .. 12:00 at $38.96/GPU-hour: alice's request finished at 10:10, bob's at 11:06 (both
of tenant acme); scrapes at 10:00:05, 10:30:05, 11:00:05, 11:30:05 and 11:59:55, the decode pool
idle in the last interval (1790 s on 4 GPUs = 1.988889 GPU-h = $77.487111), the 5 s at each end of
the window unobserved. On the allocation basis alice is charged all of hour 10 ($77.92 prefill +
$155.84 decode), bob all of hour 11, idle and unobserved time as rows of their own; on the usage
basis alice the busy 3595 s of hour 10 on 6 GPUs ($233.443556), bob 3595 s of prefill on 2 GPUs and
1805 s of decode on 4 ($155.947556), and nobody the idle and unobserved time.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from moemeter.cli import main

from . import focus_validator
from .conftest import contract_sheet

IDLE_HOURS = 4 * 1790 / 3600
IDLE_USD = IDLE_HOURS * 38.96
WINDOW = ("2026-11-29T10:00:00Z", "2026-11-29T12:00:00Z")


def export(rack, tmp_path: Path, *extra: str, window=WINDOW, suffix: str = ".csv") -> pd.DataFrame:
    db, targets = rack
    out = tmp_path / f"focus-{len(list(tmp_path.iterdir()))}{suffix}"
    args = ["report", "focus", "--db", str(db), "--targets", str(targets), "--rack", "rack-a"]
    assert main([*args, "--from", window[0], "--to", window[1], "--out", str(out), *extra]) == 0
    return pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out)


def cost(rack, capsys, *extra: str, window=WINDOW) -> dict:
    db, targets = rack
    capsys.readouterr()
    args = ["report", "cost", "--db", str(db), "--targets", str(targets), "--json"]
    assert main([*args, "--from", window[0], "--to", window[1], *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("basis", ["allocation", "usage"])
@pytest.mark.parametrize("by", ["pool", "tenant", "user"])
def test_billed_cost_adds_up_to_report_cost_to_the_cent(rack, tmp_path, capsys, basis, by) -> None:
    rows = export(rack, tmp_path, "--basis", basis, "--by", by)
    report = cost(rack, capsys, "--basis", basis)
    assert round(rows["BilledCost"].sum(), 2) == report["total"]["cost_usd"] == 467.52
    for pool in ("prefill", "decode"):
        assert round(rows[rows["x_Pool"] == pool]["BilledCost"].sum(), 2) == report["pools"][pool]["cost_usd"]
    assert (rows["BilledCost"] == rows["EffectiveCost"]).all() and (rows["ListCost"] == rows["BilledCost"]).all()
    gpu = rows[rows["ConsumedUnit"] == "GPU-Hours"]
    assert gpu["ConsumedQuantity"].sum() == pytest.approx(12.0)  # 2 + 4 GPUs x 2 h, busy and idle
    assert (gpu["ListUnitPrice"] == 38.96).all()
    assert set(rows["ChargePeriodStart"]) == {"2026-11-29T10:00:00Z", "2026-11-29T11:00:00Z"}


def test_idle_time_is_its_own_row_unallocated_on_the_usage_basis(rack, tmp_path, capsys) -> None:
    rows = export(rack, tmp_path, "--basis", "usage", "--by", "user")
    idle = rows[rows["x_UsageKind"] == "idle"]
    decode_idle = idle[idle["x_Pool"] == "decode"]
    assert len(decode_idle) == 1 and decode_idle["x_AllocatedResourceId"].isna().all()
    assert len(idle) == 1  # the prefill pool never idled
    unobserved = rows[rows["x_UsageKind"] == "unobserved"]
    assert unobserved["ConsumedQuantity"].sum() == pytest.approx(6 * 10 / 3600)
    assert unobserved["x_AllocatedResourceId"].isna().all()
    assert decode_idle["ConsumedQuantity"].iloc[0] == pytest.approx(IDLE_HOURS)
    assert decode_idle["BilledCost"].iloc[0] == pytest.approx(IDLE_USD)
    assert decode_idle["ChargePeriodStart"].iloc[0] == "2026-11-29T11:00:00Z"
    # per-user allocated cost = each pool's cost less its idle, as report cost says
    report = cost(rack, capsys, "--basis", "usage")
    allocated = rows[rows["x_AllocatedResourceId"].notna()]
    for pool in ("prefill", "decode"):
        charged = allocated[allocated["x_Pool"] == pool]["BilledCost"].sum()
        assert round(charged, 2) == report["pools"][pool]["charged_usd"]
    assert round(allocated["BilledCost"].sum(), 2) == report["total"]["charged_usd"] == 389.38
    assert set(allocated["x_UsageKind"]) == {"busy", "tokens"}
    by_user = allocated.groupby("x_AllocatedResourceId")["BilledCost"].sum().to_dict()
    assert by_user == pytest.approx(
        {"acme/alice": 3595 * 6 / 3600 * 38.96, "acme/bob": (3595 * 2 + 1805 * 4) / 3600 * 38.96}
    )


def test_idle_time_is_split_in_rows_of_its_own_on_the_allocation_basis(rack, tmp_path) -> None:
    rows = export(rack, tmp_path, "--basis", "allocation", "--by", "user")
    idle = rows[rows["x_UsageKind"] == "idle"]
    assert idle[["x_Pool", "x_AllocatedResourceId", "x_AllocatedMethodId"]].values.tolist() == [
        ["decode", "acme/bob", "tokens"]
    ]
    unobserved = rows[rows["x_UsageKind"] == "unobserved"]
    assert sorted(set(unobserved["x_AllocatedResourceId"])) == ["acme/alice", "acme/bob"]
    assert idle["BilledCost"].iloc[0] == pytest.approx(IDLE_USD)
    assert "idle" in idle["ChargeDescription"].iloc[0]
    assert rows["x_AllocatedResourceId"].notna().all()  # every GPU-hour charged to a user
    bob = rows[rows["x_AllocatedResourceId"] == "acme/bob"]
    assert round(bob["BilledCost"].sum(), 2) == 77.92 + 155.84
    assert json.loads(bob["x_AllocatedTags"].iloc[0]) == {"tenant": "acme", "user": "bob"}
    assert json.loads(bob["Tags"].iloc[0])["x_user"] == "bob"


def test_a_price_change_inside_an_hour_splits_the_charge_periods(rack, tmp_path, capsys) -> None:
    sheet = contract_sheet(tmp_path, "2026-11-29T11:30:00Z")
    rows = export(rack, tmp_path, "--price-sheet", str(sheet), "--by", "pool")
    report = cost(rack, capsys, "--price-sheet", str(sheet))
    assert round(rows["BilledCost"].sum(), 2) == report["total"]["cost_usd"] == 2 * 2 * 3 + 4 * 1.5 * 3 + 4 * 0.5 * 4
    decode = rows[(rows["ConsumedUnit"] == "GPU-Hours") & (rows["x_Pool"] == "decode")]
    # by user, each user's tokens once though 11:00 .. 12:00 holds two charge periods
    by_user = export(rack, tmp_path, "--price-sheet", str(sheet), "--by", "user")
    tokens = by_user[by_user["ConsumedUnit"] == "Tokens"].groupby(["x_AllocatedResourceId", "SkuId"])
    assert tokens["ConsumedQuantity"].sum().to_dict() == {
        ("acme/alice", "tokens-input-cache-hit"): 100,
        ("acme/alice", "tokens-input-computed"): 200,
        ("acme/alice", "tokens-output"): 50,
        ("acme/bob", "tokens-input-computed"): 100,
        ("acme/bob", "tokens-output"): 150,
    }
    prices = decode.groupby("ChargePeriodStart")["ListUnitPrice"].agg(set).to_dict()
    assert prices == {
        "2026-11-29T10:00:00Z": {3.0},
        "2026-11-29T10:30:00Z": {3.0},
        "2026-11-29T11:00:00Z": {3.0},
        "2026-11-29T11:30:00Z": {4.0},
    }
    assert set(decode["SkuPriceId"]) == {"gpu-hour-decode@2026-01-01T00:00:00Z", "gpu-hour-decode@2026-11-29T11:30:00Z"}
    assert json.loads(decode["SkuPriceDetails"].iloc[0])["x_PriceSheet"] == "contract"


def test_a_window_cut_inside_hours_prices_its_edges(rack, tmp_path, capsys) -> None:
    """Cut at 10:20 and 11:40, with the decode price changing at 11:00: what each side charges on
    either basis, not only the bill, is the same (the first step's price once reached into the next)."""
    window = ("2026-11-29T10:20:00Z", "2026-11-29T11:40:00Z")
    sheet = contract_sheet(tmp_path, "2026-11-29T11:00:00Z")
    for basis in ("allocation", "usage"):
        rows = export(rack, tmp_path, "--basis", basis, "--price-sheet", str(sheet), window=window)
        report = cost(rack, capsys, "--basis", basis, "--price-sheet", str(sheet), window=window)
        assert round(rows["BilledCost"].sum(), 2) == report["total"]["cost_usd"]
        for pool, line in report["pools"].items():
            mine = rows[(rows["x_Pool"] == pool) & (rows["ConsumedUnit"] == "GPU-Hours")]
            charged = mine if basis == "allocation" else mine[mine["x_UsageKind"] == "busy"]
            assert round(charged["BilledCost"].sum(), 2) == line["charged_usd"] <= line["cost_usd"]
        assert (rows["ChargePeriodStart"].min(), rows["ChargePeriodEnd"].max()) == (
            "2026-11-29T10:20:00Z",
            "2026-11-29T11:40:00Z",
        )
        for kind in ("idle", "busy", "unobserved"):
            mine = rows[rows["x_UsageKind"] == kind]["ConsumedQuantity"].sum()
            assert mine == pytest.approx(sum(p[f"{kind}_gpu_hours"] for p in report["pools"].values()), abs=1e-5)


def test_token_rows_count_the_pools_tokens_through_the_restart(rack, tmp_path, capsys) -> None:
    rows = export(rack, tmp_path, "--by", "pool", suffix=".parquet")
    tokens = rows[rows["ConsumedUnit"] == "Tokens"].groupby("SkuId")["ConsumedQuantity"].sum().to_dict()
    # an hour's share of a scrape interval across its edge is a fraction of a token: summed, whole
    assert tokens == pytest.approx(
        {"tokens-input-cache-hit": 1_300_000, "tokens-input-computed": 3_200_000, "tokens-output": 1_000_000},
        abs=1e-6,
    )
    assert (rows[rows["ConsumedUnit"] == "Tokens"]["BilledCost"] == 0).all()
    # cache savings: the cached tokens at their hour's $/M computed input
    hits = rows[rows["SkuId"] == "tokens-input-cache-hit"]
    report = cost(rack, capsys)
    assert hits["x_CacheSavings"].sum() > 0 and report["total"]["cache_savings_usd"] == 63.31


def test_cache_savings_of_a_user(rack, tmp_path) -> None:
    rows = export(rack, tmp_path, "--by", "user")
    [hit] = rows[(rows["SkuId"] == "tokens-input-cache-hit")].itertuples()
    assert (hit.x_AllocatedResourceId, hit.ConsumedQuantity) == ("acme/alice", 100)
    # alice's prefill charge in hour 10 ($77.92, every GPU-hour on this basis) over her 200 computed
    # prompt tokens, for her 100 cached
    assert hit.x_CacheSavings == pytest.approx(100 * 77.92 / 200)


def test_gpu_time_before_the_sheets_first_price_stays_on_the_rows(rack, tmp_path, capsys) -> None:
    sheet = tmp_path / "late.toml"
    sheet.write_text(
        'name = "late"\n[[gpu]]\neffective = "2026-11-29T10:30:00Z"\npool = "*"\nusd_per_gpu_hour = 3.0\n'
        'source = "from 10:30"\n'
    )
    rows = export(rack, tmp_path, "--price-sheet", str(sheet), "--by", "pool")
    report = cost(rack, capsys, "--price-sheet", str(sheet))
    gpu = rows[rows["ConsumedUnit"] == "GPU-Hours"]
    assert gpu["ConsumedQuantity"].sum() == pytest.approx(12.0)  # as report cost counts them
    unpriced = gpu[gpu["SkuPriceId"].str.endswith("@unpriced")]
    assert unpriced["ConsumedQuantity"].sum() == pytest.approx(6 * 0.5) and (unpriced["BilledCost"] == 0).all()
    assert round(rows["BilledCost"].sum(), 2) == report["total"]["cost_usd"] == 6 * 1.5 * 3.0


def test_a_price_to_the_second_still_allocates_by_the_hour(rack, tmp_path, capsys) -> None:
    """A price effective at 10:00:07 makes one-minute charge periods; each is split by its hour's
    requests, so every GPU-hour is still charged to a user on the allocation basis."""
    sheet = contract_sheet(tmp_path, "2026-11-29T10:00:07Z")
    rows = export(rack, tmp_path, "--price-sheet", str(sheet), "--by", "user")
    assert rows["ChargePeriodStart"].nunique() == 121  # 120 minutes, the first cut at 10:00:07
    assert rows["x_AllocatedResourceId"].notna().all()
    assert round(rows["BilledCost"].sum(), 2) == cost(rack, capsys, "--price-sheet", str(sheet))["total"]["cost_usd"]


def test_names_stay_ascii_and_apart(rack, tmp_path) -> None:
    from warehouse.focus import allocation_id, inert

    assert allocation_id("a/b", "c") != allocation_id("a", "b/c")
    assert inert('=HYPERLINK("http://evil","x") of acme').startswith("'=") and inert("-2+3") == "'-2+3"
    assert inert("alice of acme") == "alice of acme"
    assert allocation_id("acme", "alice") == "acme/alice" and allocation_id("ä") == "%C3%A4"
    rows = export(rack, tmp_path, "--by", "user")
    assert rows["ChargeDescription"].map(str.isascii).all()
    assert set(rows["x_AllocatedResourceName"]) == {"alice of acme", "bob of acme"}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--out", "focus.txt"], "name a .csv or a .parquet file"),
        (["--out", "missing/focus.csv"], "is not a directory"),
        (["--rack", "a b"], "rack name"),
        (["--rack", "../../etc"], "rack name"),
        (["--rack", "x" * 65], "rack name"),
        (["--from", "2026-11-20T00:00:00Z", "--to", "2026-11-21T00:00:00Z"], "no token counters"),
        (["--from", "2026-11-21T00:00:00Z", "--to", "2026-11-20T00:00:00Z"], "must end after it starts"),
        (["--lake", "catalog.ducklake"], "--lake needs --rack"),
        (["--to", "2030-01-01T00:00:00Z"], "is in the future"),
        (["--provider", ""], "--provider"),
        (["--provider", "Société Générale"], "printable ASCII"),
        (["--provider", '=HYPERLINK("http://evil","x")'], "not starting with ="),
        (["--provider", "a\nb"], "printable ASCII"),
        (["--json"], "writes FOCUS rows"),
        (["--out", "/proc/version.csv"], "cannot write there"),
    ],
)
def test_a_refused_export_writes_nothing_and_keeps_the_file_there(rack, tmp_path, capsys, monkeypatch, extra, message):
    db, targets = rack
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "kept.csv"
    kept.write_text("an export from last month\n")
    args = ["report", "focus", "--db", str(db), "--targets", str(targets), "--out", str(kept)]
    window = ["--from", WINDOW[0], "--to", WINDOW[1]]
    rack_a = [] if "--lake" in extra else ["--rack", "rack-a"]
    assert main([*args, *window, *rack_a, *extra]) == 2
    assert message in capsys.readouterr().err
    assert kept.read_text() == "an export from last month\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.csv"]


@pytest.mark.slow("builds the validator's Python 3.12 environment on first use (make focus-env)")
def test_the_validator_finds_no_mandatory_violation(rack, tmp_path) -> None:
    """The FinOps Foundation's focus-validator on the CSV and Parquet forms, both bases, by user."""
    out = tmp_path / "verdicts"
    out.mkdir()
    for basis, suffix in (("allocation", ".csv"), ("usage", ".parquet")):
        export(rack, tmp_path, "--basis", basis, "--by", "user", suffix=suffix)
    for path in sorted(tmp_path.glob("focus-*")):
        focus_validator.check(focus_validator.validate(path, out))


def test_cache_savings_follow_the_basis_by_pool(rack, tmp_path) -> None:
    """By pool, a cache-hit row's savings are its tokens at the period's prefill charge per computed
    prompt token: every GPU-hour on the allocation basis, the busy ones on the usage basis."""
    for basis in ("allocation", "usage"):
        rows = export(rack, tmp_path, "--by", "pool", "--basis", basis)
        prefill = rows[(rows["x_Pool"] == "prefill") & (rows["ConsumedUnit"] == "GPU-Hours")]
        if basis == "usage":
            prefill = prefill[prefill["x_UsageKind"] == "busy"]
        for period, hit in rows[rows["SkuId"] == "tokens-input-cache-hit"].groupby("ChargePeriodStart"):
            computed = rows[(rows["SkuId"] == "tokens-input-computed") & (rows["ChargePeriodStart"] == period)]
            charged = prefill[prefill["ChargePeriodStart"] == period]["BilledCost"].sum()
            expected = hit["ConsumedQuantity"].sum() * charged / computed["ConsumedQuantity"].sum()
            assert hit["x_CacheSavings"].sum() == pytest.approx(expected)
        # per charge period, not at the window's $/M input as `report cost` values them ($63.31): hour
        # 10 caches 0.4M + 0.6M x 1795/1800 of 1.0M + 2.0M x 1795/1800 prompt tokens, hour 11 the rest
        # (restart and all): 0.998333/1.996111 x $77.92 + 0.301667/1.203889 x $77.92 = $58.50
        if basis == "allocation":
            assert round(rows["x_CacheSavings"].sum(), 2) == 58.50


def test_an_export_through_a_link_replaces_the_file_it_names_at_the_umasks_mode(rack, tmp_path) -> None:
    import os
    import stat

    target = tmp_path / "exports" / "november.csv"
    target.parent.mkdir()
    target.write_text("last month's\n")
    link = tmp_path / "latest.csv"
    link.symlink_to(target)
    db, targets = rack
    argv = ["report", "focus", "--db", str(db), "--targets", str(targets), "--rack", "rack-a", "--out", str(link)]
    assert main([*argv, "--from", WINDOW[0], "--to", WINDOW[1]]) == 0
    assert link.is_symlink() and target.read_text().startswith("BilledCost,")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
    assert sorted(p.name for p in target.parent.iterdir()) == ["november.csv"]  # no temporary left
