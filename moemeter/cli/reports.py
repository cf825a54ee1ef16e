"""For finance, SLOs and engineers: `moemeter report cost|daily|slo|spec` and the sheets they price and judge by,
`moemeter prices load` and `moemeter slo load`."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from .common import (
    DEFAULT_DB,
    CliError,
    Command,
    Commands,
    Row,
    lake_reading,
    open_lake,
    open_read_only,
    open_warehouse,
    parse_time,
)

commands = Commands()
report_commands = Commands()
commands.group(
    "report",
    report_commands,
    help="reports: $/M tokens by pool, per user, per day; SLO attainment, goodput and $/M good tokens",
    dest="report_command",
    metavar="REPORT",
)


def _window_options(s: Command) -> None:
    """The options every report takes, after its --targets."""
    from warehouse.prices import default_sheet

    gpu_hour = max((p for p in default_sheet().gpu if p.pool == "*"), key=lambda p: p.effective).usd_per_gpu_hour
    s.add_argument("--from", dest="from_", required=True, help="start, ISO 8601 (UTC if no offset)")
    s.add_argument("--to", required=True, help="end (exclusive), ISO 8601")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
    s.add_argument("--api", help="query API URL instead of the file (while `serve` holds it)")
    s.add_argument(
        "--price-sheet",
        help="TOML price sheet (default: the sheets loaded into the warehouse, "
        f"else warehouse/price_sheets/default.toml: ${gpu_hour:g}/GPU-hour)",
    )
    fmt = s.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON")
    fmt.add_argument("--csv", action="store_true", help="print CSV")


FUTURE_SLACK_SECONDS = 300
"""How far past now a costed window may end (clocks of two hosts apart): no further, since no GPU has
run there yet and a window that ends in a year would bill a year of unobserved GPU-hours."""


def _costed_window(args: argparse.Namespace) -> tuple[datetime, datetime]:
    """--from and --to of a report that prices GPU-hours: a window that has happened."""
    from datetime import timedelta

    start, end = parse_time(args.from_), parse_time(args.to)
    now = datetime.now(UTC).replace(tzinfo=None)
    if end > now + timedelta(seconds=FUTURE_SLACK_SECONDS):
        raise CliError(
            f"--to {args.to} is in the future (now {now:%Y-%m-%d %H:%M} UTC): no GPU-hour has run there yet; "
            "end the window at now or earlier"
        )
    return start, end


def _report_pools(path: str) -> dict[str, list[tuple[str, int]]]:
    from collectors.targets import load_targets
    from moemeter.contract import POOLS

    targets = load_targets(path)
    return {role: [(t.name, t.gpus) for t in targets if t.role == role] for role in POOLS}


def _report_sheet(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from warehouse.prices import load_sheet

    return load_sheet(args.price_sheet) if args.price_sheet else None


def _with_query(args: argparse.Namespace, fn):  # type: ignore[no-untyped-def]
    """Run fn(query) on one rack of the lake (--lake, --rack), the query API (--api) or the file
    opened read-only (--db)."""
    import duckdb

    from warehouse.api import LocalQuery, QueryClient, QueryError

    try:
        if getattr(args, "lake", None):
            with open_lake(args) as con:
                return fn(LocalQuery(con))
        if args.api:
            return fn(QueryClient(args.api))
        with open_read_only(args.db) as con:
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


def _basis_option(s: Command) -> None:
    from warehouse.cost import BASES

    s.add_argument(
        "--basis",
        choices=BASES,
        default=BASES[0],
        help="cost basis (docs/definitions.md): allocation charges every reserved GPU-hour to the tokens "
        "and users; usage charges only busy GPU time and leaves idle and unobserved time lines of their own",
    )


def _cost_options(s: Command) -> None:
    s.add_argument(
        "--targets",
        help="targets file: roles and GPUs of the pools (default: the targets the warehouse, or each rack "
        "of the lake, saw in the window)",
    )
    lake_reading(s)
    _window_options(s)
    _basis_option(s)


@report_commands.command(
    "cost",
    _cost_options,
    help="GPU-hours, cost, $/M input/output/blended tokens, idle cost, revenue, per-user allocation over a window",
    rows=[
        Row(
            "moemeter report cost --targets F --from T --to T [--db F | --api URL] [--price-sheet F] "
            "[--basis allocation|usage] [--json | --csv]",
            "for finance: GPU-hours and cost per pool, $/M input (computed prompt tokens), $/M output, "
            "blended, cache hits apart, idle cost, revenue and margin at the token prices, each user's share "
            "of the cost",
        ),
    ],
)
def cmd_report_cost(args: argparse.Namespace) -> int:
    from warehouse.cost import NoData, cost_report, stored_pools

    start, end = _costed_window(args)
    sheet = _report_sheet(args)
    if args.lake and any(t != t.replace(minute=0, second=0, microsecond=0) for t in (start, end)):
        print(
            "the lake holds request sums per closed hour: per-user costs count the window's whole hours only",
            file=sys.stderr,
        )
    if args.lake and not args.rack:
        return _print_report(args, _fleet_cost(args, start, end, sheet))
    pools = _report_pools(args.targets) if args.targets else None
    try:
        report = _with_query(
            args, lambda q: cost_report(q, pools or stored_pools(q, start, end), start, end, sheet, basis=args.basis)
        )
    except (NoData, ValueError) as exc:
        raise CliError(str(exc)) from exc
    return _print_report(args, report)


def _fleet_cost(args: argparse.Namespace, start: datetime, end: datetime, sheet):  # type: ignore[no-untyped-def]
    """report cost --lake without --rack: every rack's report (its own pools and sheets) and the fleet's."""
    from warehouse.api import LocalQuery
    from warehouse.cost import NoData, cost_report, stored_pools
    from warehouse.fleet import FleetCost
    from warehouse.lake import racks

    with open_lake(args) as con:
        names = racks(con)
    if not names:
        raise CliError(f"no rack has published to the lake {args.lake} yet")
    reports, missing = {}, {}
    for rack in names:
        with open_lake(argparse.Namespace(**{**vars(args), "rack": rack})) as con:
            q = LocalQuery(con)
            pools = stored_pools(q, start, end)
            if not any(pools.values()):
                missing[rack] = "none of its prefill or decode targets was scraped in the window"
                continue
            try:
                reports[rack] = cost_report(q, pools, start, end, sheet, basis=args.basis)
            except (NoData, ValueError) as exc:
                missing[rack] = str(exc)
    if not reports:
        raise CliError("no rack has counters in the window: " + "; ".join(f"{r}: {m}" for r, m in missing.items()))
    return FleetCost(start, end, reports, missing)


def _daily_options(s: Command) -> None:
    s.add_argument("--targets", required=True, help="targets file: roles and GPUs of the pools")
    _window_options(s)
    _basis_option(s)
    s.add_argument("--parquet", help="also write the statement to this Parquet file")


@report_commands.command(
    "daily",
    _daily_options,
    help="the daily statement: GPUs in service, GPU-hours, cost, "
    "input tokens and cache-hit share, output tokens, revenue, margin",
    rows=[
        Row(
            "moemeter report daily --targets F --from T --to T [--basis allocation|usage] [--json | --csv] "
            "[--parquet F]",
            "the daily statement: GPUs in service (average, peak), GPU-hours, cost, input tokens and "
            "cache-hit share, output tokens, revenue, margin",
        ),
    ],
)
def cmd_report_daily(args: argparse.Namespace) -> int:
    from warehouse.cost import daily_statement

    start, end = _costed_window(args)
    if end <= start:
        raise CliError("--to must be after --from")
    pools, sheet = _report_pools(args.targets), _report_sheet(args)
    try:
        df = _with_query(args, lambda q: daily_statement(q, pools, start, end, sheet, basis=args.basis))
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


def _focus_options(s: Command) -> None:
    from warehouse.focus import BY, PROVIDER

    _cost_options(s)
    s.add_argument("--by", choices=BY, default="tenant", help="allocate the GPU rows to tenants, users, or not")
    s.add_argument("--out", help="write here (.csv or .parquet; default: CSV on stdout)")
    s.add_argument("--provider", default=PROVIDER, help=f"ProviderName and InvoiceIssuerName (default {PROVIDER!r})")


@report_commands.command(
    "focus",
    _focus_options,
    help="FOCUS 1.2 cost and usage rows per hour and pool (GPU time busy, idle, unobserved; tokens), "
    "allocated to tenants or users",
    rows=[
        Row(
            "moemeter report focus --from T --to T [--db F | --api URL | --lake CATALOG --rack R] "
            "[--basis allocation|usage] [--by pool|tenant|user] [--out F.csv | F.parquet]",
            "for a FinOps tool: FOCUS 1.2 rows per hour and pool, GPU-hours busy, idle and unobserved at the "
            "price in force, tokens per kind, split to tenants or users in x_Allocated* columns; BilledCost adds up "
            "to `report cost`",
        ),
    ],
)
def cmd_report_focus(args: argparse.Namespace) -> int:
    from warehouse.cost import NoData, stored_pools
    from warehouse.export import check_rack
    from warehouse.focus import check_out, focus_rows, write

    from .common import rack_name

    start, end = _costed_window(args)
    if args.lake and not args.rack:
        raise CliError("--lake needs --rack: a FOCUS export is one rack's (its pools and price sheets)")
    if args.json or args.csv:
        raise CliError("report focus writes FOCUS rows: CSV on stdout, or --out F.csv | F.parquet")
    sheet = _report_sheet(args)
    pools = _report_pools(args.targets) if args.targets else None
    rack = check_rack(rack_name(args))

    def rows(q):  # type: ignore[no-untyped-def]
        return focus_rows(
            q, pools or stored_pools(q, start, end), start, end, rack, sheet, args.basis, args.by, args.provider
        )

    if args.out:
        check_out(args.out)
    try:
        df = _with_query(args, rows)
    except (NoData, ValueError) as exc:
        raise CliError(str(exc)) from exc
    if args.out:
        write(df, args.out)
        print(
            f"{len(df):,} FOCUS rows, BilledCost ${df['BilledCost'].sum():,.2f}, written to {args.out}", file=sys.stderr
        )
    else:
        sys.stdout.write(df.to_csv(index=False))
    return 0


def _stored_targets_option(s: Command) -> None:
    s.add_argument(
        "--targets", help="targets file: roles and GPUs of the pools (default: the targets the warehouse saw)"
    )


def _slo_options(s: Command) -> None:
    _stored_targets_option(s)
    from warehouse.goodput import GROUPS

    s.add_argument("--by", choices=tuple(GROUPS), default="class", help="a row per class, or per tenant")
    _window_options(s)


@report_commands.command(
    "slo",
    _slo_options,
    help="per SLO class (or tenant): requests, met, attainment, goodput, $/M good tokens, error budget left, burn rates",
    rows=[
        Row(
            "moemeter report slo --from T --to T [--by class|tenant] [--targets F] [--db F | --api URL] "
            "[--json | --csv]",
            "per SLO class (or tenant): requests held, met, attainment, misses by target, goodput "
            "(requests/s and tokens/s that met their targets), $/M good tokens, error budget left over the "
            "class's period, burn rates over 5 min, 30 min, 1 h and 6 h",
        ),
    ],
)
def cmd_report_slo(args: argparse.Namespace) -> int:
    from warehouse.goodput import NoSloSheet, slo_report

    start, end = parse_time(args.from_), parse_time(args.to)
    pools = _report_pools(args.targets) if args.targets else None
    sheet = _report_sheet(args)
    try:
        report = _with_query(args, lambda q: slo_report(q, start, end, pools, sheet, args.by))
    except (NoSloSheet, ValueError) as exc:
        raise CliError(str(exc)) from exc
    return _print_report(args, report)


def _spec_options(s: Command) -> None:
    _stored_targets_option(s)
    from warehouse.spec import BY

    s.add_argument("--by", choices=BY, default="pool", help="a row per pool, instance or engine (DP rank)")
    lake_reading(s)
    _window_options(s)


@report_commands.command(
    "spec",
    _spec_options,
    help="speculative decoding: acceptance rate and length, per-position acceptance, rejected drafts and their cost",
    rows=[
        Row(
            "moemeter report spec --from T --to T [--by pool|instance|engine] [--db F | --api URL | --lake C --rack R] "
            "[--json | --csv]",
            "for engineers and finance: drafts, draft and accepted tokens, acceptance rate, mean acceptance "
            "length (vLLM's, bonus token included), acceptance per draft position, the rejected drafts' share "
            "of decode compute, and decode $/M output tokens split into accepted output and rejected drafts",
        ),
    ],
)
def cmd_report_spec(args: argparse.Namespace) -> int:
    from warehouse.cost import NoData, cost_report, stored_pools
    from warehouse.spec import spec_report

    start, end = parse_time(args.from_), parse_time(args.to)
    if args.lake and not args.rack:
        raise CliError("--lake needs --rack: drafts are counted per rack's engines")
    pools = _report_pools(args.targets) if args.targets else None
    sheet = _report_sheet(args)

    def report(q):  # type: ignore[no-untyped-def]
        try:
            costed = cost_report(q, pools or stored_pools(q, start, end), start, end, sheet, revenue_too=False)
            decode_cost = costed.decode.cost_usd
        except (NoData, ValueError):
            decode_cost = None  # no pools or tokens in the window: the figures without their cost
        return spec_report(q, start, end, args.by, decode_cost)

    try:
        spec = _with_query(args, report)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    return _print_report(args, spec)


# ----------------------------------------------------------------- prices and slo
prices_commands = Commands()
commands.group(
    "prices",
    prices_commands,
    help="price sheets: load a new version into the warehouse",
    dest="prices_command",
    metavar="PRICES_COMMAND",
)


def _prices_load_options(s: Command) -> None:
    s.add_argument("file", help="TOML price sheet")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (needs the writer: stop `serve` first)")


@prices_commands.command(
    "load",
    _prices_load_options,
    help="add a price sheet's entries (never changes a stored price)",
    rows=[
        Row(
            "moemeter prices load SHEET.toml --db F",
            "add a price sheet's entries to the warehouse (versions by effective time; a stored price is "
            "never changed)",
        ),
    ],
)
def cmd_prices_load(args: argparse.Namespace) -> int:
    from warehouse.prices import PriceSheetError, load_sheet, store_sheet

    sheet = load_sheet(args.file)
    wh = open_warehouse(args.db)
    try:
        added = wh.write(lambda con: store_sheet(con, sheet, datetime.now(UTC).replace(tzinfo=None)))
    except PriceSheetError as exc:
        raise CliError(str(exc)) from exc
    finally:
        wh.close()
    print(f"price sheet {sheet.name}: {added} new entries stored in {args.db}")
    return 0


slo_commands = Commands()
commands.group(
    "slo",
    slo_commands,
    help="SLO sheets: load a new version of the classes and assignments",
    dest="slo_command",
    metavar="SLO_COMMAND",
)


def _slo_load_options(s: Command) -> None:
    s.add_argument("file", help="TOML SLO sheet (warehouse/slo_sheets/default.toml shows the form)")
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (needs the writer: stop `serve` first)")


@slo_commands.command(
    "load",
    _slo_load_options,
    help="add an SLO sheet's entries (never changes a stored target or assignment)",
    rows=[
        Row(
            "moemeter slo load SHEET.toml --db F",
            "add an SLO sheet's classes (TTFT, inter-token and end-to-end targets, objective, period) and "
            "user/tenant assignments (`warehouse/slo_sheets/default.toml` shows the form; "
            "docs/definitions.md, SLOs)",
        ),
    ],
)
def cmd_slo_load(args: argparse.Namespace) -> int:
    from warehouse.slo import load_slo_sheet, store_slo_sheet

    sheet = load_slo_sheet(args.file)
    wh = open_warehouse(args.db)
    try:
        added = wh.write(lambda con: store_slo_sheet(con, sheet, datetime.now(UTC).replace(tzinfo=None)))
    finally:
        wh.close()
    classes = ", ".join(sorted({c.name for c in sheet.classes}))
    print(f"SLO sheet {sheet.name} ({classes}): {added} new entries stored in {args.db}")
    return 0
