"""The Roofline page: MFU, MBU and the rejected drafts' share computed by hand on a rack of known rates
(a GB300 host serving prefill, an H200 host serving decode, one engine speculating), the pool's GPU
told by its hosts, and on the sick rack (tests/dashboard/conftest.py) every engine's FLOPs as its raw
increments give them."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collectors.parse import parse_page
from dashboard.data import live
from dashboard.data import roofline as data
from moemeter.contract import POOLS, TargetInfo
from tests.dashboard.sick_rack import LATEST
from warehouse.api import LocalQuery, QueryServer
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.read import Window

ROOT = Path(__file__).parents[2]
T0 = datetime(2026, 12, 1, 12, 0, 0)
MODEL = "deepseek-ai/DeepSeek-V4.1-Flash"
PREFILL = TargetInfo("prefill-0", "http://p/metrics", "prefill", 2, "test", "h1")
DECODE = TargetInfo("decode-0", "http://d/metrics", "decode", 2, "test", "h2")
GPU_H1 = TargetInfo("gpu-h1", "http://g1/metrics", "gpu", 2, "test", "h1")
GPU_H2 = TargetInfo("gpu-h2", "http://g2/metrics", "gpu", 2, "test", "h2")
RATES = {  # per engine, per second: FLOPs, bytes read, bytes written, generated, draft and accepted tokens
    ("prefill-0", "0"): (3.0e15, 2.0e12, 0.5e12, 10.0, None, None),
    ("prefill-0", "1"): (1.5e15, 2.0e12, 0.5e12, 10.0, None, None),
    ("decode-0", "0"): (0.2e15, 1.0e12, 0.1e12, 1000.0, 600.0, 450.0),
    ("decode-0", "1"): (0.2e15, 1.0e12, 0.1e12, 1000.0, None, None),
}
FAMILIES = (
    "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu",
    "vllm:generation_tokens",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def vllm_page(target: str, seconds: float) -> str:
    lines = []
    for i, family in enumerate(FAMILIES):
        lines.append(f"# TYPE {family} counter")
        for (t, engine), rates in RATES.items():
            if t == target and rates[i] is not None:
                lines.append(f'{family}_total{{engine="{engine}",model_name="{MODEL}"}} {rates[i] * seconds}')
    return "\n".join(lines) + "\n"


def dcgm_page(host: str, model: str) -> str:
    return "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{host}-{g}",modelName="{model}",Hostname="{host}"}} 50\n'
        for g in (0, 1)
    )


@pytest.fixture(scope="module")
def hand_rack(tmp_path_factory):
    """Four scrapes 10 s apart: three intervals of the rates above."""
    wh = Warehouse(tmp_path_factory.mktemp("roofline") / "w.duckdb")
    ing = Ingestor()
    for k in range(4):
        t = T0 + timedelta(seconds=10 * k)
        pages = [
            (PREFILL, vllm_page("prefill-0", 10 * k)),
            (DECODE, vllm_page("decode-0", 10 * k)),
            (GPU_H1, dcgm_page("h1", "NVIDIA GB300")),
            (GPU_H2, dcgm_page("h2", "NVIDIA H200")),
        ]
        for target, page in pages:
            batch = ScrapeBatch(target, t, True, 0.01, parse_page(page.encode()))
            wh.write(lambda con, b=batch: ing.write(con, b))
    yield wh
    wh.close()


@pytest.fixture(scope="module")
def hand(hand_rack):
    return LocalQuery(hand_rack.cursor())


@pytest.fixture(scope="module")
def hand_api(hand_rack):
    api = QueryServer(hand_rack)
    api.start()
    yield api.url
    api.shutdown()


WINDOW = Window.ending(T0 + timedelta(seconds=30), 30, 10)


@pytest.fixture(scope="module")
def gpus(hand):
    return {role: data.pool_gpu(data.gpu_models(hand, WINDOW), live.targets(hand, WINDOW), role) for role in POOLS}


def test_each_pool_runs_on_the_gpu_of_its_own_hosts(gpus):
    assert (gpus["prefill"].model, gpus["decode"].model) == ("NVIDIA GB300", "NVIDIA H200")
    assert gpus["prefill"].spec is not None and gpus["prefill"].how == "on the pool's hosts"


def test_without_hosts_a_pool_takes_the_rack_commonest_gpu():
    models = pd.DataFrame(
        {
            "target": ["a", "b", "c"],
            "host": ["x", "y", "z"],
            "gpu_model": ["NVIDIA GB300"] * 2 + ["NVIDIA H100"],
            "gpus": 4,
        }
    )
    targets = pd.DataFrame({"role": ["decode"], "hostname": [None]})
    g = data.pool_gpu(models, targets, "decode")
    assert (g.model, g.how) == ("NVIDIA GB300", "the rack's GPUs, the commonest of 2 models")
    none = data.pool_gpu(models.iloc[0:0], targets, "decode")
    assert none.model is None and none.spec is None
    unknown = data.pool_gpu(models.assign(gpu_model="NVIDIA H20"), targets, "decode")
    assert unknown.model == "NVIDIA H20" and unknown.spec is None


def test_mfu_and_mbu_by_hand(hand, gpus):
    m = data.measured(data.engines(hand, WINDOW), gpus).set_index("label")
    p0, p1, d0, d1 = (m.loc[f"{t} · DP {e}"] for t, e in RATES)
    assert p0["flops_per_second"] == pytest.approx(3.0e15, rel=1e-6)
    assert (p0["precision"], p0["peak_flops_per_second"]) == ("fp4", 15.0e15)  # the sheet: V4.1-Flash at FP4
    assert p0["mfu"] == pytest.approx(0.2, rel=1e-6) and p1["mfu"] == pytest.approx(0.1, rel=1e-6)
    assert p0["mbu"] == pytest.approx(2.5e12 / 8.0e12, rel=1e-6)
    assert p0["intensity"] == pytest.approx(3.0e15 / 2.5e12, rel=1e-6)
    # decode on H200: no FP4 tensor cores, so its FP8 peak
    assert (d0["precision"], d0["peak_flops_per_second"]) == ("fp8", 1.979e15)
    assert d0["mfu"] == pytest.approx(0.2e15 / 1.979e15, rel=1e-6) and d0["mbu"] == pytest.approx(1.1e12 / 4.8e12)
    assert d0[data.REJECTED_SHARE] == pytest.approx(150 / 1150, rel=1e-6)
    assert math.isnan(d1[data.REJECTED_SHARE]) and math.isnan(p0[data.REJECTED_SHARE])  # no counters: empty, not 0
    assert set(m["gpus"]) == {1.0}  # each target's 2 GPUs shared by its 2 engines


def test_a_pool_is_its_engines_weighted_by_their_gpus(hand, gpus):
    pools = data.pools(data.measured(data.engines(hand, WINDOW), gpus)).set_index("role")
    assert pools.loc["prefill", "mfu"] == pytest.approx(0.15, rel=1e-6)
    assert pools.loc["prefill", "flops_per_second"] == pytest.approx(2.25e15, rel=1e-6)
    assert pools.loc["decode", data.REJECTED_SHARE] == pytest.approx(150 / 2150, rel=1e-6)  # of the whole pool's
    assert math.isnan(pools.loc["prefill", data.REJECTED_SHARE])
    m = data.measured(data.engines(hand, WINDOW), gpus)
    weighted = m.assign(gpus=np.where(m["label"] == "prefill-0 · DP 0", 3.0, 1.0))
    assert data.pools(weighted).set_index("role").loc["prefill", "mfu"] == pytest.approx((3 * 0.2 + 0.1) / 4)


def test_asking_for_another_precision_moves_the_peak(hand, gpus):
    m = data.measured(data.engines(hand, WINDOW), gpus, "fp8").set_index("label")
    assert m.loc["prefill-0 · DP 0", "mfu"] == pytest.approx(3.0e15 / 5.0e15, rel=1e-6)


def test_steps_add_up_to_the_window(hand, gpus):
    steps = data.engines_over_time(hand, WINDOW)
    whole = data.engines(hand, WINDOW).set_index("label")
    by_engine = steps.groupby("label")[["flops", "draft_tokens"]].sum(min_count=1)
    assert by_engine["flops"].to_dict() == pytest.approx(whole["flops"].to_dict(), rel=1e-9)
    assert len(data.pools(data.measured(steps, gpus))) == 2 * steps["bucket"].nunique()


def test_a_gpu_the_sheet_lacks_leaves_mfu_empty_and_no_flops_says_the_estimates_are_off(hand):
    engines = data.engines(hand, WINDOW)
    lost = {role: data.PoolGpu("NVIDIA H20", None, "the rack's GPUs") for role in POOLS}
    m = data.measured(engines, lost)
    assert m["mfu"].isna().all() and (m["flops_per_second"] > 0).all()
    assert not data.estimates_missing(m)
    assert data.estimates_missing(m.assign(flops=0.0)) and data.estimates_missing(m.iloc[0:0])


def test_roofs_bend_at_the_ridge(gpus):
    spec = gpus["prefill"].spec
    r = data.roofs(spec, (1.0, 1e5), "fp4")
    fp4 = r[r["precision"] == "fp4"].set_index("intensity")["flops_per_second"]
    assert fp4.to_dict() == {1.0: 8.0e12, 1875.0: 15.0e15, 1e5: 15.0e15}
    assert r.loc[r["precision"] == "fp4", "assumed"].all() and not r.loc[r["precision"] == "bf16", "assumed"].any()
    low, high = data.intensity_range(pd.DataFrame({"intensity": [50.0, np.nan, 2e4]}), [spec])
    assert (low, high) == (1.0, 1e6)


def test_the_sick_racks_engines_count_their_raw_increments(sick):
    w = Window.ending(LATEST, 300, 10)
    engines = data.engines(sick, w)
    assert (engines["role"].value_counts().to_dict()) == {"decode": 64, "prefill": 8}
    raw = sick(
        """SELECT s.target, s.engine, sum(i.delta) AS flops
           FROM increments i JOIN series_targets s USING (series_id)
           WHERE s.metric = 'vllm:estimated_flops_per_gpu_total' AND i.ts > $a AND i.ts <= $b
           GROUP BY ALL""",
        {"a": LATEST - timedelta(seconds=300), "b": LATEST},
    ).set_index(["target", "engine"])["flops"]
    got = engines.set_index(["target", "engine"])["flops"]
    assert got.to_dict() == pytest.approx(raw.to_dict(), rel=0.05)  # the window's edges prorate
    assert engines["seconds"].between(297, 300).all()  # each engine scraped through the window


def test_the_page_shows_each_pools_mfu_and_mbu_and_its_engines(hand_api, monkeypatch):
    from tests.conftest import run_page

    at = run_page(str(ROOT / "dashboard" / "views" / "roofline.py"), hand_api, monkeypatch, timeout=120)
    assert not at.error and not at.warning
    cards = {m.label: m.value for m in at.metric}
    assert cards["prefill MFU (FP4)"] == "15.00%" and cards["prefill MBU"] == "31.25%"
    assert cards["decode MFU (FP8)"] == f"{100 * 0.2e15 / 1.979e15:,.2f}%"
    table = at.dataframe[0].value.set_index("label")
    assert len(table) == 6  # two pools, four engines
    assert table.loc["decode-0 · DP 0", "rejected"] == f"{100 * 150 / 1150:.1f}%"
    assert table.loc["decode-0 · DP 1", "rejected"] == table.loc["prefill pool", "rejected"] == "—"  # not 0
    assert table.loc["prefill pool", "tflops"] == pytest.approx(2250.0, rel=1e-6)
    charts = {c["layout"]["title"]["text"]: c for c in (json.loads(p.proto.spec) for p in at.get("plotly_chart"))}
    roof = charts["Roofline: FLOP/s per GPU"]
    names = [t["name"] for t in roof["data"]]
    assert "NVIDIA GB300 FP4 roof (MFU's)" in names and "NVIDIA H200 FP8 roof (MFU's)" in names
    assert "NVIDIA H200 FP4 roof" not in " ".join(names)
    assert {"prefill pool", "decode pool", "prefill engines", "decode engines"} <= set(names)
    assert roof["layout"]["xaxis"]["type"] == roof["layout"]["yaxis"]["type"] == "log"
    sources = " ".join(m.value for m in at.markdown)  # the expander: each roof's source, the precision's reason
    assert "15 PetaFLOPS dense NVFP4" in sources and "MXFP4" in sources and "no FP4 tensor cores" in sources
    at.selectbox(key="roof_precision").set_value("fp8").run()
    assert {m.label: m.value for m in at.metric}["prefill MFU (FP8)"] == "45.00%"


def test_before_any_scrape_the_page_says_so(empty_api, monkeypatch):
    from tests.conftest import run_page

    at = run_page(str(ROOT / "dashboard" / "views" / "roofline.py"), empty_api, monkeypatch)
    assert any("No scrapes stored yet" in i.value for i in at.info)
