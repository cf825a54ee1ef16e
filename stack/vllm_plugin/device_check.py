"""The plugin's GPU check, for one GPU lent through the `device` tool, and its dry run on CPU.

What only a GPU can show (EPLB needs two GPUs and is checked on CPU by the tests):
  - the router hook counts every routed token on the CUDA path: per MoE layer, top-k x the
    tokens vLLM forwarded, exactly, eagerly and with CUDA graphs (vLLM's default; a Python hook
    inside a captured graph would run at capture only, and the counts would fall behind);
  - the forward phase is device time from CUDA events: timed once per step, never longer than
    the step that holds it.

Run with a Python that has vLLM (and torch, transformers) from the repository root:
    python stack/vllm_plugin/device_check.py --out DIR
It installs the plugin from this directory into a temporary target (no network needed) unless
that Python has it, builds the tiny MoE (stack/profiles/local-cpu/make_model.py), serves it on
loopback in each mode, sends a few requests and writes DIR/device-check.json; the exit status is
0 when every check held, 1 when one did not (the servers' logs are kept), 2 when it could not
run. On CPU (the dry run) the one mode is eager, bound to the first core this process may use.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MAKE_MODEL = ROOT / "stack" / "profiles" / "local-cpu" / "make_model.py"
MODEL_NAME = "tiny-moe"
KV_CACHE_BYTES = 256 * 2**20  # as the local stack's, on either device
REQUESTS = 4


def _plugin_path(work: Path) -> str | None:
    """A PYTHONPATH entry holding the plugin with its entry points, None when installed."""
    if any(e.name == "moemeter" for e in importlib.metadata.entry_points(group="vllm.general_plugins")):
        return None
    target = work / "plugin"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(HERE),
        ],
        check=True,
    )
    return str(target)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return dict(json.loads(r.read()))


def _samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    page = _get(url + "/metrics").decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(page) for s in f.samples]


def _sum(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items()))


def _check(url: str, top_k: int, moe_layers: int, deadline_s: float) -> dict:
    """Send the requests, wait (with a deadline) until the plugin's totals are not behind vLLM's
    own counters, and judge them."""
    for i in range(REQUESTS):
        body = {
            "model": MODEL_NAME,
            "prompt": f"Request {i}: route every token",
            "max_tokens": 8 + i,
            "ignore_eos": True,
        }
        _post(url + "/v1/completions", body)
    deadline = time.monotonic() + deadline_s
    while True:
        m = _samples(url)
        computed = _sum(m, "vllm:prompt_tokens_by_source_total", source="local_compute")
        finished = _sum(m, "vllm:request_success_total")
        # every forwarded token is routed to top-k experts in each MoE layer; a request's last
        # token is sampled, never forwarded
        forwarded = computed + _sum(m, "vllm:generation_tokens_total") - finished
        layers: dict[str, float] = {}
        for n, lab, v in m:
            if n == "moemeter_expert_rank_tokens_total":
                layers[lab["layer"]] = layers.get(lab["layer"], 0.0) + v
        caught_up = len(layers) == moe_layers and min(layers.values()) >= top_k * forwarded
        # the worker (forward, experts) and the engine core (steps) hand over apart: every
        # forward ran inside a step, so the steps are all in once they are not fewer
        steps_in = _sum(m, "moemeter_step_seconds_count") >= _sum(
            m, "moemeter_step_phase_seconds_count", phase="forward"
        )
        if (caught_up and steps_in and finished >= REQUESTS) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    steps = _sum(m, "moemeter_step_seconds_count")
    forward_n = _sum(m, "moemeter_step_phase_seconds_count", phase="forward")
    forward_s = _sum(m, "moemeter_step_phase_seconds_sum", phase="forward")
    checks = {
        "every layer counted": len(layers) == moe_layers,
        "routed = top-k x forwarded in every layer": all(v == top_k * forwarded for v in layers.values()),
        "forward timed in every step, at most once": 0 < forward_n <= steps,
        "forward time within the step time": 0 < forward_s <= _sum(m, "moemeter_step_seconds_sum"),
    }
    return {
        "checks": checks,
        "forwarded_tokens": forwarded,
        "routed_per_layer": layers,
        "steps": steps,
        "forward_seconds": forward_s,
        "step_seconds": _sum(m, "moemeter_step_seconds_sum"),
    }


def _serve_and_check(model: Path, work: Path, mode: str, env: dict[str, str], config: dict, start_s: float) -> dict:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--dtype", "bfloat16", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--host", "127.0.0.1", "--port", str(port),
    ] + (["--enforce-eager"] if mode == "eager" else [])  # fmt: skip
    log_path = work / f"vllm-{mode}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                _get(url + "/health")
                break
            except OSError:
                time.sleep(1)
        else:
            return {"error": f"vLLM did not answer (exit {proc.poll()}); log: {log_path}"}
        moe_layers = config["num_hidden_layers"] - config.get("first_k_dense_replace", 0)
        return _check(url, config["num_experts_per_tok"], moe_layers, deadline_s=60)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")), help="where device-check.json goes")
    ap.add_argument("--start-seconds", type=float, default=300, help="deadline for each server to answer")
    args = ap.parse_args()
    try:
        import torch
        import vllm
    except ImportError as e:
        print(f"device check: this Python has no vLLM ({e}); run it with the vLLM environment's", file=sys.stderr)
        return 2
    gpu = torch.cuda.is_available()
    work = Path(tempfile.mkdtemp(prefix="moemeter-device-"))
    env = {**os.environ, "VLLM_PLUGINS": "moemeter", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("MOEMETER_VLLM_STATE_DIR", None)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if not gpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(min(os.sched_getaffinity(0)))
    plugin = _plugin_path(work)
    if plugin:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (plugin, env.get("PYTHONPATH")) if p)
    model = work / "model"
    subprocess.run([sys.executable, str(MAKE_MODEL), str(model)], check=True, capture_output=True)
    config = json.loads((model / "config.json").read_text())
    report: dict = {
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "modes": {},
    }
    for mode in ("eager", "cudagraphs") if gpu else ("eager",):
        report["modes"][mode] = _serve_and_check(model, work, mode, env, config, args.start_seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device-check.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    ok = all("checks" in r and all(r["checks"].values()) for r in report["modes"].values())
    if ok:
        shutil.rmtree(work)
    else:
        print(f"device check: a check failed; the servers' logs are in {work}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
