"""Data into and out of the warehouse: `moemeter ingest` (a page from a file), `pull` (a backfill
from Prometheus), `query` (one SELECT) and `export` (Parquet)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from moemeter.contract import DEFAULT_INTERVAL, ROLES
from moemeter.contract.clock import latest_allowed, utc_now

from .common import (
    COUNT,
    DEFAULT_DB,
    SECONDS,
    CliError,
    Command,
    Commands,
    Row,
    lake_reading,
    number,
    open_lake,
    open_read_only,
    open_warehouse,
    parse_time,
)

commands = Commands()


# ------------------------------------------------------------------------- ingest
def _ingest_options(s: Command) -> None:
    s.add_argument("--file", required=True, help="Prometheus text or OpenMetrics page")
    s.add_argument("--target", required=True, help="target name to file it under")
    s.add_argument("--at", required=True, help="scrape time, ISO 8601 (UTC if no offset)")
    s.add_argument("--db", required=True, help="DuckDB file")
    s.add_argument("--role", default="decode", help=f"target role: {', '.join(ROLES[:-1])} or {ROLES[-1]}")
    s.add_argument("--gpus", type=number(0, 1_000_000, "GPUs", whole=True), default=0, help="GPUs the target holds")
    s.add_argument("--stack", default="offline", help="what is observed")
    s.add_argument("--openmetrics", action="store_true", help="the file is OpenMetrics")


@commands.command(
    "ingest",
    _ingest_options,
    help="load one exposition snapshot file offline",
    rows=[
        Row(
            "moemeter ingest --file F --target NAME --at ISO8601 --db F",
            "load one exposition snapshot offline",
        ),
    ],
)
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
    at = parse_time(args.at)
    if at > latest_allowed(now := utc_now()):
        raise CliError(f"--at {at:%Y-%m-%d %H:%M:%S} is after this host's clock ({now:%Y-%m-%d %H:%M:%S} UTC)")
    target = TargetInfo(args.target, f"file://{Path(args.file).resolve()}", args.role, args.gpus, args.stack)
    wh = open_warehouse(args.db)
    try:
        ingestor = Ingestor()
        n = wh.write(lambda con: ingestor.write(con, ScrapeBatch(target, at, True, 0.0, samples, bytes=len(body))))
    finally:
        wh.close()
    print(f"ingested {n} samples from {args.file} as {args.target} at {at.isoformat()} into {args.db}")
    return 0


# --------------------------------------------------------------------------- pull
def _pull_options(s: Command) -> None:
    s.add_argument(
        "--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090 (Thanos, Mimir, VM work too)"
    )
    s.add_argument("--targets", required=True, help="targets file; series map to targets by their instance label")
    s.add_argument("--from", dest="from_", required=True, help="start, ISO 8601")
    s.add_argument("--to", required=True, help="end, ISO 8601")
    s.add_argument(
        "--step", type=SECONDS, default=DEFAULT_INTERVAL, help="evaluation step, seconds (the scrape interval)"
    )
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file")


@commands.command(
    "pull",
    _pull_options,
    help="backfill from a Prometheus-compatible HTTP API (query_range)",
    rows=[
        Row(
            "moemeter pull --prometheus URL --targets F --from T --to T --db F",
            "backfill from Prometheus/Thanos/Mimir/VictoriaMetrics (`query_range`) through the same ingest path",
        ),
    ],
)
def cmd_pull(args: argparse.Namespace) -> int:
    """Backfill from a Prometheus-compatible API through the same ingest path as a scrape."""
    from collectors.promapi import http_get, pull_range
    from collectors.targets import load_targets
    from warehouse.db import reasons_text, record_rejected
    from warehouse.ingest import Ingestor

    targets = load_targets(args.targets)
    start, end = parse_time(args.from_), parse_time(args.to)
    if end <= start:
        raise CliError("--to must be after --from")
    if start > latest_allowed(now := utc_now()):
        raise CliError(f"--from {start:%Y-%m-%d %H:%M:%S} is after this host's clock ({now:%Y-%m-%d %H:%M:%S} UTC)")
    pulled = pull_range(http_get(args.prometheus), targets, start, min(end, now), args.step)
    wh = open_warehouse(args.db)
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


# -------------------------------------------------------------------------- query
def _query_options(s: Command) -> None:
    s.add_argument("sql", help="a single SELECT statement")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
    s.add_argument("--api", help="query API URL instead of the file (while `serve` holds it)")
    s.add_argument("--json", action="store_true", help="print JSON records")
    s.add_argument("--max-rows", type=COUNT, default=200, help="rows to print in table form")
    lake_reading(s)


@commands.command(
    "query",
    _query_options,
    help="run one SELECT on the warehouse and print it",
    rows=[
        Row(
            'moemeter query --db F "SELECT ..." [--json]',
            "print a query result (only SELECT passes)",
        ),
    ],
)
def cmd_query(args: argparse.Namespace) -> int:
    import duckdb
    import pandas as pd

    from warehouse.api import LocalQuery, QueryClient, QueryError, QueryRefused

    try:
        if args.lake:
            with open_lake(args) as con:
                df = LocalQuery(con)(args.sql)
        elif args.api:
            df = QueryClient(args.api)(args.sql)
        else:
            with open_read_only(args.db) as con:
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


# ------------------------------------------------------------------------- export
def _export_options(s: Command) -> None:
    s.add_argument("--out", required=True, help="directory; files go to <out>/<table>/day=YYYY-MM-DD/part-0.parquet")
    s.add_argument("--from", dest="from_", required=True, help="start, ISO 8601 (UTC if no offset)")
    s.add_argument("--to", required=True, help="end (exclusive), ISO 8601")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
    s.add_argument("--api", help="query API URL instead of the file (while `serve` holds it)")
    s.add_argument("--tables", help="comma-separated tables (default: all)")
    s.add_argument(
        "--rack", help="partition under rack=NAME/ too, so several racks export into one dataset; with --lake: the rack"
    )
    lake_reading(s, rack=False)


@commands.command(
    "export",
    _export_options,
    help="export the warehouse to Parquet, partitioned by day",
    rows=[
        Row(
            "moemeter export --out DIR --from T --to T [--db F | --api URL] [--rack NAME]",
            "Parquet, `<table>/[rack=NAME/]day=YYYY-MM-DD/`, readable by DuckDB or any Parquet engine",
        ),
    ],
)
def cmd_export(args: argparse.Namespace) -> int:
    from warehouse.api import LocalQuery, QueryClient, QueryError
    from warehouse.export import DIMENSION_TABLES, FACT_TABLES, ExportError, export_parquet

    start, end = parse_time(args.from_), parse_time(args.to)
    tables = tuple(args.tables.split(",")) if args.tables else FACT_TABLES + DIMENSION_TABLES
    try:
        if args.lake:
            if not args.rack:
                raise CliError("export --lake needs --rack: a rack's tables, partitioned under rack=NAME/")
            with open_lake(args) as con:
                done = export_parquet(LocalQuery(con), Path(args.out), start, end, tables, rack=args.rack)
        elif args.api:
            done = export_parquet(
                QueryClient(args.api, timeout=300), Path(args.out), start, end, tables, rack=args.rack
            )
        else:
            with open_read_only(args.db) as con:
                done = export_parquet(LocalQuery(con), Path(args.out), start, end, tables, rack=args.rack)
    except (ExportError, QueryError) as exc:
        raise CliError(str(exc)) from exc
    for e in done:
        print(f"{e.table:16s} {e.day.isoformat() if e.day else 'all':10s} {e.rows:>12,d} rows  {e.path}")
    if not any(e.day for e in done):
        print(f"no rows between {start.isoformat()} and {end.isoformat()}")
    return 0
