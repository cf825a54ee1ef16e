"""`moemeter serve`: the collectors, the one warehouse writer and the query API (and with --lake,
publishing to the fleet's DuckLake)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

from moemeter.contract import DEFAULT_INTERVAL

from .common import (
    AT_LEAST_ONE,
    DAYS,
    DEFAULT_API_PORT,
    DEFAULT_DB,
    LAKE_DATA_HELP,
    LAKE_HELP,
    PORT,
    SECONDS,
    CliError,
    Command,
    Commands,
    Row,
    chunk_minutes,
    memory_help,
    number,
    open_warehouse,
    rack_name,
)

commands = Commands()


def _serve_options(s: Command) -> None:
    from warehouse.lake import PUBLISH_EVERY
    from warehouse.limits import MAX_CONCURRENT, QUEUE_SECONDS, Limits
    from warehouse.rollup import Retention

    s.add_argument("--targets", required=True, help="targets file (JSON list of name, url, role, gpus)")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file")
    s.add_argument("--interval", type=SECONDS, default=DEFAULT_INTERVAL, help="scrape interval, seconds")
    s.add_argument(
        "--api-host",
        default="127.0.0.1",
        help="query API address; beyond loopback it requires a token (MOEMETER_API_TOKEN or --api-token-file)",
    )
    s.add_argument("--api-token-file", help="file holding the query API's token (else MOEMETER_API_TOKEN)")
    s.add_argument("--api-port", type=PORT, default=DEFAULT_API_PORT, help="query API port")
    s.add_argument(
        "--wait-targets",
        type=number(0, 7 * 86400, "seconds"),
        default=0.0,
        help="wait this long for the targets file to appear",
    )
    s.add_argument(
        "--prometheus",
        metavar="URL",
        help="read the targets' series from this Prometheus-compatible API (query_range) instead of scraping them",
    )
    s.add_argument(
        "--keep-raw-days",
        type=DAYS,
        default=Retention.raw_days,
        help="days raw samples are kept (then minute rollups)",
    )
    s.add_argument(
        "--keep-minute-days", type=DAYS, default=Retention.minute_days, help="days per-minute rollups are kept"
    )
    s.add_argument("--keep-hour-days", type=DAYS, default=Retention.hour_days, help="days per-hour rollups are kept")
    s.add_argument("--memory-limit", metavar="SIZE", help=memory_help("serve"))
    s.add_argument(
        "--query-timeout",
        type=SECONDS,
        default=Limits.timeout_seconds,
        metavar="SECONDS",
        help="stop a query API statement on the server after this long (504)",
    )
    s.add_argument(
        "--query-max-rows",
        type=AT_LEAST_ONE,
        default=Limits.max_result_rows,
        metavar="N",
        help="refuse a result of more rows (413)",
    )
    s.add_argument(
        "--query-max-mb",
        type=number(0.001, 2**20, "MiB"),
        default=Limits.max_result_bytes / 2**20,
        metavar="MIB",
        help="refuse a result of more MiB (413)",
    )
    s.add_argument(
        "--query-concurrency",
        type=AT_LEAST_ONE,
        default=MAX_CONCURRENT,
        metavar="N",
        help=f"statements run at once; more wait up to {QUEUE_SECONDS:g} s, then get 503 with Retry-After",
    )
    s.add_argument("--lake", metavar="CATALOG", help="also publish what closes to this DuckLake (" + LAKE_HELP + ")")
    s.add_argument("--lake-data", metavar="PATH", help=LAKE_DATA_HELP)
    s.add_argument("--rack", help="the name this rack publishes under (default: the host's name)")
    s.add_argument(
        "--publish-every", type=SECONDS, default=PUBLISH_EVERY, metavar="SECONDS", help="publish to the lake this often"
    )
    chunk_minutes(s)


@commands.command(
    "serve",
    _serve_options,
    help="run the collectors, the warehouse writer and the query API",
    rows=[
        Row(
            "moemeter serve --targets FILE --db F [--prometheus URL] [--lake CATALOG --lake-data PATH --rack NAME]",
            "collectors (scraping, or reading a Prometheus-compatible API) + the one warehouse writer + "
            f"read-only query API (loopback :{DEFAULT_API_PORT}); with `--lake`, also publishes what has "
            'closed to the fleet\'s DuckLake (docs/operations.md, "A fleet on DuckLake")',
        ),
    ],
)
def cmd_serve(args: argparse.Namespace) -> int:
    from collectors.service import Collector
    from collectors.targets import load_targets
    from warehouse.api import TOKEN_ENV, QueryServer, is_loopback
    from warehouse.limits import Limits, share_heaps

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
    limits = Limits(
        timeout_seconds=args.query_timeout,
        max_result_rows=args.query_max_rows,
        max_result_bytes=int(args.query_max_mb * 2**20),
    )
    share_heaps()  # before DuckDB, the writer and the query API start their threads
    wh = open_warehouse(args.db, serve_read_only=True, memory_limit=args.memory_limit, kind="serve")
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
        loop = PublishLoop(wh.cursor, args.lake, args.lake_data, rack_name(args), args.publish_every, chunk)
    except LakeError as exc:
        raise CliError(str(exc)) from exc
    loop.start()
    api.lake = loop.health.as_json
    print(f"publishing rack {loop.rack} to the lake {args.lake} every {args.publish_every:g}s", flush=True)
    return loop


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
