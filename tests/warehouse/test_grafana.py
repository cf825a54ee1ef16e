"""`moemeter mixin` and its boards: every file written and valid (promtool, the foundation SDK's own
models), every panel's expression parsed by promtool and drawn from the one table, the Kubernetes
renderings holding exactly the files' groups and boards, and hostile rack names and --out paths
refused before anything is written. tests/integration/test_promql_parity.py evaluates it all
against a real Prometheus scraping the twin."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from moemeter.cli import main
from moemeter.contract.families import FAMILIES
from stack.twin.config import load_profile
from stack.twin.server import Twin
from tests.warehouse.test_rules import promtool
from warehouse.grafana import (
    BOARDS,
    VARIABLE_QUERIES,
    VARIABLES,
    Panel,
    board_panels,
    concrete,
    dashboards,
    markdown_table,
    panels,
)
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


SERIES = re.compile(r"\b((?:vllm:|moemeter_|moemeter:)[a-z0-9_:]+)")
"""The names of ours or vLLM's an expression reads."""


def records(mixin: Path) -> dict[str, str]:
    """Each series the mixin records -> the expressions recording it, joined."""
    out: dict[str, str] = {}
    for g in yaml.safe_load((mixin / "prometheus_rules.yaml").read_text())["groups"]:
        for r in g["rules"]:
            out[r["record"]] = f"{out.get(r['record'], '')} {r['expr']}"
    return out


def families_read(expr: str, recorded: dict[str, str]) -> set[str]:
    """The series an expression reads, through the mixin's recording rules to what they read."""
    out = set()
    for name in SERIES.findall(expr):
        out |= families_read(recorded[name], recorded) if name in recorded else {name}
    return out


def family_of(series: str) -> str:
    """A histogram's sample name -> its family's."""
    return re.sub(r"_(bucket|sum|count)$", "", series)


