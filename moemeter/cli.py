"""The `moemeter` command: the composition root that wires stack, collectors, warehouse and dashboard."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moemeter.contract import DEFAULT_INTERVAL
from moemeter.contract.clock import latest_allowed, utc_now
from moemeter.contract.errors import MoemeterError

if TYPE_CHECKING:
    from stack.twin.faults import Fault

log = logging.getLogger("moemeter")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "moemeter.duckdb"
DEFAULT_API_PORT = 8431
MEMORY_HELP = (
    "memory for the warehouse (DuckDB buffer pool, writer and queries together), e.g. 4GB; "
    "default: DuckDB's, 80%% of RAM"
)
DEFAULT_DASHBOARD_PORT = 8501
DEFAULT_LOCAL_BASE_PORT = 18100  # the local CPU stack's router; its other parts on the next nine ports


class CliError(MoemeterError):
    """A bad flag or argument (every MoemeterError is printed without a traceback, exit status 2)."""


def _parse_time(text: str) -> datetime:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CliError(f"not an ISO 8601 time: {text!r}") from exc
    return dt.astimezone(UTC).replace(tzinfo=None) if dt.tzinfo else dt


def _parse_duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError) as exc:
        raise CliError(f"not a duration (e.g. 90s, 30m, 24h): {text!r}") from exc


# --------------------------------------------------------------------------- twin
def cmd_twin(args: argparse.Namespace) -> int:
    from stack.twin.config import load_profile
    from stack.twin.faults import Fault
    from stack.twin.server import Twin, write_targets

    profile = load_profile(args.profile)
    faults = tuple(Fault.parse(spec) for spec in args.fault)
    if args.fast_forward:
        return _fast_forward(profile, args, faults)
    twin = Twin(profile, seed=args.seed, host=args.host, faults=faults)
    if args.base_port:
        twin.ports = {name: args.base_port + i for i, name in enumerate(twin.ports)}
    if args.openai_port:  # first: it needs none of the simulation, which takes a while to warm up
        _serve_simulated_upstream(profile.model.name, args.host, args.openai_port)
    try:
        targets = twin.serve()
    except OSError as exc:
        raise CliError(f"cannot bind the twin's endpoints: {exc}") from exc
    if args.targets_out:
        write_targets(targets, Path(args.targets_out))
    gpus = sum(int(str(t["gpus"])) for t in targets if t["role"] == "gpu")
    print(
        f"twin {profile.name} (seed {args.seed}): {len(targets)} endpoints, {gpus} GPUs"
        + (f", targets in {args.targets_out}" if args.targets_out else "")
        + (f", faults: {', '.join(map(str, faults))}" if faults else ""),
        flush=True,
    )
    _wait_for_signal()
    twin.close()
    return 0


def _serve_simulated_upstream(model: str, host: str, port: int) -> None:
    """The twin as an OpenAI-compatible server (for the gateway and the load generator), in its own thread."""
    from aiohttp import web

    from stack.twin.upstream import SimulatedUpstream

    # Decode speed near the twin's calibration (P90 per-user ~196 tok/s): 4.5 ms between tokens.
    app = SimulatedUpstream(model=model, ttft_seconds=0.15, itl_seconds=0.0045).app()
    loop = asyncio.new_event_loop()

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()

    try:
        loop.run_until_complete(start())
    except OSError as exc:
        raise CliError(f"cannot bind the simulated OpenAI server on {host}:{port}: {exc}") from exc
    threading.Thread(target=loop.run_forever, name="twin-openai", daemon=True).start()
    print(f"twin: OpenAI-compatible server for the gateway at http://{host}:{port}/v1 (model {model})", flush=True)


# DuckDB checkpoints once its write-ahead log passes 16 MB: every three rounds of a fast-forward at
# 60 s, each rewriting the tables' open row groups. At 256 MB, 30 minutes of the reference rack
# took 48.4 instead of 59.4 CPU-s (36.1 instead of 40.1 s of wall time), for 100 MB more memory.
FAST_FORWARD_CHECKPOINT = "256MB"
# And one DuckDB thread: the twin's process keeps the other core busy (90 simulated minutes 63.3
# instead of 69.7 s, 99 instead of 123 CPU-s).
FAST_FORWARD_THREADS = 1


def _fast_forward(profile, args: argparse.Namespace, faults: tuple[Fault, ...] = ()) -> int:  # type: ignore[no-untyped-def]
    """Generate history through the real ingest path: twin pages -> parser -> the collector's
    `store` (one round per interval, as a live collector stores it) -> warehouse. The gateway's
    records come as columns (stack.gateway.records.ColumnPage), read with the same checks as a
    page of records."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from collectors.experts import SnapshotResult
    from collectors.parse import PageCache
    from collectors.requests import FeedResult
    from collectors.service import Collector
    from moemeter.contract import TargetInfo
    from stack.twin.rounds import TwinProcessError, TwinRounds
    from warehouse.experts import ExpertSnapshot
    from warehouse.ingest import ScrapeBatch

    if not args.db:
        raise CliError("--fast-forward needs --db PATH")
    seconds = _parse_duration(args.fast_forward)
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    start = end - timedelta(seconds=seconds)
    if not 0.01 <= args.tick <= args.interval:
        raise CliError(f"--tick must be between 0.01 s and the interval ({args.interval:g} s)")
    wh = _open_warehouse(
        args.db,
        memory_limit=args.memory_limit,
        checkpoint_threshold=FAST_FORWARD_CHECKPOINT,
        threads=FAST_FORWARD_THREADS,
    )
    collector = Collector(wh, targets_path=None, interval=args.interval)
    offsets = [k * args.interval for k in range(int(seconds // args.interval) + 1)]
    n, began = 0, time.perf_counter()
    report_every = max(1, len(offsets) // 20)  # about every 5%
    stored: Future[int] | None = None
    # The twin runs a round ahead in its own process (stack/twin/rounds.py) while this one parses a
    # round's pages and the warehouse's writer stores them; parsing a round waits for the round
    # before it to be stored, as a collector's next round does.
    with (
        TwinRounds(
            profile,
            [start.timestamp() + t for t in offsets],
            seed=args.seed,
            tick=args.tick,
            faults=faults,
            snapshot_every=max(1, round(60 / args.interval)),  # expert snapshots once a minute, as pulled
        ) as twin,
        ThreadPoolExecutor(1, thread_name_prefix="fast-forward") as storing,
    ):
        targets = {
            e.name: TargetInfo(e.name, f"twin://{e.name}", e.role, e.gpus, f"twin:{profile.name}", e.hostname)
            for e in twin.targets
        }
        try:
            for rounds, (t, r) in enumerate(zip(offsets, twin, strict=True), start=1):
                ts = start + timedelta(seconds=t)
                n += stored.result() if stored is not None else 0
                batches = [
                    ScrapeBatch(
                        targets[name],
                        ts,
                        True,
                        0.0,
                        collector.pages.setdefault(name, PageCache()).parse(text.encode()),
                        bytes=len(text),
                    )
                    for name, text in r.pages.items()
                ]
                snaps = [SnapshotResult(targets[name], ExpertSnapshot.from_json(s)) for name, s in r.snapshots.items()]
                feed = [FeedResult(targets["gateway"], [r.feed])]
                stored = storing.submit(collector.store, batches, snaps, feed)
                if rounds % report_every == 0:
                    _progress(t + args.interval, seconds, time.perf_counter() - began)
        except TwinProcessError as exc:
            raise CliError(str(exc)) from exc
        n += stored.result() if stored is not None else 0
    wh.close()
    wall = time.perf_counter() - began
    size = sum(f.stat().st_size for f in Path(args.db).parent.glob(Path(args.db).name + "*"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    twin_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child's: the twin's
    print(
        json.dumps(
            {
                "db": args.db,
                "seconds": seconds,
                "samples": n,
                "wall_seconds": round(wall, 2),
                "db_megabytes": round(size / 1e6),
                "peak_rss_megabytes": round(peak),
                "twin_peak_rss_megabytes": round(twin_peak),
            }
        )
    )
    return 0


def _progress(done: float, total: float, wall: float) -> None:
    """One line on stderr: how much history is written, and about how long the rest will take."""

    def span(s: float) -> str:
        return f"{s / 3600:.1f} h" if total >= 7200 else f"{s / 60:.1f} min"

    left = wall * max(0.0, total - done) / done
    print(
        f"fast-forward: {span(min(done, total))} of {span(total)} written ({min(100, 100 * done / total):.0f}%) "
        f"in {wall / 60:.1f} min, about {left / 60:.0f} min left",
        file=sys.stderr,
        flush=True,
    )


# -------------------------------------------------------------------------- serve
def cmd_serve(args: argparse.Namespace) -> int:
    from collectors.service import Collector
    from collectors.targets import load_targets
    from warehouse.api import TOKEN_ENV, QueryServer, is_loopback
    from warehouse.limits import Limits

    def check_targets() -> None:
        load_targets(args.targets)

    if Path(args.targets).exists() or args.wait_targets <= 0:  # refused before anything is opened
        check_targets()
    token = _api_token(args)
    if not token and not is_loopback(args.api_host):
        raise CliError(
            f"--api-host {args.api_host} is beyond loopback: the query API then needs a token "
            f"({TOKEN_ENV} in the environment, or --api-token-file FILE)"
        )
    if args.query_timeout <= 0 or args.query_max_rows <= 0 or args.query_max_mb <= 0 or args.query_concurrency <= 0:
        raise CliError("--query-timeout, --query-max-rows, --query-max-mb and --query-concurrency must be positive")
    limits = Limits(
        timeout_seconds=args.query_timeout,
        max_result_rows=args.query_max_rows,
        max_result_bytes=int(args.query_max_mb * 2**20),
    )
    wh = _open_warehouse(args.db, serve_read_only=True, memory_limit=args.memory_limit)
    try:
        api = QueryServer(wh, args.api_host, args.api_port, token, limits, args.query_concurrency)
    except OSError as exc:
        wh.close()
        raise CliError(f"cannot bind the query API on {args.api_host}:{args.api_port}: {exc}") from exc
    api.start()
    source = f"reading {args.prometheus} for" if args.prometheus else "scraping"
    if wh.read_only is not None:
        source = "NOT collecting (the file is read-only), not"
    print(f"warehouse {args.db}; query API {api.url}; {source} {args.targets} every {args.interval:g}s", flush=True)
    from warehouse.rollup import Retention

    retention = Retention(args.keep_raw_days, args.keep_minute_days, args.keep_hour_days)
    collector = Collector(wh, args.targets, args.interval, retention=retention, prometheus=args.prometheus)
    if wh.read_only is None:
        api.collector = collector.health.as_json
    publishing = _publish_loop(args, wh, api)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if not Path(args.targets).exists():  # the stack writes it once every part answers; the API answers meanwhile
            collector.health.starting = (
                f"waiting for the targets file {args.targets}: the stack writes it once every part answers"
            )
            deadline = time.monotonic() + args.wait_targets
            while not Path(args.targets).exists() and time.monotonic() < deadline:
                try:
                    await asyncio.wait_for(stop.wait(), 0.2)
                    return
                except TimeoutError:
                    pass
            check_targets()
            collector.health.starting = ""
        if wh.read_only is None:
            await collector.run(stop)
        else:  # serve what it holds until stopped
            await stop.wait()

    try:
        asyncio.run(main())
    finally:
        if publishing is not None:
            publishing.stop()
        api.shutdown()
        wh.close()
    return 0


def _publish_loop(args: argparse.Namespace, wh, api):  # type: ignore[no-untyped-def]
    """serve --lake: the thread that publishes the rack's closed rows (None without --lake)."""
    if not args.lake:
        return None
    from warehouse.lake import LakeError, PublishLoop

    try:
        chunk = timedelta(minutes=args.chunk_minutes)
        loop = PublishLoop(wh.cursor, args.lake, args.lake_data, _rack(args), args.publish_every, chunk)
    except LakeError as exc:
        raise CliError(str(exc)) from exc
    loop.start()
    api.lake = loop.health.as_json
    print(f"publishing rack {loop.rack} to the lake {args.lake} every {args.publish_every:g}s", flush=True)
    return loop


def _rack(args: argparse.Namespace) -> str:
    """--rack, else this host's name (as a rack name)."""
    import re
    import socket

    return args.rack or re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:64]


@contextmanager
def _lake_writer(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """`moemeter lake ...`: the lake attached as a writer, its errors one line."""
    import duckdb

    from warehouse.lake import LakeError, connect

    try:
        con = connect(args.lake, args.lake_data)
        try:
            yield con
        finally:
            con.close()
    except (LakeError, duckdb.Error) as exc:
        raise CliError(f"lake {args.lake_command}: {exc}") from exc


def _print_owners(con) -> None:  # type: ignore[no-untyped-def]
    from warehouse.lake import rack_owners

    owners = rack_owners(con)
    for rack, role, claimed in owners:
        print(f"  {rack:<24} {role:<24} since {claimed:%Y-%m-%d %H:%M} UTC")
    if not owners:
        print("  no rack yet: the first publisher of a rack claims it for its role")


def cmd_lake_setup(args: argparse.Namespace) -> int:
    """As the lake's owner: create its tables and install (or bring up to date) its guard."""
    from warehouse.lake import PUBLISHERS, ensure_schema, install_guard

    with _lake_writer(args) as con:
        ensure_schema(con)
        g = install_guard(con)
        print(f"lake guard {g.version} on {args.lake}: the lake's owner is role {g.owner}; racks and their roles:")
        _print_owners(con)
        if not g.publishers:
            print(
                f"no role {PUBLISHERS} yet: make it (CREATE ROLE {PUBLISHERS} NOLOGIN), a login role per rack in it, "
                "and run setup again to grant it what a publisher writes"
            )
    return 0


def cmd_lake_owners(args: argparse.Namespace) -> int:
    with _lake_writer(args) as con:
        print(f"racks of {args.lake} and the roles that publish them:")
        _print_owners(con)
    return 0


def cmd_lake_assign(args: argparse.Namespace) -> int:
    from warehouse.lake import assign_rack

    with _lake_writer(args) as con:
        assign_rack(con, args.rack, args.role)
    print(f"rack {args.rack}: published by role {args.role} from now on")
    return 0


def cmd_lake_tidy(args: argparse.Namespace) -> int:
    from warehouse.lake import tidy

    with _lake_writer(args) as con:
        done = tidy(con)
    print(
        f"lake tidied: {done.rewritten} files rewritten without deleted rows, {done.merged} merged, "
        f"{done.expired} snapshots expired, {done.removed} files removed"
    )
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    """Publish what a warehouse file holds to the lake, up to its rollup watermark."""
    import duckdb

    from warehouse.lake import LakeError, Publisher, connect

    try:
        lake = connect(args.lake, args.lake_data)
        try:
            publisher = Publisher(lake, _rack(args), timedelta(minutes=args.chunk_minutes))
            with _open_read_only(args.db) as local:
                steps = publisher.catch_up(local)
            if steps:  # a backlog leaves the lake tidy
                publisher.tidy()
        finally:
            lake.close()
    except (LakeError, duckdb.Error) as exc:
        raise CliError(f"publishing to the lake failed: {exc}") from exc
    if not steps:
        print(f"rack {publisher.rack}: nothing new to publish from {args.db}")
        return 0
    rows = sum(s.total_rows for s in steps)
    print(
        f"rack {publisher.rack}: published through {steps[-1].through['1m']:%Y-%m-%d %H:%M} UTC "
        f"in {len(steps)} steps, {rows:,} rows, from {args.db}"
    )
    return 0


# ------------------------------------------------------------------------ gateway
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
    if args.max_in_flight <= 0:
        raise CliError("--max-in-flight must be positive")
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
def cmd_loadgen(args: argparse.Namespace) -> int:
    import dataclasses

    import httpx

    from stack.loadgen.run import LoadGen, summarise, write_results
    from stack.loadgen.workload import WorkloadSpec

    spec = WorkloadSpec()
    changes = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(spec) if getattr(args, f.name, None) is not None
    }
    spec = dataclasses.replace(spec, **changes)
    if spec.users < 1 or spec.sessions < 1 or args.concurrency < 1 or (args.rate is not None and args.rate <= 0):
        raise CliError("--users, --sessions and --concurrency must be at least 1, --rate above 0")
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
        duration=_parse_duration(args.duration) if args.duration else None,
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


# ---------------------------------------------------------------------- dashboard
def _streamlit_cmd(port: int, host: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "dashboard" / "app.py"),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
    ]  # no "Deploy" button: this dashboard is deployed


def cmd_dashboard(args: argparse.Namespace) -> int:
    env = {**os.environ, "MOEMETER_API": args.api, "PYTHONPATH": str(ROOT)}
    if args.require_login:
        import importlib.util

        from dashboard import login

        if problem := login.config_problem(login.secrets_files()):
            raise CliError(f"--require-login: {problem}; see README, Security")
        if importlib.util.find_spec("authlib") is None:
            raise CliError("--require-login needs Authlib (pip install 'Authlib>=1.3.2')")
        env[login.LOGIN_ENV] = "1"
    if args.lake:  # checked here, so a bad catalog is one line and not a page error
        with _open_lake(args) as _:
            env["MOEMETER_LAKE"], env["MOEMETER_LAKE_DATA"] = args.lake, args.lake_data or ""
    lake = f"; the lake {args.lake}: Fleet page" if args.lake else ""
    print(f"dashboard: http://{args.host}:{args.port}  (query API {args.api}{lake})", flush=True)
    proc = subprocess.Popen(_streamlit_cmd(args.port, args.host), env=env)
    stopping: list[int] = []

    def forward(sig: int, _frame: object) -> None:  # Streamlit stops with us, and frees its port
        stopping.append(sig)
        if proc.poll() is None:
            proc.send_signal(sig)
        killer = threading.Timer(STOP_SECONDS, proc.kill)  # if it has not stopped by then (a no-op once it has)
        killer.daemon = True
        killer.start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    code = proc.wait()
    return 0 if stopping else code


# ------------------------------------------------------------------------- ingest
def cmd_ingest(args: argparse.Namespace) -> int:
    from collectors.parse import ExpositionError, parse_page
    from moemeter.contract import ROLES, TargetInfo
    from warehouse.ingest import Ingestor, ScrapeBatch

    if args.role not in ROLES:
        raise CliError(f"--role must be one of {list(ROLES)}")
    try:
        body = Path(args.file).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from exc
    try:
        samples = parse_page(body, "application/openmetrics-text" if args.openmetrics else "text/plain")
    except ExpositionError as exc:
        raise CliError(f"{args.file}: {exc}") from exc
    at = _parse_time(args.at)
    if at > latest_allowed(now := utc_now()):
        raise CliError(f"--at {at:%Y-%m-%d %H:%M:%S} is after this host's clock ({now:%Y-%m-%d %H:%M:%S} UTC)")
    target = TargetInfo(args.target, f"file://{Path(args.file).resolve()}", args.role, args.gpus, args.stack)
    wh = _open_warehouse(args.db)
    try:
        ingestor = Ingestor()
        n = wh.write(lambda con: ingestor.write(con, ScrapeBatch(target, at, True, 0.0, samples, bytes=len(body))))
    finally:
        wh.close()
    print(f"ingested {n} samples from {args.file} as {args.target} at {at.isoformat()} into {args.db}")
    return 0


# -------------------------------------------------------------------------- query
def _open_read_only(db: str):  # type: ignore[no-untyped-def]
    """A read-only connection to the file, or a CliError that says to use the API instead."""
    import duckdb

    from warehouse.readonly import lock_down

    if not Path(db).exists():
        raise CliError(f"no database at {db}")
    try:
        con = duckdb.connect(db, read_only=True)
        lock_down(con)
        return con
    except duckdb.Error as exc:
        from warehouse.db import written_by_newer_duckdb

        newer = written_by_newer_duckdb(db, exc)
        if newer:
            raise CliError(newer) from exc
        raise CliError(
            f"cannot open {db} ({exc}); while `moemeter serve` holds it, go through its query API: "
            f"--api http://127.0.0.1:{DEFAULT_API_PORT}"
        ) from exc


def cmd_query(args: argparse.Namespace) -> int:
    import duckdb
    import pandas as pd

    from warehouse.api import LocalQuery, QueryClient, QueryError, QueryRefused

    try:
        if args.lake:
            with _open_lake(args) as con:
                df = LocalQuery(con)(args.sql)
        elif args.api:
            df = QueryClient(args.api)(args.sql)
        else:
            with _open_read_only(args.db) as con:
                df = LocalQuery(con)(args.sql)
    except QueryRefused as exc:
        raise CliError(f"refused: {exc}") from exc
    except QueryError as exc:
        raise CliError(str(exc)) from exc
    except duckdb.Error as exc:
        raise CliError(f"query failed: {exc}") from exc
    if args.json:
        print(df.to_json(orient="records", date_format="iso"))
    else:
        with pd.option_context("display.max_rows", args.max_rows, "display.width", 200, "display.max_columns", 50):
            print(df.to_string(index=False) if len(df) else "(no rows)")
    return 0


# ------------------------------------------------------------------------- report
def _report_pools(path: str) -> dict[str, list[tuple[str, int]]]:
    from collectors.targets import load_targets
    from moemeter.contract import POOLS

    targets = load_targets(path)
    return {role: [(t.name, t.gpus) for t in targets if t.role == role] for role in POOLS}


def _report_sheet(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from warehouse.prices import load_sheet

    return load_sheet(args.price_sheet) if args.price_sheet else None


def _open_lake(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The lake opened read-only and locked down as the query API's connections are: with --rack,
    the warehouse's table names are that rack's; without, `lake.<table>` holds every rack's rows."""
    from warehouse.lake import LakeError, open_reader

    try:
        return open_reader(args.lake, args.rack, args.lake_data)
    except LakeError as exc:
        raise CliError(str(exc)) from exc


def _with_query(args: argparse.Namespace, fn):  # type: ignore[no-untyped-def]
    """Run fn(query) on one rack of the lake (--lake, --rack), the query API (--api) or the file
    opened read-only (--db)."""
    import duckdb

    from warehouse.api import LocalQuery, QueryClient, QueryError

    try:
        if getattr(args, "lake", None):
            with _open_lake(args) as con:
                return fn(LocalQuery(con))
        if args.api:
            return fn(QueryClient(args.api))
        with _open_read_only(args.db) as con:
            return fn(LocalQuery(con))
    except QueryError as exc:
        raise CliError(str(exc)) from exc
    except duckdb.Error as exc:
        raise CliError(f"query failed: {exc}") from exc


def _print_report(args: argparse.Namespace, report: Any) -> int:
    """A report as --json, --csv or text (its as_json, as_csv, as_text)."""
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    elif args.csv:
        sys.stdout.write(report.as_csv())
    else:
        print(report.as_text())
    return 0


def cmd_report_cost(args: argparse.Namespace) -> int:
    from warehouse.cost import NoData, cost_report, stored_pools

    start, end = _parse_time(args.from_), _parse_time(args.to)
    sheet = _report_sheet(args)
    if args.lake and any(t != t.replace(minute=0, second=0, microsecond=0) for t in (start, end)):
        print(
            "the lake holds request sums per closed hour: per-user costs count the window's whole hours only",
            file=sys.stderr,
        )
    if args.lake and not args.rack:
        return _print_report(args, _fleet_cost(args, start, end, sheet))
    if not args.targets and not args.lake:
        raise CliError("--targets is needed: the roles and GPUs of the pools (a lake's racks carry their own)")
    pools = _report_pools(args.targets) if args.targets else None
    try:
        report = _with_query(args, lambda q: cost_report(q, pools or stored_pools(q, start, end), start, end, sheet))
    except (NoData, ValueError) as exc:
        raise CliError(str(exc)) from exc
    return _print_report(args, report)


def _fleet_cost(args: argparse.Namespace, start: datetime, end: datetime, sheet):  # type: ignore[no-untyped-def]
    """report cost --lake without --rack: every rack's report (its own pools and sheets) and the fleet's."""
    from warehouse.api import LocalQuery
    from warehouse.cost import NoData, cost_report, stored_pools
    from warehouse.fleet import FleetCost
    from warehouse.lake import racks

    with _open_lake(args) as con:
        names = racks(con)
    if not names:
        raise CliError(f"no rack has published to the lake {args.lake} yet")
    reports, missing = {}, {}
    for rack in names:
        with _open_lake(argparse.Namespace(**{**vars(args), "rack": rack})) as con:
            q = LocalQuery(con)
            pools = stored_pools(q, start, end)
            if not any(pools.values()):
                missing[rack] = "none of its prefill or decode targets was scraped in the window"
                continue
            try:
                reports[rack] = cost_report(q, pools, start, end, sheet)
            except (NoData, ValueError) as exc:
                missing[rack] = str(exc)
    if not reports:
        raise CliError("no rack has counters in the window: " + "; ".join(f"{r}: {m}" for r, m in missing.items()))
    return FleetCost(start, end, reports, missing)


def cmd_report_daily(args: argparse.Namespace) -> int:
    from warehouse.cost import daily_statement

    start, end = _parse_time(args.from_), _parse_time(args.to)
    if end <= start:
        raise CliError("--to must be after --from")
    pools, sheet = _report_pools(args.targets), _report_sheet(args)
    try:
        df = _with_query(args, lambda q: daily_statement(q, pools, start, end, sheet))
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if args.parquet:
        df.to_parquet(args.parquet, index=False)
    if args.json:
        print(df.to_json(orient="records"))
    elif args.csv:
        print(df.to_csv(index=False), end="")
    else:
        import pandas as pd

        with pd.option_context("display.width", 250, "display.max_columns", 30):
            print(df.to_string(index=False))
    return 0


def cmd_report_slo(args: argparse.Namespace) -> int:
    from warehouse.goodput import NoSloSheet, slo_report

    start, end = _parse_time(args.from_), _parse_time(args.to)
    pools = _report_pools(args.targets) if args.targets else None
    sheet = _report_sheet(args)
    try:
        report = _with_query(args, lambda q: slo_report(q, start, end, pools, sheet, args.by))
    except (NoSloSheet, ValueError) as exc:
        raise CliError(str(exc)) from exc
    return _print_report(args, report)


def cmd_prices_load(args: argparse.Namespace) -> int:
    from warehouse.prices import PriceSheetError, load_sheet, store_sheet

    sheet = load_sheet(args.file)
    wh = _open_warehouse(args.db)
    try:
        added = wh.write(lambda con: store_sheet(con, sheet, datetime.now(UTC).replace(tzinfo=None)))
    except PriceSheetError as exc:
        raise CliError(str(exc)) from exc
    finally:
        wh.close()
    print(f"price sheet {sheet.name}: {added} new entries stored in {args.db}")
    return 0


def cmd_slo_load(args: argparse.Namespace) -> int:
    from warehouse.slo import load_slo_sheet, store_slo_sheet

    sheet = load_slo_sheet(args.file)
    wh = _open_warehouse(args.db)
    try:
        added = wh.write(lambda con: store_slo_sheet(con, sheet, datetime.now(UTC).replace(tzinfo=None)))
    finally:
        wh.close()
    classes = ", ".join(sorted({c.name for c in sheet.classes}))
    print(f"SLO sheet {sheet.name} ({classes}): {added} new entries stored in {args.db}")
    return 0


# --------------------------------------------------------------------------- pull
def cmd_pull(args: argparse.Namespace) -> int:
    """Backfill from a Prometheus-compatible API through the same ingest path as a scrape."""
    from collectors.promapi import http_get, pull_range
    from collectors.targets import load_targets
    from warehouse.db import reasons_text, record_rejected
    from warehouse.ingest import Ingestor

    targets = load_targets(args.targets)
    start, end = _parse_time(args.from_), _parse_time(args.to)
    if end <= start:
        raise CliError("--to must be after --from")
    if start > latest_allowed(now := utc_now()):
        raise CliError(f"--from {start:%Y-%m-%d %H:%M:%S} is after this host's clock ({now:%Y-%m-%d %H:%M:%S} UTC)")
    pulled = pull_range(http_get(args.prometheus), targets, start, min(end, now), args.step)
    wh = _open_warehouse(args.db)
    ingestor = Ingestor()
    try:
        n = wh.write(lambda con: ingestor.write_all(con, pulled.batches), timeout=None)
        for name, why in pulled.refused.items():
            wh.write(partial(record_rejected, ts=now, target=name, kind="prometheus", reasons=why))
    finally:
        wh.close()
    print(f"pulled {n} samples in {len(pulled.batches)} target-steps from {args.prometheus} into {args.db}")
    for name, why in sorted(pulled.refused.items()):
        print(f"  {name}: {reasons_text(why)}")
    return 0


# ------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    from warehouse.api import LocalQuery, QueryClient, QueryError
    from warehouse.export import DIMENSION_TABLES, FACT_TABLES, ExportError, export_parquet

    start, end = _parse_time(args.from_), _parse_time(args.to)
    tables = tuple(args.tables.split(",")) if args.tables else FACT_TABLES + DIMENSION_TABLES
    try:
        if args.lake:
            if not args.rack:
                raise CliError("export --lake needs --rack: a rack's tables, partitioned under rack=NAME/")
            with _open_lake(args) as con:
                done = export_parquet(LocalQuery(con), Path(args.out), start, end, tables, rack=args.rack)
        elif args.api:
            done = export_parquet(
                QueryClient(args.api, timeout=300), Path(args.out), start, end, tables, rack=args.rack
            )
        else:
            with _open_read_only(args.db) as con:
                done = export_parquet(LocalQuery(con), Path(args.out), start, end, tables, rack=args.rack)
    except (ExportError, QueryError) as exc:
        raise CliError(str(exc)) from exc
    for e in done:
        print(f"{e.table:16s} {e.day.isoformat() if e.day else 'all':10s} {e.rows:>12,d} rows  {e.path}")
    if not any(e.day for e in done):
        print(f"no rows between {start.isoformat()} and {end.isoformat()}")
    return 0


# --------------------------------------------------------------------------- eplb
def cmd_eplb_plan(args: argparse.Namespace) -> int:
    from moemeter.contract.eplb import PlanError, PlanInput, plan

    try:
        data = json.loads(Path(args.input).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {args.input}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise CliError(f"{args.input}: not valid JSON: {exc}") from exc
    try:
        inp = PlanInput.from_dict(data)
        started = time.perf_counter()
        result = plan(inp, args.policy)
        seconds = time.perf_counter() - started
    except PlanError as exc:
        raise CliError(f"{args.input}: {exc}") from exc
    if args.json:
        print(json.dumps({**result.to_dict(), "seconds": round(seconds, 4)}))
        return 0
    peaks = result.rank_load.max(axis=1)
    print(
        f"policy {result.policy}: {inp.weight.shape[0]} layers, {inp.weight.shape[1]} experts, "
        f"{inp.num_replicas} slots on {inp.num_gpus} GPUs ({seconds * 1000:.0f} ms)"
    )
    print("layer  max rank load  balancedness")
    for layer, (peak, bal) in enumerate(zip(peaks, result.balancedness)):
        print(f"{layer:5d}  {peak:13.1f}  {bal:12.3f}")
    return 0


def cmd_eplb_rules(args: argparse.Namespace) -> int:
    import yaml

    from warehouse.alerts import AlertRules, prometheus_rules

    text = yaml.safe_dump(prometheus_rules(AlertRules()), sort_keys=False)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def cmd_rules(args: argparse.Namespace) -> int:
    import json

    import yaml

    from collectors.targets import load_targets
    from warehouse.alerts import AlertRules
    from warehouse.prices import default_sheet, load_sheet
    from warehouse.rules import RulesError, alert_pack, file_sd, pool_costs
    from warehouse.slo import default_slo_sheet, load_slo_sheet

    targets = load_targets(args.targets) if args.targets else None
    pools = None
    if targets is not None:
        sheet = load_sheet(args.price_sheet) if args.price_sheet else default_sheet()
        pools = pool_costs(targets, sheet, datetime.now(UTC).replace(tzinfo=None))  # the prices in effect now
    else:
        print("no --targets: the $/M-token rules (they need each pool's GPUs) are left out", file=sys.stderr)
    slo_sheet = load_slo_sheet(args.slo_sheet) if args.slo_sheet else default_slo_sheet()
    now = datetime.now(UTC).replace(tzinfo=None)
    slo = slo_sheet.default_at(now)
    if slo is None:
        raise RulesError(f"SLO sheet {slo_sheet.name}: no default class is in effect now")
    text = yaml.safe_dump(alert_pack(AlertRules(), slo, pools), sort_keys=False, width=1000)
    if args.sd_out:
        if targets is None:
            raise RulesError("--sd-out needs --targets: the file_sd file lists them")
        Path(args.sd_out).write_text(json.dumps(file_sd(targets), indent=2) + "\n")
        print(f"wrote {args.sd_out}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


# ----------------------------------------------------------------------------- up
def cmd_localstack(args: argparse.Namespace) -> int:
    """Real vLLM on CPU: prefill + decode (NIXL), vllm-router, the gateway, traffic through it; Ctrl-C stops it."""
    from stack.localstack import ENGINES, MAX_RESTARTS, LocalCpuStack, StackError, drive_traffic, last_error
    from stack.twin.server import write_targets

    stack = LocalCpuStack(Path(args.workdir), args.base_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        print(f"localstack: starting vLLM prefill + decode (NIXL) and vllm-router; logs in {args.workdir}", flush=True)
        stack.start()
        if args.targets_out:
            write_targets(stack.targets(), Path(args.targets_out))
        gateway = f"http://127.0.0.1:{stack.ports['gateway']}"
        print(
            f"localstack: ready; OpenAI API at the gateway {gateway} -> vllm-router "
            f"http://127.0.0.1:{stack.ports['router']}",
            flush=True,
        )
        if args.traffic_sessions:
            threading.Thread(target=drive_traffic, args=(gateway, stop, args.traffic_sessions), daemon=True).start()
        restarts: dict[str, int] = {}
        while not stop.wait(1.0):
            for name, c in list(stack.children.items()):
                if c.poll() is None or restarts.get(name, 0) > MAX_RESTARTS:
                    continue
                log_file = Path(args.workdir) / f"{name}.log"
                said = f" ({cause})" if (cause := last_error(log_file)) else ""
                if name not in ENGINES:
                    raise StackError(f"{name} exited with {c.returncode}{said}; see {log_file}")
                restarts[name] = restarts.get(name, 0) + 1
                if restarts[name] > MAX_RESTARTS:
                    print(
                        f"localstack: {name} exited with {c.returncode}{said} after {MAX_RESTARTS} restarts; "
                        f"leaving it down (the rest keeps serving); see {log_file}",
                        flush=True,
                    )
                    continue
                print(
                    f"localstack: {name} exited with {c.returncode}{said}; the gateway, the router and the other "
                    f"engine keep serving; restarting it ({restarts[name]}/{MAX_RESTARTS})",
                    flush=True,
                )
                try:
                    stack.restart(name, stop)
                except StackError as exc:
                    print(f"localstack: {name} did not come back: {exc}", flush=True)
                    continue
                if not stop.is_set():
                    print(f"localstack: {name} is serving again", flush=True)
    except StackError as exc:
        raise CliError(str(exc)) from exc
    finally:
        stop.set()
        stack.stop()
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    """Print a GPU rack profile's launch commands (and write its targets file)."""
    from stack.launch import commands, load, targets
    from stack.twin.server import write_targets

    profile = load(args.profile)
    launches = commands(profile)
    print(f"# {args.profile}: image {profile['image']}; run each command on its tray")
    for launch in launches:
        print(launch.shell())
    if args.targets_out:
        write_targets(targets(profile), Path(args.targets_out))
        print(f"# targets for `moemeter serve`: {args.targets_out}")
    return 0


def stack_files(workdir: Path, stack: str) -> tuple[Path, Path]:
    """The targets file and the default database of a stack under `moemeter up`: each stack its
    own, so `make run` then `make run-vllm` never mix targets, history or pool sizes."""
    if stack == "twin":  # where the twin's history has always been
        return workdir / "targets.json", workdir / DEFAULT_DB
    return workdir / f"targets-{stack}.json", workdir / f"moemeter-{stack}.duckdb"


def cmd_up(args: argparse.Namespace) -> int:
    """twin (or the local CPU stack) + serve + dashboard as child processes; Ctrl-C stops all."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    targets, default_db = stack_files(workdir, args.stack)
    targets.unlink(missing_ok=True)
    db = args.db or str(default_db)
    me = [sys.executable, "-m", "moemeter"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    api = f"http://127.0.0.1:{args.api_port}"
    children: list[subprocess.Popen[bytes]] = []
    names: dict[int, str] = {}  # pid -> "twin --profile", "serve --targets", ...

    def start(cmd: list[str]) -> None:
        children.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        names[children[-1].pid] = " ".join(cmd[2:4])

    if args.stack == "local-cpu":
        start(
            [
                *me,
                "localstack",
                "--workdir",
                str(workdir / "local-cpu"),
                "--targets-out",
                str(targets),
                "--base-port",
                str(args.base_port),
            ]
        )
    else:
        start([*me, "twin", "--profile", args.profile, "--seed", str(args.seed), "--targets-out", str(targets)])
    start(
        [
            *me,
            "serve",
            "--targets",
            str(targets),
            "--db",
            db,
            "--api-port",
            str(args.api_port),
            "--interval",
            str(args.interval),
            "--wait-targets",
            "600",
        ]
    )
    start([*me, "dashboard", "--api", api, "--port", str(args.port), "--host", args.host])
    url = f"http://{args.host}:{args.port}"
    print(f"moemeter up: dashboard {url}  (query API {api}, database {db}); Ctrl-C stops everything", flush=True)
    code = 0
    # `kill` stops the children too, like Ctrl-C; SIGINT explicitly, as a shell's background job
    # starts with it ignored (then Python raises no KeyboardInterrupt and `kill -INT` did nothing).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        while True:
            for c in children:
                if c.poll() is not None:
                    print(f"moemeter up: {names[c.pid]} exited with {c.returncode}; stopping", flush=True)
                    code = c.returncode or 1
                    raise KeyboardInterrupt
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        _stop_children(children)
    print("moemeter up: stopped", flush=True)
    return code


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


STOP_SECONDS = 8.0  # a child still running this long after SIGTERM gets SIGKILL


def _stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for c in children:
        if c.poll() is None:
            os.killpg(c.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    for c in children:
        try:
            c.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(c.pid, signal.SIGKILL)
            c.wait()


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()


def _api_token(args: argparse.Namespace) -> str | None:
    """The query API token: --api-token-file, else MOEMETER_API_TOKEN; never from the command line."""
    from warehouse.api import MIN_TOKEN_CHARS, TOKEN_ENV

    if args.api_token_file:
        try:
            token, where = Path(args.api_token_file).read_text().strip(), "--api-token-file"
        except OSError as exc:
            raise CliError(f"cannot read --api-token-file: {exc}") from exc
    else:
        token, where = os.environ.get(TOKEN_ENV, "").strip(), TOKEN_ENV
        if not token:
            return None
    if len(token) < MIN_TOKEN_CHARS:
        raise CliError(
            f"{where} holds fewer than {MIN_TOKEN_CHARS} characters: use a long random token "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def _open_warehouse(  # type: ignore[no-untyped-def]
    db: str,
    serve_read_only: bool = False,
    memory_limit: str | None = None,
    checkpoint_threshold: str | None = None,
    threads: int | None = None,
):
    """The read-write warehouse on `db`, or a CliError saying why it cannot be opened. With
    `serve_read_only`, an existing file that cannot be written opens read-only instead, so the
    query API keeps serving what it holds."""
    from warehouse.db import Warehouse, WarehouseError, storage_problem

    try:
        return Warehouse(db, memory_limit=memory_limit, checkpoint_threshold=checkpoint_threshold, threads=threads)
    except WarehouseError as exc:
        if not (serve_read_only and storage_problem(exc) == "read-only" and Path(db).is_file()):
            raise CliError(str(exc)) from exc
        log.error(
            "%s: serving its queries read-only, NOT collecting; fix the file system or permissions "
            "and restart to collect again",
            exc,
        )
        try:
            return Warehouse(db, read_only=str(exc), memory_limit=memory_limit)
        except WarehouseError as again:
            raise CliError(str(again)) from again


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


# ---------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    from stack.gateway.app import MAX_IN_FLIGHT
    from warehouse.limits import MAX_CONCURRENT, QUEUE_SECONDS, Limits

    p = argparse.ArgumentParser(
        prog="moemeter", description="Observability and cost accounting for PD-disaggregated, wide-EP vLLM MoE serving."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("up", help="start twin, collectors/warehouse and dashboard; Ctrl-C stops all")
    s.add_argument("--profile", default="deepseek-v4.1-flash", help="twin profile name or TOML path")
    s.add_argument("--seed", type=int, default=0, help="twin random seed")
    s.add_argument(
        "--db",
        help="DuckDB file (default: the stack's own in the work directory: moemeter.duckdb for "
        "the twin, moemeter-local-cpu.duckdb for the local CPU stack)",
    )
    s.add_argument(
        "--workdir",
        default=".moemeter",
        help="where the targets file and the database go; the database "
        "is kept between runs, so history survives a restart",
    )
    s.add_argument("--port", type=int, default=DEFAULT_DASHBOARD_PORT, help="dashboard port")
    s.add_argument("--host", default="127.0.0.1", help="dashboard address")
    s.add_argument("--api-port", type=int, default=DEFAULT_API_PORT, help="query API port")
    s.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="scrape interval, seconds")
    s.add_argument(
        "--stack",
        choices=("twin", "local-cpu"),
        default="twin",
        help="what to observe: the rack twin, "
        "or real vLLM on this CPU (make vllm-env router-env first; `make run-vllm` does it all)",
    )
    s.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_LOCAL_BASE_PORT,
        help="local CPU stack: the router's port; vLLM, the gateway and the router's metrics on the next nine",
    )
    s.set_defaults(func=cmd_up)

    s = sub.add_parser("launch", help="print a GPU rack profile's vLLM and vllm-router commands")
    s.add_argument("profile", help="profile directory name in stack/profiles, e.g. gb300-nvl72")
    s.add_argument("--targets-out", help="also write the targets file the collectors need")
    s.set_defaults(func=cmd_launch)

    s = sub.add_parser("localstack", help="real vLLM on CPU: prefill + decode with NIXL, vllm-router, the plugin")
    s.add_argument("--workdir", default=".moemeter/local-cpu", help="model directory and logs go here")
    s.add_argument("--targets-out", help="write the targets file here once every part answers")
    s.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_LOCAL_BASE_PORT,
        help="router port; vLLM on +1 and +2, the gateway on +3, router metrics +9",
    )
    s.add_argument(
        "--traffic-sessions",
        type=int,
        default=2,
        help="load-generator sessions in flight through the gateway (0: none)",
    )
    s.set_defaults(func=cmd_localstack)

    s = sub.add_parser("twin", help="serve the simulated GB300 NVL72 rack's metrics endpoints")
    s.add_argument("--profile", default="deepseek-v4.1-flash", help="profile name (stack/twin/profiles) or TOML path")
    s.add_argument("--seed", type=int, default=0, help="random seed (same seed and start, same numbers)")
    s.add_argument("--targets-out", help="write the targets file the twin serves here")
    s.add_argument("--host", default="127.0.0.1", help="address to bind")
    s.add_argument("--base-port", type=int, default=0, help="first port (default: free ports)")
    s.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND:INSTANCE[:ENGINE]",
        help="carry a named fault (repeatable): straggler, nixl-failures or kv-saturated, on a decode "
        "instance or one of its engines, e.g. straggler:decode-0:7 (stack/twin/faults.py)",
    )
    s.add_argument(
        "--openai-port",
        type=int,
        help="also serve a simulated OpenAI-compatible API here (for "
        "`moemeter gateway --upstream` and `moemeter loadgen`)",
    )
    s.add_argument(
        "--fast-forward",
        metavar="DURATION",
        help="instead of serving, write DURATION (e.g. 24h) of history ending now into --db through the ingest path",
    )
    s.add_argument("--db", help="DuckDB file for --fast-forward")
    s.add_argument("--memory-limit", metavar="SIZE", help=MEMORY_HELP)
    s.add_argument(
        "--interval", type=float, default=DEFAULT_INTERVAL, help="scrape interval for --fast-forward, seconds"
    )
    s.add_argument(
        "--tick",
        type=float,
        default=1.0,
        help="simulation step for --fast-forward, seconds (serving "
        "uses 0.1 s; 1 s runs ~4x faster and gives ~3%% fewer tokens)",
    )
    s.set_defaults(func=cmd_twin)

    s = sub.add_parser("serve", help="run the collectors, the warehouse writer and the query API")
    s.add_argument("--targets", required=True, help="targets file (JSON list of name, url, role, gpus)")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file")
    s.add_argument("--interval", type=float, default=DEFAULT_INTERVAL, help="scrape interval, seconds")
    s.add_argument(
        "--api-host",
        default="127.0.0.1",
        help="query API address; beyond loopback it requires a token (MOEMETER_API_TOKEN or --api-token-file)",
    )
    s.add_argument("--api-token-file", help="file holding the query API's token (else MOEMETER_API_TOKEN)")
    s.add_argument("--api-port", type=int, default=DEFAULT_API_PORT, help="query API port")
    s.add_argument("--wait-targets", type=float, default=0.0, help="wait this long for the targets file to appear")
    s.add_argument(
        "--prometheus",
        metavar="URL",
        help="read the targets' series from this Prometheus-compatible API (query_range) instead of scraping them",
    )
    s.add_argument("--keep-raw-days", type=float, default=2.0, help="days raw samples are kept (then minute rollups)")
    s.add_argument("--keep-minute-days", type=float, default=30.0, help="days per-minute rollups are kept")
    s.add_argument("--keep-hour-days", type=float, default=365.0, help="days per-hour rollups are kept")
    s.add_argument("--memory-limit", metavar="SIZE", help=MEMORY_HELP)
    s.add_argument(
        "--query-timeout",
        type=float,
        default=Limits.timeout_seconds,
        metavar="SECONDS",
        help="stop a query API statement on the server after this long (504)",
    )
    s.add_argument(
        "--query-max-rows",
        type=int,
        default=Limits.max_result_rows,
        metavar="N",
        help="refuse a result of more rows (413)",
    )
    s.add_argument(
        "--query-max-mb",
        type=float,
        default=Limits.max_result_bytes / 2**20,
        metavar="MIB",
        help="refuse a result of more MiB (413)",
    )
    s.add_argument(
        "--query-concurrency",
        type=int,
        default=MAX_CONCURRENT,
        metavar="N",
        help=f"statements run at once; more wait up to {QUEUE_SECONDS:g} s, then get 503 with Retry-After",
    )
    s.add_argument("--lake", metavar="CATALOG", help="also publish what closes to this DuckLake (" + LAKE_HELP + ")")
    s.add_argument("--lake-data", metavar="PATH", help=LAKE_DATA_HELP)
    s.add_argument("--rack", help="the name this rack publishes under (default: the host's name)")
    s.add_argument(
        "--publish-every", type=float, default=60.0, metavar="SECONDS", help="publish to the lake this often"
    )
    s.add_argument("--chunk-minutes", type=float, default=60.0, help=CHUNK_HELP)
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("publish", help="publish what a warehouse file holds to a DuckLake, as serve --lake does")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
    s.add_argument("--lake", required=True, metavar="CATALOG", help=LAKE_HELP)
    s.add_argument("--lake-data", metavar="PATH", help=LAKE_DATA_HELP)
    s.add_argument("--rack", help="the name this rack publishes under (default: the host's name)")
    s.add_argument("--chunk-minutes", type=float, default=60.0, help=CHUNK_HELP)
    s.set_defaults(func=cmd_publish)

    s = sub.add_parser("lake", help="the fleet's DuckLake, as its owner: its guard, its racks' roles, its files")
    lk = s.add_subparsers(dest="lake_command", required=True, metavar="LAKE_COMMAND")
    s = lk.add_parser("setup", help="create the lake's tables, install its guard, grant moemeter_publisher")
    s.set_defaults(func=cmd_lake_setup)
    s.add_argument("--lake-data", metavar="PATH", help=LAKE_DATA_HELP)
    s = lk.add_parser("owners", help="each rack and the PostgreSQL role that may publish it")
    s.set_defaults(func=cmd_lake_owners, lake_data=None)
    s = lk.add_parser("assign", help="give a rack to a role (the lake's owner only)")
    s.add_argument("rack", help="the rack's name")
    s.add_argument("role", help="the PostgreSQL role its publisher logs in as")
    s.set_defaults(func=cmd_lake_assign, lake_data=None)
    s = lk.add_parser("tidy", help="merge and rewrite every rack's files, expire old snapshots (the owner only)")
    s.set_defaults(func=cmd_lake_tidy, lake_data=None)
    for s in lk.choices.values():
        s.add_argument("--lake", required=True, metavar="CATALOG", help=LAKE_HELP)

    s = sub.add_parser("gateway", help="the metering gateway: OpenAI-compatible, in front of vllm-router")
    s.add_argument("--upstream", help="where requests go: vllm-router, one vLLM server, any OpenAI-compatible URL")
    s.add_argument("--port", type=int, default=8000, help="port to listen on")
    s.add_argument("--host", default="127.0.0.1", help="address to bind")
    s.add_argument(
        "--admin-port",
        type=int,
        help="serve /metrics, the request feed and /health on this port "
        "instead (required when --host is beyond loopback or the keys file requires a key)",
    )
    s.add_argument("--admin-host", default="127.0.0.1", help="address for --admin-port")
    s.add_argument("--keys", help='API keys file: {"require_key": bool, "keys": [{"sha256", "tenant"}]}')
    s.add_argument("--hash-key", action="store_true", help="read an API key on stdin, print its keys-file entry")
    s.add_argument("--records", default="moemeter-gateway.sqlite", help="durable request log (the collectors' feed)")
    s.add_argument("--keep-days", type=float, default=7.0, help="days request records stay in the log")
    s.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take upstream")
    s.add_argument(
        "--max-user-labels",
        type=int,
        default=50,
        help='users with their own /metrics label; the rest are counted as user="other" (the feed has everyone)',
    )
    s.add_argument(
        "--max-in-flight",
        type=int,
        default=MAX_IN_FLIGHT,
        metavar="N",
        help="requests served at once; more get 429 with Retry-After (recorded as 'overloaded')",
    )
    s.set_defaults(func=cmd_gateway)

    s = sub.add_parser("loadgen", help="AgentX-like agent sessions from many users, through the gateway")
    s.add_argument("--url", required=True, help="the gateway (or any OpenAI-compatible server)")
    s.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    s.add_argument("--seed", type=int, default=0, help="same seed, same sessions")
    s.add_argument(
        "--concurrency", type=int, default=8, help="sessions in flight (closed loop), or the cap with --rate"
    )
    s.add_argument("--rate", type=float, help="new sessions per second (open loop) instead of a closed loop")
    s.add_argument("--duration", help="stop starting turns after this long (e.g. 10m); default: run every session")
    s.add_argument("--stream-share", type=float, default=0.9, help="share of requests that stream")
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
    s.set_defaults(func=cmd_loadgen)

    s = sub.add_parser("dashboard", help="run the Streamlit dashboard")
    s.add_argument("--api", default=f"http://127.0.0.1:{DEFAULT_API_PORT}", help="query API URL")
    s.add_argument("--port", type=int, default=DEFAULT_DASHBOARD_PORT, help="port")
    s.add_argument("--host", default="127.0.0.1", help="address")
    s.add_argument(
        "--require-login",
        action="store_true",
        help="sign-in with Streamlit's OIDC login, configured "
        "under [auth] in .streamlit/secrets.toml (README, Security)",
    )
    _lake_reading(s, rack=False)
    s.set_defaults(func=cmd_dashboard, rack=None)

    s = sub.add_parser("ingest", help="load one exposition snapshot file offline")
    s.add_argument("--file", required=True, help="Prometheus text or OpenMetrics page")
    s.add_argument("--target", required=True, help="target name to file it under")
    s.add_argument("--at", required=True, help="scrape time, ISO 8601 (UTC if no offset)")
    s.add_argument("--db", required=True, help="DuckDB file")
    s.add_argument("--role", default="decode", help="target role: prefill, decode, router, gateway or gpu")
    s.add_argument("--gpus", type=int, default=0, help="GPUs the target holds")
    s.add_argument("--stack", default="offline", help="what is observed")
    s.add_argument("--openmetrics", action="store_true", help="the file is OpenMetrics")
    s.set_defaults(func=cmd_ingest)

    s = sub.add_parser("eplb", help="EPLB tools: plan an expert placement from observed load")
    eplb = s.add_subparsers(dest="eplb_command", required=True, metavar="EPLB_COMMAND")
    s = eplb.add_parser("plan", help="place logical experts into physical slots (vllm or refined policy)")
    s.add_argument(
        "--input",
        required=True,
        help='JSON: {"weight": [[load per logical expert] per layer], '
        '"num_replicas", "num_groups", "num_nodes", "num_gpus"}',
    )
    s.add_argument("--policy", choices=["vllm", "refined"], default="vllm", help="placement policy")
    s.add_argument("--json", action="store_true", help="print phy2log, rank_load and balancedness as JSON")
    s.set_defaults(func=cmd_eplb_plan)
    s = eplb.add_parser("rules", help="print the EPLB hot-spot alerts as a Prometheus alerting-rules file")
    s.add_argument("--out", help="write to this file instead of stdout")
    s.set_defaults(func=cmd_eplb_rules)

    s = sub.add_parser(
        "rules", help="the alert pack: SLO burn, NIXL, KV cache, preemptions, stragglers, targets, idle, $/M, EPLB"
    )
    s.add_argument("--targets", help="targets file: each pool's GPUs, for the $/M-token rules (else left out)")
    s.add_argument("--price-sheet", help="TOML price sheet (default: warehouse/price_sheets/default.toml)")
    s.add_argument(
        "--slo-sheet",
        help="TOML SLO sheet: its default class sets the burn-rate objectives (default: warehouse/slo_sheets/default.toml)",
    )
    s.add_argument("--out", help="write the rules file here instead of stdout")
    s.add_argument(
        "--sd-out", help="also write a Prometheus file_sd file of the targets, with the labels the rules read"
    )
    s.set_defaults(func=cmd_rules)

    s = sub.add_parser("pull", help="backfill from a Prometheus-compatible HTTP API (query_range)")
    s.add_argument(
        "--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090 (Thanos, Mimir, VM work too)"
    )
    s.add_argument("--targets", required=True, help="targets file; series map to targets by their instance label")
    s.add_argument("--from", dest="from_", required=True, help="start, ISO 8601")
    s.add_argument("--to", required=True, help="end, ISO 8601")
    s.add_argument("--step", type=float, default=5.0, help="evaluation step, seconds (the scrape interval)")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file")
    s.set_defaults(func=cmd_pull)

    s = sub.add_parser("export", help="export the warehouse to Parquet, partitioned by day")
    s.add_argument("--out", required=True, help="directory; files go to <out>/<table>/day=YYYY-MM-DD/part-0.parquet")
    s.add_argument("--from", dest="from_", required=True, help="start, ISO 8601 (UTC if no offset)")
    s.add_argument("--to", required=True, help="end (exclusive), ISO 8601")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
    s.add_argument("--api", help="query API URL instead of the file (while `serve` holds it)")
    s.add_argument("--tables", help="comma-separated tables (default: all)")
    s.add_argument(
        "--rack", help="partition under rack=NAME/ too, so several racks export into one dataset; with --lake: the rack"
    )
    _lake_reading(s, rack=False)
    s.set_defaults(func=cmd_export)

    s = sub.add_parser(
        "report", help="reports: $/M tokens by pool, per user, per day; SLO attainment, goodput and $/M good tokens"
    )
    rep = s.add_subparsers(dest="report_command", required=True, metavar="REPORT")
    for name, func, what in (
        (
            "cost",
            cmd_report_cost,
            "GPU-hours, cost, $/M input/output/blended tokens, idle cost, revenue, per-user allocation over a window",
        ),
        (
            "daily",
            cmd_report_daily,
            "the daily statement: GPUs in service, GPU-hours, cost, "
            "input tokens and cache-hit share, output tokens, revenue, margin",
        ),
        (
            "slo",
            cmd_report_slo,
            "per SLO class (or tenant): requests, met, attainment, goodput, $/M good tokens, error budget left, burn rates",
        ),
    ):
        s = rep.add_parser(name, help=what)
        if name == "slo":
            s.add_argument(
                "--targets", help="targets file: roles and GPUs of the pools (default: the targets the warehouse saw)"
            )
            s.add_argument("--by", choices=("class", "tenant"), default="class", help="a row per class, or per tenant")
        elif name == "cost":
            s.add_argument(
                "--targets",
                help="targets file: roles and GPUs of the pools (with --lake: the ones each rack published)",
            )
            _lake_reading(s)
        else:
            s.add_argument("--targets", required=True, help="targets file: roles and GPUs of the pools")
        s.add_argument("--from", dest="from_", required=True, help="start, ISO 8601 (UTC if no offset)")
        s.add_argument("--to", required=True, help="end (exclusive), ISO 8601")
        s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
        s.add_argument("--api", help="query API URL instead of the file (while `serve` holds it)")
        s.add_argument(
            "--price-sheet",
            help="TOML price sheet (default: the sheets loaded into the warehouse, "
            "else warehouse/price_sheets/default.toml: $38.96/GPU-hour)",
        )
        fmt = s.add_mutually_exclusive_group()
        fmt.add_argument("--json", action="store_true", help="print JSON")
        fmt.add_argument("--csv", action="store_true", help="print CSV")
        if name == "daily":
            s.add_argument("--parquet", help="also write the statement to this Parquet file")
        s.set_defaults(func=func)

    s = sub.add_parser("prices", help="price sheets: load a new version into the warehouse")
    pr = s.add_subparsers(dest="prices_command", required=True, metavar="PRICES_COMMAND")
    s = pr.add_parser("load", help="add a price sheet's entries (never changes a stored price)")
    s.add_argument("file", help="TOML price sheet")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (needs the writer: stop `serve` first)")
    s.set_defaults(func=cmd_prices_load)

    s = sub.add_parser("slo", help="SLO sheets: load a new version of the classes and assignments")
    sl = s.add_subparsers(dest="slo_command", required=True, metavar="SLO_COMMAND")
    s = sl.add_parser("load", help="add an SLO sheet's entries (never changes a stored target or assignment)")
    s.add_argument("file", help="TOML SLO sheet (warehouse/slo_sheets/default.toml shows the form)")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (needs the writer: stop `serve` first)")
    s.set_defaults(func=cmd_slo_load)

    s = sub.add_parser("query", help="run one SELECT on the warehouse and print it")
    s.add_argument("sql", help="a single SELECT statement")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
    s.add_argument("--api", help="query API URL instead of the file (while `serve` holds it)")
    s.add_argument("--json", action="store_true", help="print JSON records")
    s.add_argument("--max-rows", type=int, default=200, help="rows to print in table form")
    _lake_reading(s)
    s.set_defaults(func=cmd_query)
    return p


LAKE_HELP = "its catalog, e.g. 'postgres:dbname=lake host=/run/postgresql user=moemeter'"
CHUNK_HELP = "the most minutes one lake transaction publishes (a backlog goes in steps of this)"
LAKE_DATA_HELP = "where the lake's Parquet files go (a directory or s3://...); needed when the lake is new"


def _lake_reading(s: argparse.ArgumentParser, rack: bool = True) -> None:
    s.add_argument("--lake", metavar="CATALOG", help="read the fleet's DuckLake instead (" + LAKE_HELP + ")")
    s.add_argument("--lake-data", metavar="PATH", help="the lake's data path (default: the one its catalog holds)")
    if rack:
        s.add_argument("--rack", help="with --lake: one rack, under the warehouse's table names (else lake.<table>)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except MoemeterError as exc:
        print(f"moemeter {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
