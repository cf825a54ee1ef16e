"""Every headline figure twice: moemeter's SQL through its query API and a real Prometheus's PromQL
(warehouse/promql.py, the expressions of the Grafana mixin), both scraping the same twin targets
at the same interval. For one fixed window each figure must agree within the tolerance its table
row states and explains (docs/grafana.md lists them with the differences measured here); every
recording rule `moemeter mixin` writes must evaluate non-empty on that Prometheus.

Set MOEMETER_PARITY_OUT to a file to get the measured differences as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from collectors.targets import load_targets
from dashboard.data import live
from moemeter.cli import main
from moemeter.contract import DEFAULT_INTERVAL
from stack.ready import scaled
from stack.twin.server import write_targets
from tests.e2e.test_browser import free_port
from tests.integration.parity import SLO, SLO_SHEET, moemeter, query
from tests.integration.test_prometheus_source import PROMETHEUS, start_prometheus, start_twin, wait_for_scrapes
from warehouse.api import QueryClient, QueryError
from warehouse.grafana import board_panels, concrete, panels
from warehouse.promql import Figure, figures

pytestmark = [pytest.mark.integration, pytest.mark.slow("scrapes the twin for three minutes with two collectors")]

INTERVAL = DEFAULT_INTERVAL
WINDOW_SECONDS = 120
"""The compared window: 24 scrapes at 5 s on either side."""
SETTLE_SECONDS = 5
"""Both collectors' rounds after the window's end, so that moemeter's prorated increases at the edge are whole."""
FIGURES = {f.key: f for f in figures(SLO)}
MEASURED: dict[str, dict[str, object]] = {}


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("needs Debian's prometheus package (make test installs it)")
    tmp = tmp_path_factory.mktemp("parity")
    procs: list[subprocess.Popen] = []
    try:
        # both pools whole (the figures are per pool), the gateway (SLOs); not the 18 GPU trays
        chosen = [t for t in start_twin(tmp, procs, "--seed", "1") if t["role"] in ("prefill", "decode", "gateway")]
        write_targets(chosen, tmp / "targets.json")
        mixin = tmp / "mixin"
        argv = ["mixin", "--targets", str(tmp / "targets.json"), "--slo-sheet", str(SLO_SHEET), "--out", str(mixin)]
        assert main(argv) == 0
        (tmp / "rules.yml").write_text((mixin / "prometheus_rules.yaml").read_text())  # what start_prometheus loads
        assert main(["rules", "--targets", str(tmp / "targets.json"), "--sd-out", str(tmp / "sd.json")]) == 0
        scrape = {"job_name": "rack", "file_sd_configs": [{"files": [str(tmp / "sd.json")]}]}
        url = start_prometheus(tmp, [scrape], procs)
        assert main(["slo", "load", "--db", str(tmp / "rack.duckdb"), str(SLO_SHEET)]) == 0
        port = free_port()
        serve = subprocess.Popen(
            [sys.executable, "-m", "moemeter.cli", "serve", "--targets", str(tmp / "targets.json")]
            + ["--db", str(tmp / "rack.duckdb"), "--api-port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "serve.log", "a"),  # noqa: SIM115
        )
        procs.append(serve)
        wait_for_scrapes(url, len(chosen), 2, scaled(180))
        q = QueryClient(f"http://127.0.0.1:{port}")
        _first_scrape(q, serve, scaled(180))
        # the window starts once both have scraped for a while, and is judged once both hold a
        # scrape of every target past its end
        end = (datetime.now(UTC).replace(tzinfo=None) + timedelta(seconds=10 + WINDOW_SECONDS)).replace(microsecond=0)
        past = end + timedelta(seconds=SETTLE_SECONDS)
        deadline = time.monotonic() + WINDOW_SECONDS + scaled(120)
        while not (_moemeter_past(q, past) and _prometheus_past(url, past)):
            assert serve.poll() is None, f"serve exited {serve.returncode}: {(tmp / 'serve.log').read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"the collectors had not scraped past {past} in time"
            time.sleep(1)
        yield q, url, end, mixin, load_targets(str(tmp / "targets.json"))
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(20)
        out = os.environ.get("MOEMETER_PARITY_OUT")
        if out and MEASURED:
            with open(out, "w") as f:
                json.dump(MEASURED, f, indent=2, sort_keys=True)


def _moemeter_past(q: QueryClient, t: datetime) -> bool:
    latest = live.latest_scrape_time(q)
    return latest is not None and latest > t


def _prometheus_past(url: str, t: datetime) -> bool:
    oldest = query(url, "min(timestamp(up))", None)
    return bool(oldest) and float(oldest[0]["value"][1]) > t.replace(tzinfo=UTC).timestamp()


def _first_scrape(q: QueryClient, serve: subprocess.Popen, within: float) -> datetime:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert serve.poll() is None, f"serve exited {serve.returncode}"
        try:
            latest = live.latest_scrape_time(q)
        except QueryError:  # the query API is not up yet
            latest = None
        if latest is not None:
            return latest
        time.sleep(1)
    pytest.fail(f"moemeter serve stored no scrape within {within:g} s")


def prometheus(url: str, f: Figure, end: datetime) -> dict[tuple[str, ...], float]:
    """Prometheus's answer for the window ending at `end`, keyed by the figure's labels but `rack`."""
    keep = [k for k in f.by if k != "rack"]
    rows = query(url, f.expr(f"{WINDOW_SECONDS}s"), end)
    return {tuple(r["metric"].get(k, "") for k in keep): float(r["value"][1]) for r in rows}


@pytest.mark.parametrize("key", list(FIGURES))
def test_prometheus_agrees_with_moemeter_within_the_stated_tolerance(rack, key):
    q, url, end, _, targets = rack
    f = FIGURES[key]
    start = end - timedelta(seconds=WINDOW_SECONDS)
    instances = {t.name: t.url.split("//")[1].split("/")[0] for t in targets}
    ours = moemeter(q, key, start, end, instances)
    theirs = prometheus(url, f, end)
    if f.key == "layer_balancedness":  # moemeter's expert load knows no model name: compare by instance and layer
        theirs = {(i, "", layer): v for (i, _, layer), v in theirs.items()}
    assert ours, f"moemeter has no {key} for the window"
    assert set(theirs) == set(ours), f"{key}: Prometheus has {sorted(theirs)}, moemeter {sorted(ours)}"
    worst = max(ours, key=lambda k: abs(theirs[k] - ours[k]))
    MEASURED[key] = {
        "moemeter": ours[worst],
        "prometheus": theirs[worst],
        "difference": theirs[worst] - ours[worst],
        "relative": (theirs[worst] - ours[worst]) / ours[worst] if ours[worst] else None,
        "series": len(ours),
    }
    spread = (
        prometheus(url, replace(f, template=f.spread_expr(f"{WINDOW_SECONDS}s", f"{INTERVAL:g}s")), end)
        if f.spread
        else {}
    )
    samples = int(WINDOW_SECONDS // INTERVAL)
    allowed = {k: f.tolerance.allowed(ours[k], spread.get(k, 0.0), samples) for k in ours}
    MEASURED[key]["allowed"] = allowed[worst]
    MEASURED[key]["spread"] = spread.get(worst)
    bad = {k: (ours[k], theirs[k], allowed[k]) for k in ours if not abs(theirs[k] - ours[k]) <= allowed[k]}
    assert not bad, (
        f"{key} over {WINDOW_SECONDS} s to {end}: (moemeter, Prometheus, allowed) off by more than allowed ({f.tolerance.why}): {bad}"
    )


def test_every_rule_of_the_mixin_evaluates_non_empty(rack):
    _, url, end, mixin, _ = rack
    groups = yaml.safe_load((mixin / "prometheus_rules.yaml").read_text())["groups"]
    records = sorted({r["record"] for g in groups for r in g["rules"]})
    assert len(records) > 20
    empty = [r for r in records if not query(url, r, None)]
    assert not empty, f"recording rules with no series on the twin: {empty}"


def test_every_panel_of_every_board_is_non_empty(rack):
    """Each board as written, its variables at "All": every panel's expression has series."""
    _, url, end, mixin, _ = rack
    exprs = [
        (board.name, p["title"], t["expr"])
        for board in sorted((mixin / "dashboards").glob("*.json"))
        for p in board_panels(json.loads(board.read_text()))
        for t in p.get("targets", [])
    ]
    assert len(exprs) == len(panels(SLO))
    empty = [(b, title) for b, title, expr in exprs if not query(url, concrete(expr), None)]
    assert not empty, f"panels with no series on the twin: {empty}"
