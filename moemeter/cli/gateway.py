"""The requests' path: `moemeter gateway` (the metering gateway) and `moemeter loadgen` (agent
sessions through it)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys
import time

from .common import (
    AT_LEAST_ONE,
    COUNT,
    DAYS,
    PORT,
    SECONDS,
    SEED,
    CliError,
    Command,
    Commands,
    Row,
    number,
    parse_duration,
)

DEFAULT_GATEWAY_PORT = 8000

commands = Commands()


# ------------------------------------------------------------------------ gateway
def _gateway_options(s: Command) -> None:
    from stack.gateway.app import MAX_IN_FLIGHT, UPSTREAM_TIMEOUT
    from stack.gateway.metrics import MAX_USER_LABELS
    from stack.gateway.records import KEEP_DAYS

    s.add_argument("--upstream", help="where requests go: vllm-router, one vLLM server, any OpenAI-compatible URL")
    s.add_argument("--port", type=PORT, default=DEFAULT_GATEWAY_PORT, help="port to listen on")
    s.add_argument("--host", default="127.0.0.1", help="address to bind")
    s.add_argument(
        "--admin-port",
        type=PORT,
        help="serve /metrics, the request feed and /health on this port "
        "instead (required when --host is beyond loopback or the keys file requires a key)",
    )
    s.add_argument("--admin-host", default="127.0.0.1", help="address for --admin-port")
    s.add_argument("--keys", help='API keys file: {"require_key": bool, "keys": [{"sha256", "tenant"}]}')
    s.add_argument("--hash-key", action="store_true", help="read an API key on stdin, print its keys-file entry")
    s.add_argument("--records", default="moemeter-gateway.sqlite", help="durable request log (the collectors' feed)")
    s.add_argument("--keep-days", type=DAYS, default=KEEP_DAYS, help="days request records stay in the log")
    s.add_argument("--timeout", type=SECONDS, default=UPSTREAM_TIMEOUT, help="seconds a request may take upstream")
    s.add_argument(
        "--max-user-labels",
        type=COUNT,
        default=MAX_USER_LABELS,
        help='users with their own /metrics label; the rest are counted as user="other" (the feed has everyone)',
    )
    s.add_argument(
        "--max-in-flight",
        type=AT_LEAST_ONE,
        default=MAX_IN_FLIGHT,
        metavar="N",
        help="requests served at once; more get 429 with Retry-After (recorded as 'overloaded')",
    )


@commands.command(
    "gateway",
    _gateway_options,
    help="the metering gateway: OpenAI-compatible, in front of vllm-router",
    rows=[
        Row(
            f"moemeter gateway --upstream URL [--port {DEFAULT_GATEWAY_PORT}] [--keys FILE]",
            "the **metering gateway**: OpenAI-compatible (`/v1/completions`, `/v1/chat/completions`, "
            "streaming or not) in front of vllm-router (or any OpenAI-compatible server); attributes each "
            "request to its `user` field or API key's tenant, records usage, TTFT and inter-token latency in "
            "a durable log the collectors read (target role `gateway`)",
        ),
    ],
)
def cmd_gateway(args: argparse.Namespace) -> int:
    from stack.gateway.app import Gateway, serve
    from stack.gateway.keys import hash_key, load_keys
    from stack.gateway.metrics import GatewayMetrics
    from stack.gateway.records import RecordLog

    if args.hash_key:
        key = sys.stdin.readline().strip()
        if not key:
            raise CliError("--hash-key reads one API key on stdin; it got none")
        print(json.dumps({"sha256": hash_key(key), "tenant": "TENANT"}))
        return 0
    if not args.upstream:
        raise CliError("--upstream URL is required (vllm-router, a vLLM server, or any OpenAI-compatible server)")
    keys = load_keys(args.keys) if args.keys else None
    from warehouse.api import is_loopback

    if not is_loopback(args.host) and args.admin_port is None:
        raise CliError(
            f"--host {args.host} is beyond loopback: give --admin-port too, so /metrics and the per-user "
            "request feed are served apart (on --admin-host, loopback by default), not to API clients"
        )
    upstream_key = os.environ.get("MOEMETER_UPSTREAM_API_KEY") or None
    try:
        records = RecordLog(args.records, keep_seconds=args.keep_days * 86400)
    except Exception as exc:  # sqlite3.Error, OSError: say which file
        raise CliError(f"cannot open the request log {args.records}: {exc}") from exc
    gateway = Gateway(
        args.upstream,
        records,
        keys,
        GatewayMetrics(args.max_user_labels),
        timeout=args.timeout,
        upstream_key=upstream_key,
        max_in_flight=args.max_in_flight,
    )
    print(
        f"gateway http://{args.host}:{args.port} -> {args.upstream}; records in {args.records}"
        + (f"; keys from {args.keys}" + (" (required)" if keys and keys.require_key else "") if args.keys else ""),
        flush=True,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        admin = (args.admin_host, args.admin_port) if args.admin_port is not None else None
        await serve(gateway, args.host, args.port, stop, admin)

    try:
        asyncio.run(main())
    except OSError as exc:
        raise CliError(f"cannot bind {args.host}:{args.port}: {exc}") from exc
    return 0


# ------------------------------------------------------------------------ loadgen
def _loadgen_options(s: Command) -> None:
    from stack.loadgen.run import CONCURRENCY, STREAM_SHARE

    s.add_argument("--url", required=True, help="the gateway (or any OpenAI-compatible server)")
    s.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    s.add_argument("--seed", type=SEED, default=0, help="same seed, same sessions")
    s.add_argument(
        "--concurrency",
        type=AT_LEAST_ONE,
        default=CONCURRENCY,
        help="sessions in flight (closed loop), or the cap with --rate",
    )
    s.add_argument(
        "--rate",
        type=number(0.001, 1e6, "sessions a second"),
        help="new sessions per second (open loop) instead of a closed loop",
    )
    s.add_argument("--duration", help="stop starting turns after this long (e.g. 10m); default: run every session")
    s.add_argument(
        "--stream-share", type=number(0, 1, "a share"), default=STREAM_SHARE, help="share of requests that stream"
    )
    s.add_argument("--no-ignore-eos", action="store_true", help="do not send vLLM's ignore_eos (other servers)")
    s.add_argument("--api-key-env", help="environment variable holding the API key to send")
    s.add_argument("--out", help="write one JSON line per request here")
    s.add_argument("--json", action="store_true", help="print the summary on one line")
    from stack.loadgen.workload import WorkloadSpec

    for f in dataclasses.fields(WorkloadSpec):
        s.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(f.default),
            dest=f.name,
            help=f"{_field_doc(WorkloadSpec, f.name)} (default {f.default})",
        )


def _field_doc(cls: type, name: str) -> str:
    """The one-line docstring under a dataclass field (how profiles and specs document their fields)."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    for stmt, nxt in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", None) == name:
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                return str(nxt.value.value).rstrip(".")
    return name


