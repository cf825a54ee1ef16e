"""`moemeter mixin` and its boards: every file written and valid (promtool, the foundation SDK's own
models), every panel's expression parsed by promtool and drawn from the one table, the Kubernetes
renderings holding exactly the files' groups and boards, and hostile rack names and --out paths
refused before anything is written. tests/integration/test_promql_parity.py evaluates it all
against a real Prometheus scraping the twin."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from moemeter.cli import main
from moemeter.contract.families import FAMILIES
from tests.warehouse.test_rules import promtool
from warehouse.grafana import BOARDS, VARIABLES, board_panels, concrete, markdown_table, panels
from warehouse.slo import default_slo_sheet

ROOT = Path(__file__).parents[2]
SLO = default_slo_sheet().default_at(datetime(2026, 12, 6))
TARGETS = [
    {"name": "prefill-0", "url": "http://10.0.0.1:8100/metrics", "role": "prefill", "gpus": 8},
    {"name": "decode-0", "url": "http://10.0.0.2:8200/metrics", "role": "decode", "gpus": 16},
    {"name": "gateway", "url": "http://10.0.0.3:8000/metrics", "role": "gateway", "gpus": 0},
]
FILES = {
    "prometheus_rules.yaml",
    "prometheus_alerts.yaml",
    *(f"dashboards/{uid}.json" for uid in BOARDS),
    "provisioning/dashboards/moemeter.yaml",
    "provisioning/datasources/prometheus.yaml",
    "kubernetes/prometheus-rule.yaml",
    "kubernetes/grafana-dashboards.yaml",
}


@pytest.fixture(scope="module")
def mixin(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("mixin")
    (tmp / "targets.json").write_text(json.dumps(TARGETS))
    assert main(["mixin", "--targets", str(tmp / "targets.json"), "--rack", "nvl72-a", "--out", str(tmp / "out")]) == 0
    return tmp / "out"


def written(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}


def test_the_mixin_writes_every_file_and_promtool_passes_both_rule_files(mixin):
    assert written(mixin) == FILES
    for name in ("prometheus_rules.yaml", "prometheus_alerts.yaml"):
        check = subprocess.run([promtool(), "check", "rules", str(mixin / name)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    records = yaml.safe_load((mixin / "prometheus_rules.yaml").read_text())["groups"]
    alerts = yaml.safe_load((mixin / "prometheus_alerts.yaml").read_text())["groups"]
    assert all("record" in r for g in records for r in g["rules"])
    assert all("alert" in r for g in alerts for r in g["rules"])
    gpus = [r for g in records for r in g["rules"] if r["record"] == "moemeter:pool_gpus"]
    assert sorted((r["labels"]["role"], r["expr"], r["labels"]["rack"]) for r in gpus) == [
        ("decode", "vector(16)", "nvl72-a"),
        ("prefill", "vector(8)", "nvl72-a"),
    ]


def test_every_board_round_trips_through_the_foundation_sdks_model(mixin):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for uid in BOARDS:
        model = json.loads((mixin / "dashboards" / f"{uid}.json").read_text())
        assert json.loads(json.dumps(Dashboard.from_json(model), cls=JSONEncoder)) == model
        assert model["uid"] == uid
        assert [v["name"] for v in model["templating"]["list"]] == ["datasource", *VARIABLES]
        for p in board_panels(model):
            [target] = p["targets"]
            assert target["expr"].strip() and p["fieldConfig"]["defaults"]["unit"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}"


def test_every_panel_expression_comes_from_the_table_and_parses_in_promtool(mixin, tmp_path):
    table = [p.expr for p in panels(SLO)]
    drawn = [
        t["expr"]
        for uid in BOARDS
        for p in board_panels(json.loads((mixin / "dashboards" / f"{uid}.json").read_text()))
        for t in p["targets"]
    ]
    assert sorted(drawn) == sorted(table)
    rules = [{"record": f"panel:{i}", "expr": concrete(e)} for i, e in enumerate(table)]
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    check = subprocess.run([promtool(), "check", "rules", str(tmp_path / "panels.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_panel_on_the_plugins_families_says_so():
    plugin = {f.name for f in FAMILIES.values() if f.source == "plugin"}
    for p in panels(SLO):
        reads_plugin = any(name in p.expr for name in plugin) or p.title.startswith("Balancedness")
        assert p.plugin == reads_plugin, p.title
        assert ("moemeter vLLM plugin" in p.text) == p.plugin, p.title


def test_the_kubernetes_renderings_hold_exactly_the_files(mixin):
    rule = yaml.safe_load((mixin / "kubernetes" / "prometheus-rule.yaml").read_text())
    groups = [
        yaml.safe_load((mixin / f).read_text())["groups"] for f in ("prometheus_rules.yaml", "prometheus_alerts.yaml")
    ]
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == groups[0] + groups[1]
    config = yaml.safe_load((mixin / "kubernetes" / "grafana-dashboards.yaml").read_text())
    assert config["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert {k: json.loads(v) for k, v in config["data"].items()} == {
        f"{uid}.json": json.loads((mixin / "dashboards" / f"{uid}.json").read_text()) for uid in BOARDS
    }
    provider = yaml.safe_load((mixin / "provisioning" / "dashboards" / "moemeter.yaml").read_text())
    source = yaml.safe_load((mixin / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    model = json.loads((mixin / "dashboards" / "moemeter-overview.json").read_text())
    assert source["datasources"][0]["uid"] == model["templating"]["list"][0]["current"]["value"]
    assert provider["providers"][0]["type"] == "file"


@pytest.mark.parametrize("rack", ['a"b', "a}b", "a\nb", "x" * 65, "-lead", "räck", "a b", 'x", role="decode'])
def test_a_rack_name_that_is_no_plain_label_value_is_refused_and_nothing_is_written(tmp_path, rack, capsys):
    (tmp_path / "targets.json").write_text(json.dumps(TARGETS))
    out = tmp_path / "out"
    assert main(["mixin", "--targets", str(tmp_path / "targets.json"), f"--rack={rack}", "--out", str(out)]) != 0
    assert "rack name" in capsys.readouterr().err
    assert not out.exists()


def test_an_out_that_is_a_file_is_refused_and_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("mine\n")
    assert main(["mixin", "--out", str(out)]) != 0
    assert "a file is there" in capsys.readouterr().err
    assert out.read_text() == "mine\n"


def test_without_targets_the_constants_and_cost_rules_are_left_out_and_it_says_so(tmp_path, capsys):
    assert main(["mixin", "--out", str(tmp_path / "out")]) == 0
    assert "left out" in capsys.readouterr().err
    records = yaml.safe_load((tmp_path / "out" / "prometheus_rules.yaml").read_text())["groups"]
    names = {r["record"] for g in records for r in g["rules"]}
    assert not names & {"moemeter:pool_gpus", "moemeter:pool_usd_per_mtok:1h"}


def test_docs_list_every_panel():
    doc = (ROOT / "docs" / "grafana.md").read_text()
    section = doc.split("<!-- panels -->\n")[1].split("<!-- end of panels -->")[0]
    assert section == markdown_table(SLO), (
        "docs/grafana.md's panel table is stale: paste `python -m warehouse.grafana` between its panel markers"
    )


def test_the_docs_scrape_config_passes_promtool_and_the_pod_monitor_parses(tmp_path):
    import re

    doc = (ROOT / "docs" / "grafana.md").read_text()
    scrape, monitor = (yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", doc, re.S))
    (tmp_path / "sd.json").write_text("[]")
    scrape["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(tmp_path / "sd.json")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(scrape))
    check = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert monitor["kind"] == "PodMonitor"
    assert {r["targetLabel"] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]} == {"role", "rack"}