def test_the_mixin_writes_every_file_and_promtool_passes_both_rule_files(mixin):
    assert written(mixin) == FILES
    for name in ("prometheus_rules.yaml", "prometheus_alerts.yaml"):
        check = subprocess.run([promtool(), "check", "rules", str(mixin / name)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    records = yaml.safe_load((mixin / "prometheus_rules.yaml").read_text())["groups"]
    alerts = yaml.safe_load((mixin / "prometheus_alerts.yaml").read_text())["groups"]
    assert all("record" in r for g in records for r in g["rules"])
    assert all("alert" in r for g in alerts for r in g["rules"])
    keys = [(r["record"], sorted(r.get("labels", {}).items())) for g in records for r in g["rules"]]
    assert len(keys) == len({str(k) for k in keys}), "a series recorded twice"
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


def test_a_panel_on_the_plugins_families_says_so_directly_or_through_a_recording_rule(mixin):
    plugin = {f.name for f in FAMILIES.values() if f.source == "plugin"}
    recorded = records(mixin)
    for p in panels(SLO):
        reads_plugin = any(family_of(s) in plugin for s in families_read(p.expr, recorded))
        assert p.plugin == reads_plugin, p.title
        assert ("moemeter vLLM plugin" in p.text) == p.plugin, p.title


def test_the_boards_read_only_families_of_the_contract_or_the_mixins_own_records(mixin):
    recorded = records(mixin)
    declared = set()
    for f in FAMILIES.values():
        declared |= {f.name, f"{f.name}_bucket", f"{f.name}_count", f"{f.name}_sum"}
    exprs = [p.expr for p in panels(SLO)] + list(VARIABLE_QUERIES.values())
    names = {n for e in exprs for n in SERIES.findall(e)}
    assert names - declared - set(recorded) == set()
    assert {n for e in exprs for n in families_read(e, recorded)} <= declared  # records bottom out in the contract


def test_every_series_a_board_reads_is_one_the_twin_exposes(mixin):
    """What tests/integration/test_promql_parity.py needs to find every panel non-empty."""
    pages = Twin(load_profile("deepseek-v4.1-flash"), seed=7, start=0.0).pages(5.0)
    exposed = {m for text in pages.values() for m in re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", text, re.M)}
    recorded = records(mixin)
    exprs = [p.expr for p in panels(SLO)] + list(VARIABLE_QUERIES.values())
    assert {n for e in exprs for n in families_read(e, recorded)} - exposed == set()


def test_every_board_has_the_four_variables_multi_with_all_as_any_value(mixin):
    for uid in BOARDS:
        model = json.loads((mixin / "dashboards" / f"{uid}.json").read_text())
        source, *variables = model["templating"]["list"]
        assert source["type"] == "datasource" and source["query"] == "prometheus"
        for v, name in zip(variables, VARIABLES, strict=True):
            assert (v["name"], v["type"], v["query"]) == (name, "query", VARIABLE_QUERIES[name])
            assert v["multi"] and v["includeAll"] and v["allValue"] == ".*", (uid, name)
            assert v["datasource"]["uid"] == "${datasource}"


def test_each_panel_is_drawn_as_its_kind_and_an_unknown_kind_or_board_is_refused():
    drawn = [
        (uid, p["title"], t["expr"], p["type"], t.get("format"))
        for uid, model in dashboards(SLO).items()
        for p in board_panels(model)
        for t in p["targets"]
    ]
    table = [(p.board, p.title, p.expr, p.kind, "heatmap" if p.kind == "heatmap" else None) for p in panels(SLO)]
    assert sorted(drawn, key=str) == sorted(table, key=str)
    assert {p.kind for p in panels(SLO)} == {"stat", "timeseries", "heatmap"}
    with pytest.raises(ValueError, match="kind 'pie'"):
        Panel("moemeter-overview", "t", "up", "short", kind="pie")
    with pytest.raises(ValueError, match="no board"):
        Panel("moemeter-nope", "t", "up", "short")


def test_concrete_leaves_no_variable_for_prometheus():
    for p in panels(SLO):
        assert "$" not in concrete(p.expr), p.title
    assert concrete('x{a=~"${rack}", b=~"${engine:regex}"}[$__range] [${__rate_interval}]', "5m") == (
        'x{a=~".*", b=~".*"}[5m] [5m]'
    )
    assert concrete('x{a=~"$racks"}') == 'x{a=~"$racks"}'  # a longer name is not the variable


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


@pytest.mark.parametrize(
    "rack",
    ['a"b', "a}b", "a{b", "a\nb", "x" * 65, "-lead", "räck", "a b", 'x", role="decode', "\udcff", "a\x00b", "a/../b"],
)
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
    assert main(["mixin", "--out", str(out / "under")]) != 0  # a file where a parent should be
    assert "cannot make the directory" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and out.read_text() == "mine\n"


def test_without_targets_the_constants_and_cost_rules_are_left_out_and_it_says_so(tmp_path, capsys):
    assert main(["mixin", "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "$/M-token rules" in err and "per-GPU figures are left out" in err
    records = yaml.safe_load((tmp_path / "out" / "prometheus_rules.yaml").read_text())["groups"]
    names = {r["record"] for g in records for r in g["rules"]}
    assert not names & {"moemeter:pool_gpus", "moemeter:pool_usd_per_mtok:1h", "moemeter:decode_tokens_per_gpu:5m"}
    assert "moemeter:ttft_p90_seconds:5m" in names  # what needs no constant is there
    assert not any("gpus" in str(r["expr"]) for g in records for r in g["rules"])


def test_docs_list_every_panel():
    doc = (ROOT / "docs" / "grafana.md").read_text()
    section = doc.split("<!-- panels -->\n")[1].split("<!-- end of panels -->")[0]
    assert section == markdown_table(SLO), (
        "docs/grafana.md's panel table is stale: paste `python -m warehouse.grafana` between its panel markers"
    )


def test_the_docs_scrape_configs_pass_promtool_and_the_pod_monitor_parses(tmp_path):
    doc = (ROOT / "docs" / "grafana.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", doc, re.S)]
    (tmp_path / "sd.json").write_text("[]")
    configs = [b for b in blocks if "scrape_configs" in b]
    assert len(configs) == 2
    for i, config in enumerate(configs):
        for job in config["scrape_configs"]:
            for sd in job.get("file_sd_configs", []):
                sd["files"] = [str(tmp_path / "sd.json")]
        (tmp_path / f"prometheus-{i}.yml").write_text(yaml.safe_dump(config))
        check = subprocess.run(
            [promtool(), "check", "config", str(tmp_path / f"prometheus-{i}.yml")], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
    [monitor] = [b for b in blocks if b.get("kind") == "PodMonitor"]
    assert {r["targetLabel"] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]} == {"role", "rack"}
