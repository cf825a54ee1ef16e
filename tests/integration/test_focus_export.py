"""`moemeter report focus` over a fast-forwarded day of the twin rack, refereed by the FinOps
Foundation's focus-validator 2.2.1: no mandatory rule fails, the conditional failures are the ones
docs/definitions.md explains, and on both cost bases the rows add up to `report cost` to the cent,
per pool and in total, and read the same from the file and through the query API."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from moemeter.cli import main
from tests.warehouse import focus_validator
from warehouse.api import QueryServer
from warehouse.db import Warehouse

pytestmark = pytest.mark.integration
# A day at a coarse scrape and simulation step: the rows per hour, pool, tenant and user are those
# of any day; a finer step would only take longer to write.
DAY = ["--fast-forward", "24h", "--interval", "900", "--tick", "30", "--seed", "5"]


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("focus-day")
    db = tmp / "day.duckdb"
    subprocess.run([sys.executable, "-m", "moemeter", "twin", *DAY, "--db", str(db)], check=True, timeout=1200)
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        first, last = con.execute("SELECT min(ts), max(ts) FROM increments").fetchone()
    # the whole hours the day covers, and an edge inside an hour at the end
    start = first.replace(minute=0, second=0, microsecond=0) + pd.Timedelta(hours=1)
    return db, start.isoformat(), (last - pd.Timedelta(minutes=20)).replace(microsecond=0).isoformat()


def export(db, window, out, *extra: str) -> pd.DataFrame:
    source = ["--db", str(db)] if not str(db).startswith("http") else ["--api", str(db)]
    args = ["report", "focus", *source, "--rack", "twin-a", "--from", window[0], "--to", window[1]]
    assert main([*args, "--out", str(out), *extra]) == 0
    return pd.read_parquet(out) if out.suffix == ".parquet" else pd.read_csv(out)


def cost(db, window, capsys, basis: str) -> dict:
    capsys.readouterr()
    args = ["report", "cost", "--db", str(db), "--from", window[0], "--to", window[1], "--json", "--basis", basis]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("basis", ["allocation", "usage"])
def test_a_day_validates_and_reconciles_to_report_cost(day, tmp_path, capsys, basis) -> None:
    db, *window = day
    by_user = export(db, window, tmp_path / "user.parquet", "--basis", basis, "--by", "user")
    by_tenant = export(db, window, tmp_path / "tenant.csv", "--basis", basis, "--by", "tenant")
    report = cost(db, window, capsys, basis)
    for rows in (by_user, by_tenant):
        assert round(rows["BilledCost"].sum(), 2) == report["total"]["cost_usd"]
        for pool, line in report["pools"].items():
            mine = rows[rows["x_Pool"] == pool]
            assert round(mine["BilledCost"].sum(), 2) == line["cost_usd"]
            allocated = mine[mine["x_AllocatedResourceId"].notna()]["BilledCost"].sum()
            # allocated: the charged cost, less any charge period in which no request finished
            unallocated_busy = mine[mine["x_AllocatedResourceId"].isna() & (mine["x_UsageKind"] == "busy")]
            assert round(allocated + unallocated_busy["BilledCost"].sum(), 2) == line["charged_usd"]
    assert by_user["x_AllocatedResourceId"].nunique() > by_tenant["x_AllocatedResourceId"].nunique() > 1
    out = tmp_path / "verdicts"
    out.mkdir()
    for path in (tmp_path / "user.parquet", tmp_path / "tenant.csv"):
        focus_validator.check(focus_validator.validate(path, out))


def test_the_query_api_gives_the_files_rows(day, tmp_path) -> None:
    db, *window = day
    wh = Warehouse(db)
    srv = QueryServer(wh)
    srv.start()
    try:
        over_api = export(srv.url, window, tmp_path / "api.parquet", "--by", "tenant")
    finally:
        srv.shutdown()
        wh.close()
    from_file = export(db, window, tmp_path / "file.parquet", "--by", "tenant")
    pd.testing.assert_frame_equal(over_api, from_file)
