"""Hostile inputs to the FOCUS export: user names that a request sends through the metering gateway
(a spreadsheet formula, non-ASCII, slashes that could make two allocations one), read back by
`moemeter report focus` over the cost test's rack and refereed by the FinOps Foundation's
validator. The rows stay valid FOCUS, no cell runs as a formula, and every user keeps a line of
their own; the bill is the same to the cent."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from moemeter.cli import main
from tests.hostile.test_tenants import ACME, WINDOW, rack, report, through_the_gateway, with_records  # noqa: F401
from tests.warehouse import focus_validator

FORMULA = '=HYPERLINK("http://evil.example","invoice")'
NAMES = [FORMULA, "Jürgen", "a/b", "-2+3", "@sum"]
SENDS = [(ACME, {"model": "twin-moe", "prompt": "x " * 20, "max_tokens": 4, "user": n}) for n in NAMES]


@pytest.mark.slow("runs the gateway and the FOCUS validator (make focus-env on first use)")
def test_hostile_user_names_stay_valid_inert_and_apart(rack, tmp_path: Path) -> None:  # noqa: F811
    records = through_the_gateway(tmp_path / "gateway", SENDS)
    assert [r["user"] for r in records] == NAMES  # the gateway kept them as sent
    db = with_records(rack, tmp_path, records)
    out = tmp_path / "focus.csv"
    args = ["report", "focus", "--db", str(db), "--targets", str(rack[1]), "--rack", "rack-a", "--by", "user"]
    assert main([*args, "--from", WINDOW[0], "--to", WINDOW[1], "--out", str(out)]) == 0
    rows = pd.read_csv(out, keep_default_na=False)
    assert round(rows["BilledCost"].sum(), 2) == report(db, rack[1], "--json")["total"]["cost_usd"] == 467.52

    names = set(rows.loc[rows["x_AllocatedResourceName"] != "", "x_AllocatedResourceName"])
    assert f"'{FORMULA} of acme" in names and "'-2+3 of acme" in names and "'@sum of acme" in names
    assert "Jürgen of acme" in names  # x_ columns keep the name as it is
    cells = rows.astype(str).stack()
    assert not cells.str.match(r"[=+@]").any()  # no cell a spreadsheet would run
    assert cells[cells.str.startswith("-")].str.fullmatch(r"-[\d.e-]+").all()  # only negative numbers
    ids = {json.loads(t)["user"]: i for t, i in zip(rows["x_AllocatedTags"], rows["x_AllocatedResourceId"]) if t}
    assert len(set(ids.values())) == len(ids) and ids["a/b"] == "acme/a%2Fb"
    assert rows["ChargeDescription"].map(str.isascii).all()
    out_dir = tmp_path / "verdicts"
    out_dir.mkdir()
    focus_validator.check(focus_validator.validate(out, out_dir))
