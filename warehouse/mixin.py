"""`moemeter mixin`: the monitoring mixin as files, laid out as the monitoring-mixins convention
does, for a Prometheus and Grafana that already run (docs/grafana.md):

    prometheus_rules.yaml            recording rules: the figures of warehouse/promql.py, the alert
                                     pack's own, the rack's constants (GPUs, prices)
    prometheus_alerts.yaml           the alert pack's alerts (docs/alerts.md)
    dashboards/<uid>.json            the boards of warehouse/grafana.py
    provisioning/dashboards/moemeter.yaml, provisioning/datasources/prometheus.yaml
    kubernetes/prometheus-rule.yaml  a PrometheusRule of both rule files
    kubernetes/grafana-dashboards.yaml  a ConfigMap of the boards, for Grafana's dashboard sidecar
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from moemeter.contract import TargetInfo
from moemeter.contract.errors import MoemeterError
from warehouse.alerts import AlertRules
from warehouse.export import check_rack
from warehouse.grafana import BOARDS, DATASOURCE_UID, dashboards
from warehouse.promql import CONSTANTS, PoolCost, recording_group
from warehouse.rules import alert_pack
from warehouse.slo import SloClass

READS_CONSTANTS = re.compile(r"\b(" + "|".join(map(re.escape, CONSTANTS)) + r")\b")
"""An expression reading the rack's constants, which only the targets file (and the price sheet) give."""
DASHBOARDS_PATH = "/var/lib/grafana/dashboards/moemeter"
"""Where the provisioning file tells Grafana the boards are (copy dashboards/ there)."""


class MixinError(MoemeterError, ValueError):
    """A mixin that cannot be written: a rack name that is no label value of ours, an --out that is a file."""


Group = dict[str, Any]


def rule_files(
    slo: SloClass, pools: dict[str, PoolCost] | None, targets: list[TargetInfo] | None, rack: str = ""
) -> tuple[dict[str, list[Group]], dict[str, list[Group]]]:
    """(recording, alerting): the two rules files' documents. Without pools (no targets file) the
    rules that read the rack's constants are left out: they would record nothing."""
    pack: list[Group] = alert_pack(AlertRules(), slo, pools, targets, rack)["groups"]  # type: ignore[assignment]
    groups = [recording_group(slo), *pack]
    records: list[Group] = []
    alerts: list[Group] = []
    for g in groups:
        for kind, into in (("record", records), ("alert", alerts)):
            rules = [r for r in g["rules"] if kind in r and (pools or not READS_CONSTANTS.search(str(r["expr"])))]
            if rules:
                into.append({"name": g["name"], "rules": rules})
    return {"groups": records}, {"groups": alerts}


def files(
    slo: SloClass, pools: dict[str, PoolCost] | None, targets: list[TargetInfo] | None, rack: str = ""
) -> dict[str, str]:
    """Every file of the mixin: relative path -> text."""
    if rack:
        check_rack(rack)
    records, alerts = rule_files(slo, pools, targets, rack)
    boards = dashboards(slo)
    out = {
        "prometheus_rules.yaml": as_yaml(records),
        "prometheus_alerts.yaml": as_yaml(alerts),
        **{f"dashboards/{uid}.json": json.dumps(model, indent=2) + "\n" for uid, model in boards.items()},
        "provisioning/dashboards/moemeter.yaml": as_yaml(
            {
                "apiVersion": 1,
                "providers": [
                    {
                        "name": "moemeter",
                        "folder": "moemeter",
                        "type": "file",
                        "disableDeletion": False,
                        "options": {"path": DASHBOARDS_PATH},
                    }
                ],
            }
        ),
        "provisioning/datasources/prometheus.yaml": as_yaml(
            {
                "apiVersion": 1,
                "datasources": [
                    {
                        "name": "Prometheus (moemeter)",
                        "uid": DATASOURCE_UID,
                        "type": "prometheus",
                        "access": "proxy",
                        "url": "http://localhost:9090",
                    }
                ],
            }
        ),
        "kubernetes/prometheus-rule.yaml": as_yaml(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "PrometheusRule",
                "metadata": {"name": "moemeter", "labels": {"app.kubernetes.io/part-of": "moemeter"}},
                "spec": {"groups": records["groups"] + alerts["groups"]},
            }
        ),
        "kubernetes/grafana-dashboards.yaml": as_yaml(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "moemeter-dashboards", "labels": {"grafana_dashboard": "1"}},
                "data": {f"{uid}.json": json.dumps(boards[uid], indent=2) + "\n" for uid in BOARDS},
            }
        ),
    }
    return out


def write(out: Path, texts: dict[str, str]) -> list[Path]:
    """Write the files under `out` (made if missing); an `out` that is a file is refused first."""
    if out.exists() and not out.is_dir():
        raise MixinError(f"--out {out}: a file is there, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a parent directory should be, no permission
        raise MixinError(f"--out {out}: cannot make the directory: {exc.strerror}") from exc
    written = []
    for rel, text in texts.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def as_yaml(doc: Any) -> str:
    """A rules file, provisioning file or manifest as Prometheus, Grafana and kubectl read it: keys in
    the order written, expressions on one line."""
    return yaml.safe_dump(doc, sort_keys=False, width=1000)