@commands.command(
    "loadgen",
    _loadgen_options,
    help="AgentX-like agent sessions from many users, through the gateway",
    rows=[
        Row(
            "moemeter loadgen --url URL [--sessions N] [--users N] [--concurrency N | --rate R] [--seed N]",
            "AgentX-like agent sessions (growing context, shared prefixes, tool-call and long turns, "
            "subagents, think time) through the gateway; prints requests, tokens, P50/P90 per-user tokens/s, "
            "TTFT, errors",
        ),
    ],
)
def cmd_loadgen(args: argparse.Namespace) -> int:
    import dataclasses

    import httpx

    from stack.loadgen.run import LoadGen, summarise, write_results
    from stack.loadgen.workload import WorkloadSpec

    spec = WorkloadSpec()
    changes = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(spec) if getattr(args, f.name, None) is not None
    }
    try:
        spec = dataclasses.replace(spec, **changes)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    model = args.model
    if not model:
        try:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            model = httpx.get(args.url.rstrip("/") + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise CliError(f"cannot learn the model from {args.url}/v1/models ({exc}); pass --model") from exc
    gen = LoadGen(
        args.url,
        model,
        spec,
        seed=args.seed,
        concurrency=args.concurrency,
        rate=args.rate,
        duration=parse_duration(args.duration) if args.duration else None,
        stream_share=args.stream_share,
        ignore_eos=not args.no_ignore_eos,
        api_key=key,
    )
    began = time.monotonic()
    results = gen.run()
    summary = summarise(results, time.monotonic() - began)
    if args.out:
        with open(args.out, "w") as fh:
            write_results(results, fh)
    print(json.dumps(summary, indent=None if args.json else 2))
    return 0 if summary["ok"] else 1
