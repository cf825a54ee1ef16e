"""The alert pack, refereed by promtool: `check rules` on the file, `test rules` with series that
fire every alert and series that must not (rules_test.yml, expectations computed by hand)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import fields, replace
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from moemeter.cli import main
from moemeter.contract import FAMILIES, TargetInfo
from warehouse.alerts import AlertRules
from warehouse.prices import default_sheet
from warehouse.promql import PoolCost, pool_costs
from warehouse.rules import RulesError, alert_pack
from warehouse.slo import default_slo_sheet

NOW = datetime(2026, 12, 1)
INTERACTIVE = default_slo_sheet().default_at(NOW)
assert INTERACTIVE is not None

HERE = Path(__file__).parent
TARGETS = [
    {"name": "prefill-0", "url": "http://10.0.0.1:8100/metrics", "role": "prefill", "gpus": 8},
    {"name": "decode-0", "url": "http://10.0.0.2:8200/metrics", "role": "decode", "gpus": 16},
    {"name": "gateway", "url": "http://10.0.0.3:8000/metrics", "role": "gateway", "gpus": 0},
]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool (Debian's prometheus package, installed by make test) is not here")
    return found


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(TARGETS))
    assert main(["rules", "--targets", str(targets), "--out", str(tmp_path / "rules.yml")]) == 0
    shutil.copy(HERE / "rules_test.yml", tmp_path / "rules_test.yml")
    return tmp_path


def test_promtool_checks_the_pack(pack: Path):
    check = subprocess.run([promtool(), "check", "rules", str(pack / "rules.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert re.search(r"SUCCESS: \d+ rules found", check.stdout)


@pytest.mark.slow("promtool evaluates every alert's series over hours")
def test_every_alert_fires_in_promtool_and_stays_silent_where_it_should(pack: Path):
    run = subprocess.run(
        [promtool(), "test", "rules", "rules_test.yml"], cwd=pack, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    tests = yaml.safe_load((pack / "rules_test.yml").read_text())["tests"]
    fired = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    silent = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if not case.get("exp_alerts")}
    alerts = {
        r["alert"]
        for g in yaml.safe_load((pack / "rules.yml").read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert fired == alerts, f"alerts no test fires: {alerts - fired}"
    assert silent == alerts, f"alerts no test holds silent: {alerts - silent}"


def test_the_pack_reads_only_families_of_the_contract():
    doc = alert_pack(AlertRules(), INTERACTIVE, pool_costs([TargetInfo(**t) for t in TARGETS], default_sheet(), NOW))
    recorded = {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}  # type: ignore[index]
    exprs = " ".join(str(r["expr"]) for g in doc["groups"] for r in g["rules"])  # type: ignore[index]
    names = set(re.findall(r"\b((?:vllm:|moemeter_|moemeter:)[a-z0-9_:]+)", exprs))
    declared = set()
    for f in FAMILIES.values():
        declared |= {f.name, f"{f.name}_bucket", f"{f.name}_count", f"{f.name}_sum"}
    assert names - declared - recorded == set()


def test_thresholds_come_from_alert_rules_and_objectives_from_the_slo_sheet():
    rules = AlertRules(burn_fast=10, kv_usage_max=0.9, straggler_factor=4)
    strict = replace(INTERACTIVE, name="strict", objective=0.999, e2e_seconds=60.0)
    doc = yaml.safe_dump(alert_pack(rules, strict))
    assert "/ 0.001" in doc and "> 10 and" in doc and "> 0.9" in doc and "(4 * quantile" in doc
    assert 'moemeter_gateway_request_duration_seconds_bucket{le="60.0"}' in doc  # the e2e target
    assert "slo_class: strict" in doc
    assert "moemeter-cost" not in doc  # no pools: no $/M rules


def test_an_slo_target_off_the_histograms_buckets_is_refused():
    with pytest.raises(RulesError, match=r"target 0.3 s is no bucket boundary"):
        alert_pack(AlertRules(), replace(INTERACTIVE, ttft_seconds=0.3))


def test_rules_without_targets_leave_the_cost_rules_out_and_say_so(tmp_path, capsys):
    assert main(["rules"]) == 0
    out, err = capsys.readouterr()
    assert "EPLBRankHot" in out and "CostPerTokenSpike" not in out
    assert "$/M-token rules" in err
    assert main(["rules", "--sd-out", str(tmp_path / "sd.json")]) == 2
    assert not (tmp_path / "sd.json").exists()


def test_the_file_sd_output_passes_promtool_and_carries_the_role(tmp_path):
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(TARGETS))
    sd = tmp_path / "sd.json"
    assert main(["rules", "--targets", str(targets), "--out", str(tmp_path / "r.yml"), "--sd-out", str(sd)]) == 0
    entries = json.loads(sd.read_text())
    assert [(e["targets"], e["labels"]["role"]) for e in entries] == [
        (["10.0.0.1:8100"], "prefill"),
        (["10.0.0.2:8200"], "decode"),
        (["10.0.0.3:8000"], "gateway"),
    ]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(
            {
                "rule_files": ["r.yml"],
                "scrape_configs": [{"job_name": "rack", "file_sd_configs": [{"files": [str(sd)]}]}],
            }
        )
    )
    check = subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_docs_name_every_alert_and_threshold():
    text = (HERE.parents[1] / "docs" / "alerts.md").read_text()
    doc = alert_pack(AlertRules(), INTERACTIVE, {"decode": PoolCost(1, 1.0)})
    alerts = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}  # type: ignore[index]
    assert {a for a in alerts if f"`{a}`" not in text} == set()
    assert {f.name for f in fields(AlertRules) if f"`{f.name}`" not in text} == set()


def test_rules_take_their_objectives_from_the_slo_sheet(tmp_path, capsys):
    sheet = tmp_path / "slo.toml"
    sheet.write_text(
        '[[class]]\nname = "gold"\neffective = "2026-01-01T00:00:00Z"\ndefault = true\n'
        "ttft_ms = 1000\ne2e_ms = 30000\nobjective = 0.999\n"
    )
    assert main(["rules", "--slo-sheet", str(sheet)]) == 0
    out = capsys.readouterr().out
    assert 'moemeter_gateway_ttft_seconds_bucket{le="1.0"}' in out and "/ 0.001" in out
    assert "slo_class: gold" in out and "moemeter_gateway_itl_mean_seconds" not in out  # no ITL target
    sheet.write_text(sheet.read_text().replace("ttft_ms = 1000", "ttft_ms = 1200"))
    assert main(["rules", "--slo-sheet", str(sheet)]) == 2
    assert "the target 1.2 s is no bucket boundary" in capsys.readouterr().err
