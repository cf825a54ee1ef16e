"""The figure table of warehouse/promql.py: each figure parses in promtool, reads only families of
the contract or the mixin's own constants, is recorded exactly once, and docs/grafana.md lists it
with its tolerance; the tolerances are the arithmetic docs/grafana.md states."""

from __future__ import annotations

import math
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from moemeter.contract import TargetInfo
from moemeter.contract.families import FAMILIES
from tests.warehouse.test_rules import promtool
from warehouse.alerts import AlertRules
from warehouse.prices import default_sheet
from warehouse.promql import CONSTANTS, EDGES, GAUGE, figures, inventory, markdown_table, pool_costs, recording_group
from warehouse.rules import alert_pack
from warehouse.slo import default_slo_sheet, load_slo_sheet

ROOT = Path(__file__).parents[2]
NOW = datetime(2026, 12, 6)
SLO = default_slo_sheet().default_at(NOW)
TARGETS = [
    TargetInfo(name="prefill-0", url="http://10.0.0.1:8100/metrics", role="prefill", gpus=8),
    TargetInfo(name="decode-0", url="http://10.0.0.2:8200/metrics", role="decode", gpus=16),
]


def test_tolerances_are_the_arithmetic_the_docs_state():
    # a queue whose mean is 57 and standard deviation 40 over 24 samples a side:
    # 3 standard errors of the difference of two means = 3 x 40 x sqrt(2/24) = 34.64
    assert GAUGE.allowed(57.0, 40.0, 24) == pytest.approx(3 * 40 * math.sqrt(2 / 24))
    assert GAUGE.allowed(57.0, 0.0, 24) == pytest.approx(0.57)  # a still gauge: 1%
    assert EDGES.allowed(8726.0) == pytest.approx(174.52)
    burn = {f.key: f for f in figures(SLO)}["slo_ttft_burn"]
    assert burn.tolerance.allowed(0.9) == pytest.approx(0.02 / (1 - SLO.objective))


def test_every_figure_parses_in_promtool_at_any_window(tmp_path):
    rules = [
        {"record": f"parity:{f.key}:{window}", "expr": f.expr(window)}
        for f in figures(SLO)
        for window in ("5m", "120s")
    ]
    rules += [
        {"record": f"parity:{f.key}_spread", "expr": f.spread_expr("120s", "5s")} for f in figures(SLO) if f.spread
    ]
    (tmp_path / "figures.yml").write_text(yaml.safe_dump({"groups": [{"name": "figures", "rules": rules}]}))
    check = subprocess.run(
        [promtool(), "check", "rules", str(tmp_path / "figures.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_figures_read_only_families_of_the_contract_and_the_mixins_constants():
    known = {f"{name}{suffix}" for name in FAMILIES for suffix in ("", "_bucket", "_count", "_sum")} | set(CONSTANTS)
    for f in figures(SLO):
        names = set(re.findall(r"\b((?:vllm:|moemeter_|moemeter:)[a-z0-9_:]+)", f.expr() + f.spread))
        assert names and names <= known, f"{f.key} reads {sorted(names - known)}, no family of the contract"


def test_each_figure_is_recorded_once_the_packs_own_as_the_pack_records_them():
    pack = alert_pack(AlertRules(), SLO, pool_costs(TARGETS, default_sheet(), NOW))
    mixin = recording_group(SLO)
    records = [r for g in [*pack["groups"], mixin] for r in g["rules"] if "record" in r]
    for f in figures(SLO):
        name, _, selector = f.record.partition("{")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', selector))
        matching = [r for r in records if r["record"] == name and labels.items() <= r.get("labels", {}).items()]
        assert len(matching) == 1, f"{f.record} is recorded {len(matching)} times"
        assert matching[0]["expr"] == f.expr(), f"{f.record} records another expression than the figure's"
    names = [(r["record"], tuple(sorted(r.get("labels", {}).items()))) for r in records]
    assert len(names) == len(set(names)), "a series is recorded twice"


def test_the_constants_carry_the_targets_gpus_and_the_price_in_force():
    rules = inventory(pool_costs(TARGETS, default_sheet(), NOW), TARGETS, rack="nvl72-a")["rules"]
    by = {(r["record"], r["labels"].get("role")): r for r in rules}
    assert by[("moemeter:pool_gpus", "prefill")]["expr"] == "vector(8)"
    assert by[("moemeter:pool_gpus", "decode")]["expr"] == "vector(16)"
    assert by[("moemeter:rack_gpus", None)]["expr"] == "vector(24)"
    price = default_sheet().gpu_segments("decode", NOW, NOW.replace(second=1))[0][2].usd_per_gpu_hour
    assert by[("moemeter:pool_usd_per_gpu_hour", "decode")]["expr"] == f"vector({price:.10g})"
    assert all(r["labels"]["rack"] == "nvl72-a" for r in rules)


def test_docs_list_every_figure_with_its_tolerance():
    doc = (ROOT / "docs" / "grafana.md").read_text()
    section = doc.split("<!-- parity -->")[1].split("<!-- end of parity -->")[0]
    parity = load_slo_sheet(ROOT / "tests" / "fixtures" / "slo-parity.toml").default_at(NOW)
    expected = [line.rsplit("|", 5)[0] for line in markdown_table(parity, {}).splitlines()[2:]]
    listed = [line.rsplit("|", 5)[0] for line in section.strip().splitlines()[2:]]
    assert listed == expected, (
        "docs/grafana.md's parity table is not the figure table: run tests/integration/test_promql_parity.py "
        "with MOEMETER_PARITY_OUT=parity.json, then `python -m warehouse.promql tests/fixtures/slo-parity.toml "
        "parity.json` and paste its table"
    )
