"""The plugin's GPU check script, dry-run on CPU with real vLLM (the device tool runs it on a GPU)."""

import json
import subprocess
import sys

import pytest

from tests.integration.vllm_server import ROOT, VLLM_PYTHON, ensure_vllm_env

SCRIPT = ROOT / "stack" / "vllm_plugin" / "device_check.py"


@pytest.mark.integration
@pytest.mark.vllm
def test_the_dry_run_on_cpu_holds_every_check(tmp_path):
    ensure_vllm_env()
    run = subprocess.run(
        [str(VLLM_PYTHON), str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=900
    )
    report = json.loads((tmp_path / "device-check.json").read_text())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert report["device"] == "cpu" and list(report["modes"]) == ["eager"]
    eager = report["modes"]["eager"]
    assert all(eager["checks"].values()) and eager["forwarded_tokens"] > 0
    assert sorted(eager["routed_per_layer"]) == ["0", "1", "2"]  # the MoE layers: 4 layers, the first dense


def test_without_vllm_it_says_so_and_writes_nothing(tmp_path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "has no vLLM" in run.stderr
    assert not list(tmp_path.iterdir())
