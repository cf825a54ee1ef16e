"""Launch commands of a GPU rack profile (stack/profiles/<name>/profile.toml): every vLLM API
server (and headless decode rank group) per tray, vllm-router in PD mode, and the targets file
the collectors read. Commands use vLLM's own flags; tests parse each with vLLM's parser."""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moemeter.contract.errors import MoemeterError

PROFILES = Path(__file__).parent / "profiles"
NIXL = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


class LaunchError(MoemeterError, ValueError):
    """The profile cannot be turned into commands."""


@dataclass(frozen=True)
class Launch:
    name: str  # e.g. prefill-0, decode-node-03
    host: str  # the tray it runs on
    argv: list[str]  # the command, vLLM's CLI (`vllm serve ...`) or vllm-router
    env: dict[str, str]

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"# {self.name} on {self.host}\n{env} {shlex.join(self.argv)}".replace("\n ", "\n")


def histogram_buckets(twin_profile: str) -> str:
    """vLLM's `--custom-histogram-buckets` for a deployment, from its twin profile (their one home, so
    the twin exports the buckets the real servers do)."""
    from stack.twin.config import load_profile

    return json.dumps(load_profile(twin_profile).custom_histogram_buckets, separators=(",", ":"))


def speculative_config(twin_profile: str) -> str | None:
    """The decode instance's `--speculative-config`, from its twin profile's draft path (its one
    home: the twin drafts what the real decode engines draft); None without one."""
    from stack.twin.config import load_profile

    spec = load_profile(twin_profile).speculative
    if not spec.enabled:
        return None
    return json.dumps(
        {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}, separators=(",", ":")
    )


def load(name: str) -> dict[str, Any]:
    path = PROFILES / name / "profile.toml"
    if not path.is_file():
        known = sorted(p.parent.name for p in PROFILES.glob("*/profile.toml"))
        raise LaunchError(f"no launch profile {name!r}; known: {known}")
    return tomllib.loads(path.read_text())


