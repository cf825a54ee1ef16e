"""The storage bench's referee gets the samples the warehouse holds: what promtool builds its TSDB
block from, read back with `promtool tsdb dump`, is every stored sample with a value."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from benchmarks import storage
from collectors.parse import parse_page
from moemeter.contract import TargetInfo
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch

FIXTURES = Path(__file__).parents[1] / "fixtures"
ROUTER = TargetInfo("router", "http://r/metrics", "router", 0, "test")
GPU = TargetInfo("gpu-tray-0", "http://g/metrics", "gpu", 1, "test")
T0 = datetime(2026, 11, 30, 10, 0, 0)
DCGM = (
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="NVIDIA \\"GB300\\""} {util}\n'
    "# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
    'DCGM_FI_DEV_POWER_USAGE{gpu="0"} 1.7976931348623157e+308\n'  # DCGM's blank: stored as NULL
    "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\n"
    'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0"} NaN\n'
)
DUMPED = re.compile(r"^\{(.*)\} (\S+) (\d+)$")


def warehouse(path: Path) -> None:
    router = (FIXTURES / "vllm-router-0.1.17-pd.metrics.txt").read_text()
    wh = Warehouse(path)
    ing = Ingestor()
    for k in range(3):
        ts = T0 + timedelta(seconds=5 * k)
        batches = [
            ScrapeBatch(ROUTER, ts, True, 0.01, parse_page(router.encode())),
            ScrapeBatch(GPU, ts, True, 0.01, parse_page(DCGM.replace("{util}", str(40 + k)).encode())),
        ]
        wh.write(lambda con, b=batches: ing.write_all(con, b))
    wh.close()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool: `make system-deps` installs prometheus")
def test_promtool_builds_its_block_from_every_reading_with_a_value(tmp_path):
    db = tmp_path / "w.duckdb"
    warehouse(db)
    n = storage.openmetrics(db, tmp_path / "samples.om")
    blocks = tmp_path / "blocks"
    build = ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(tmp_path / "samples.om"), str(blocks)]
    subprocess.run(build, check=True)
    (blocks / "wal").mkdir()
    dump = subprocess.run(["promtool", "tsdb", "dump", str(blocks)], check=True, capture_output=True, text=True).stdout
    dumped = set()
    for line in dump.splitlines():
        m = DUMPED.match(line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[1]))
        dumped.add((labels.pop("__name__"), labels["instance"], tuple(sorted(labels.items())), m[2], int(m[3])))
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute(
            """SELECT s.metric, s.target, s.labels, s.le, x.value, epoch_ms(x.ts)
               FROM readings x JOIN series s USING (series_id) WHERE x.value IS NOT NULL"""
        ).fetchall()
    assert n == len(stored) == len(dumped) == len({r[0:4] for r in stored}) * 3
    values = sorted((name, instance, repr(float(v)), ms) for name, instance, _, v, ms in dumped)
    shift = storage.BLOCK_ORIGIN_MS - min(r[5] for r in stored)
    assert sorted((metric, target, repr(v), ms + shift) for metric, target, _, _, v, ms in stored) == values
    utils = sorted((float(v), ms) for name, _, labels, v, ms in dumped if name == "DCGM_FI_DEV_GPU_UTIL")
    ms0 = storage.BLOCK_ORIGIN_MS  # the first scrape's time, moved to the start of a block
    assert utils == [(40.0, ms0), (41.0, ms0 + 5000), (42.0, ms0 + 10000)]
    assert len([p for p in blocks.iterdir() if (p / "meta.json").exists()]) == 1
    tensor = [labels for name, _, labels, v, _ in dumped if name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    assert len(tensor) == 3  # NaN is a value; the power blank is none
    util_labels = next(labels for name, _, labels, _, _ in dumped if name == "DCGM_FI_DEV_GPU_UTIL")
    assert ("modelName", 'NVIDIA \\"GB300\\"') in util_labels
