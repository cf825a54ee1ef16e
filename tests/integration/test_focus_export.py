"""`moemeter report focus` over six fast-forwarded hours of the twin rack, refereed by the FinOps
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
# Six hours at a coarse scrape and simulation step: the twin's load has no time of day, so the
# rows per hour, pool, tenant and user are those of any hour of a day (a day took 4 minutes to
# write and validate); a finer step would only take longer to write.
HOURS = ["--fast-forward", "6h", "--interval", "900", "--tick", "30", "--seed", "5"]


@pytest.fixture(scope="module")
def hours(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("focus-hours")
    db = tmp / "hours.duckdb"
    subprocess.run([sys.executable, "-m", "moemeter", "twin", *HOURS, "--db", str(db)], check=True, timeout=1200)
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        first, last = con.execute("SELECT min(ts), max(ts) FROM increments").fetchone()
    # the whole hours covered, and an edge inside an hour at the end
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
def test_the_hours_validate_and_reconcile_to_report_cost(hours, tmp_path, capsys, basis) -> None:
    db, *window = hours
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


def test_the_query_api_gives_the_files_rows(hours, tmp_path) -> None:
    db, *window = hours
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
