"""The GB300 NVL72 launch profile: every vLLM command line parses with vLLM's own argument
parser (from the vLLM environment), so a renamed or removed flag fails here; the router's with
vllm-router's; the topology adds up to the rack."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from moemeter.cli import main
from stack.launch import LaunchError, commands, load, targets, vllm_argv

ROOT = Path(__file__).parents[2]
PARSE_WITH_VLLM = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        a = parser.parse_args(argv)
    except SystemExit:
        out.append(None)
        continue
    out.append({"dp": a.data_parallel_size, "all2all": a.all2all_backend, "eplb": a.enable_eplb,
                "redundant": a.eplb_config.num_redundant_experts if a.enable_eplb else None,
                "headless": a.headless, "ep": a.enable_expert_parallel, "mfu": a.enable_mfu_metrics,
                "spec": json.loads(a.speculative_config) if isinstance(a.speculative_config, str)
                        else a.speculative_config,
                "kv": json.loads(a.kv_transfer_config)["kv_connector"] if isinstance(a.kv_transfer_config, str)
                      else a.kv_transfer_config.kv_connector})
print(json.dumps(out))
"""


def _vllm_parse(argvs: list[list[str]]) -> list[dict | None]:
    python = ROOT / ".vllm-venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("needs the vLLM environment (make vllm-env; make test builds it)")
    r = subprocess.run(
        [str(python), "-c", PARSE_WITH_VLLM], input=json.dumps(argvs), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_every_vllm_command_parses_with_vllms_own_parser():
    launches = [c for c in commands(load("gb300-nvl72")) if c.argv[:2] == ["vllm", "serve"]]
    parsed = _vllm_parse([vllm_argv(c) for c in launches])
    assert None not in parsed, [c.name for c, p in zip(launches, parsed) if p is None]
    by_name = dict(zip([c.name for c in launches], parsed))
    assert by_name["prefill-0"] == {
        "dp": 2,
        "all2all": "deepep_high_throughput",
        "eplb": False,
        "redundant": None,
        "headless": False,
        "ep": True,
        "mfu": True,
        "spec": None,
        "kv": "NixlConnector",
    }
    assert by_name["decode-node-00"]["all2all"] == "deepep_low_latency" and by_name["decode-node-00"]["redundant"] == 64
    assert not by_name["decode-node-00"]["headless"] and by_name["decode-node-15"]["headless"]
    # decode drafts as the twin's profile does (its one home), prefill does not
    assert by_name["decode-node-00"]["spec"] == {"method": "dspark", "num_speculative_tokens": 3}
    assert all(p["mfu"] for p in parsed)
    # A renamed flag would fail: the same check refuses one that does not exist.
    assert _vllm_parse([[*vllm_argv(launches[0]), "--enable-eplbb"]]) == [None]


@pytest.mark.vllm
def test_the_router_command_parses_with_vllm_routers_parser():
    python = ROOT / ".router-venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("needs .router-venv (make router-env; make test builds it)")
    router = next(c for c in commands(load("gb300-nvl72")) if c.name == "router")
    code = (
        "import json, sys; from vllm_router.launch_router import parse_router_args; "
        "a = parse_router_args(json.load(sys.stdin)); print(json.dumps([a.vllm_pd_disaggregation, len(a.prefill_urls)]))"
    )
    r = subprocess.run(
        [str(python), "-c", code], input=json.dumps(router.argv[1:]), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [True, 4]


def test_the_topology_adds_up_to_the_rack(tmp_path, capsys):
    p = load("gb300-nvl72")
    t = targets(p)
    gpus = {role: sum(x["gpus"] for x in t if x["role"] == role) for role in ("prefill", "decode", "gpu")}
    assert gpus == {"prefill": 8, "decode": 64, "gpu": 72}
    hosts = [c.host for c in commands(p) if c.name.startswith("decode-node")]
    assert len(hosts) == len(set(hosts)) == 16 and "gb300-tray-00" not in hosts  # prefill trays stay apart
    assert main(["launch", "gb300-nvl72", "--targets-out", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("vllm serve") == 20 and "vllm-router" in out and "VLLM_PLUGINS=moemeter" in out
    assert json.loads((tmp_path / "t.json").read_text()) == t
    with pytest.raises(LaunchError, match="known"):
        load("no-such-rack")
    bad = {**p, "decode": {**p["decode"], "data_parallel": 66}}
    with pytest.raises(LaunchError, match="whole trays"):
        commands(bad)