def commands(p: dict[str, Any]) -> list[Launch]:
    pf, dc, rt = p["prefill"], p["decode"], p["router"]
    per_tray = p["gpus_per_tray"]
    host = p["tray_host"].format
    common = [
        p["model"],
        "--served-model-name",
        p["served_model_name"],
        "--max-model-len",
        str(p["max_model_len"]),
        "--kv-transfer-config",
        NIXL,
        "--enable-expert-parallel",
        "--custom-histogram-buckets",
        histogram_buckets(p["plugin"]["twin_profile"]),
        "--enable-mfu-metrics",  # vllm:estimated_* (the Roofline page) count only with it
    ]
    drafting = speculative_config(p["plugin"]["twin_profile"])
    env = {"VLLM_PLUGINS": "moemeter"}  # the plugin's metrics and its /moemeter/experts endpoint
    out: list[Launch] = []
    per_prefill_tray = per_tray // pf["data_parallel"]
    for i in range(pf["instances"]):
        tray = pf["first_tray"] + i // per_prefill_tray
        gpus = ",".join(str((i % per_prefill_tray) * pf["data_parallel"] + g) for g in range(pf["data_parallel"]))
        out.append(
            Launch(
                f"prefill-{i}",
                host(tray=tray),
                [
                    "vllm",
                    "serve",
                    *common,
                    "--port",
                    str(pf["port"] + i),
                    "--data-parallel-size",
                    str(pf["data_parallel"]),
                    "--all2all-backend",
                    pf["all2all_backend"],
                ],
                {**env, "CUDA_VISIBLE_DEVICES": gpus, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(5600 + i)},
            )
        )
    nodes = dc["data_parallel"] // per_tray
    if dc["data_parallel"] % per_tray or dc["first_tray"] + nodes > p["trays"]:
        raise LaunchError(
            f"decode data parallel {dc['data_parallel']} does not fit whole trays from tray "
            f"{dc['first_tray']} of {p['trays']}"
        )
    head = host(tray=dc["first_tray"])
    eplb = json.dumps(
        {
            "num_redundant_experts": dc["num_redundant_experts"],
            "window_size": dc["eplb_window_size"],
            "step_interval": dc["eplb_step_interval"],
        },
        separators=(",", ":"),
    )
    for n in range(nodes):
        argv = [
            "vllm",
            "serve",
            *common,
            "--port",
            str(dc["port"]),
            "--data-parallel-size",
            str(dc["data_parallel"]),
            "--data-parallel-size-local",
            str(per_tray),
            "--data-parallel-start-rank",
            str(n * per_tray),
            "--data-parallel-address",
            head,
            "--data-parallel-rpc-port",
            str(dc["rpc_port"]),
            "--all2all-backend",
            dc["all2all_backend"],
            "--enable-eplb",
            "--eplb-config",
            eplb,
            *(["--speculative-config", drafting] if drafting else []),
        ]
        if n:
            argv.append("--headless")  # ranks on other trays: engines only, the head tray serves the API
        out.append(
            Launch(
                f"decode-node-{n:02d}",
                host(tray=dc["first_tray"] + n),
                argv,
                {**env, "VLLM_NIXL_SIDE_CHANNEL_PORT": "5700"},
            )
        )
    prefill_urls = [
        f"http://{host(tray=pf['first_tray'] + i // per_prefill_tray)}:{pf['port'] + i}" for i in range(pf["instances"])
    ]
    prefill_args = [arg for url in prefill_urls for arg in ("--prefill", url)]  # one flag each: URL [bootstrap port]
    out.append(
        Launch(
            "router",
            head,
            [
                "vllm-router",
                "--host",
                "0.0.0.0",
                "--port",
                str(rt["port"]),
                "--vllm-pd-disaggregation",
                *prefill_args,
                "--decode",
                f"http://{head}:{dc['port']}",
                "--kv-connector",
                "nixl",
                "--prometheus-port",
                str(rt["prometheus_port"]),
            ],
            {},
        )
    )
    return out


def vllm_argv(launch: Launch) -> list[str]:
    """The part of a `vllm serve` command vLLM's own parser reads (model first, as `--model`)."""
    assert launch.argv[:2] == ["vllm", "serve"]
    return ["--model", launch.argv[2], *launch.argv[3:]]


def targets(p: dict[str, Any]) -> list[dict[str, object]]:
    """The collectors' targets: every vLLM API server, the router, one dcgm-exporter per tray."""
    pf, dc = p["prefill"], p["decode"]
    per_prefill_tray = p["gpus_per_tray"] // pf["data_parallel"]
    host = p["tray_host"].format
    stack = f"gpu:{p['name']}"
    out: list[dict[str, object]] = [
        {
            "name": f"prefill-{i}",
            "url": f"http://{host(tray=pf['first_tray'] + i // per_prefill_tray)}:{pf['port'] + i}/metrics",
            "role": "prefill",
            "gpus": pf["data_parallel"],
            "stack": stack,
        }
        for i in range(pf["instances"])
    ]
    out.append(
        {
            "name": "decode-0",
            "url": f"http://{host(tray=dc['first_tray'])}:{dc['port']}/metrics",
            "role": "decode",
            "gpus": dc["data_parallel"],
            "stack": stack,
        }
    )
    out.append(
        {
            "name": "router",
            "url": f"http://{host(tray=dc['first_tray'])}:{p['router']['prometheus_port']}/metrics",
            "role": "router",
            "gpus": 0,
            "stack": stack,
        }
    )
    out += [
        {
            "name": f"gpu-tray-{t:02d}",
            "url": f"http://{host(tray=t)}:9400/metrics",
            "role": "gpu",
            "gpus": p["gpus_per_tray"],
            "stack": stack,
            "hostname": host(tray=t),
        }
        for t in range(p["trays"])
    ]
    return out
