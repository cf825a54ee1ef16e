"""`moemeter twin`: the simulated rack, serving its endpoints or writing history (--fast-forward)."""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from moemeter.contract import DEFAULT_INTERVAL

from .common import PORT, SECONDS, SEED, CliError, Command, Commands, Row, memory_help, open_warehouse, parse_duration

if TYPE_CHECKING:
    from stack.twin.faults import Fault

commands = Commands()


def _twin_options(s: Command) -> None:
    from stack.twin.config import DEFAULT_PROFILE
    from stack.twin.model import TICK_SECONDS

    s.add_argument("--profile", default=DEFAULT_PROFILE, help="profile name (stack/twin/profiles) or TOML path")
    s.add_argument("--seed", type=SEED, default=0, help="random seed (same seed and start, same numbers)")
    s.add_argument("--targets-out", help="write the targets file the twin serves here")
    s.add_argument("--host", default="127.0.0.1", help="address to bind")
    s.add_argument("--base-port", type=PORT, default=0, help="first port (default: free ports)")
    s.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND:INSTANCE[:ENGINE]",
        help="carry a named fault (repeatable): straggler, nixl-failures, kv-saturated or draft-collapse, on a decode "
        "instance or one of its engines, e.g. straggler:decode-0:7 (stack/twin/faults.py)",
    )
    s.add_argument(
        "--openai-port",
        type=PORT,
        help="also serve a simulated OpenAI-compatible API here (for "
        "`moemeter gateway --upstream` and `moemeter loadgen`)",
    )
    s.add_argument(
        "--fast-forward",
        metavar="DURATION",
        help="instead of serving, write DURATION (e.g. 24h) of history ending now into --db through the ingest path",
    )
    s.add_argument("--db", help="DuckDB file for --fast-forward")
    s.add_argument("--memory-limit", metavar="SIZE", help=memory_help("fast-forward"))
    s.add_argument(
        "--interval", type=SECONDS, default=DEFAULT_INTERVAL, help="scrape interval for --fast-forward, seconds"
    )
    s.add_argument(
        "--tick",
        type=SECONDS,
        default=1.0,
        help="simulation step for --fast-forward, seconds (serving "
        f"uses {TICK_SECONDS:g} s; 1 s runs ~4x faster and gives ~3%% fewer tokens)",
    )


@commands.command(
    "twin",
    _twin_options,
    help="serve the simulated GB300 NVL72 rack's metrics endpoints",
    rows=[
        Row(
            "moemeter twin [--profile NAME] [--seed N] [--targets-out FILE]",
            "serve the rack twin and write its targets file",
        ),
        Row(
            "moemeter twin --fast-forward 24h --db F",
            "write a day of twin history through the real ingest path",
        ),
        Row(
            "moemeter twin --openai-port N",
            "also serve a simulated OpenAI API, as an upstream for the gateway and the load generator",
        ),
        Row(
            "moemeter twin --fault KIND:INSTANCE[:ENGINE]",
            "the twin with a named fault on a decode instance or engine: `straggler` (its KV reads crawl, "
            "its queue grows), `nixl-failures` (5% of its KV transfers fail and are read again), "
            "`kv-saturated` (its KV cache runs full and it preempts), `draft-collapse` (its drafts are "
            "rejected: acceptance length falls, its queue does not grow); repeatable (`stack/twin/faults.py`)",
        ),
    ],
)
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
        if args.base_port + len(twin.ports) - 1 > 65535:
            raise CliError(f"--base-port {args.base_port}: the twin's {len(twin.ports)} ports must end by 65535")
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
    records come as columns (moemeter.contract.requests.ColumnPage), read with the same checks as a
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
    seconds = parse_duration(args.fast_forward)
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    start = end - timedelta(seconds=seconds)
    if not 0.01 <= args.tick <= args.interval:
        raise CliError(f"--tick must be between 0.01 s and the interval ({args.interval:g} s)")
    if seconds < args.interval:
        raise CliError(f"--fast-forward {args.fast_forward} is shorter than one --interval ({args.interval:g} s)")
    wh = open_warehouse(
        args.db,
        memory_limit=args.memory_limit,
        checkpoint_threshold=FAST_FORWARD_CHECKPOINT,
        threads=FAST_FORWARD_THREADS,
        kind="fast-forward",
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


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
