"""The fleet's DuckLake: `moemeter publish` (a warehouse file into it) and `moemeter lake ...` (as
its owner: its guard, its racks' roles, its files)."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from datetime import timedelta

from .common import (
    DEFAULT_DB,
    LAKE_DATA_HELP,
    LAKE_HELP,
    CliError,
    Command,
    Commands,
    Row,
    chunk_minutes,
    open_read_only,
    rack_name,
)

commands = Commands()
lake_commands = Commands()
commands.group(
    "lake",
    lake_commands,
    help="the fleet's DuckLake, as its owner: its guard, its racks' roles, its files",
    dest="lake_command",
    metavar="LAKE_COMMAND",
    rows=[
        Row(
            "moemeter lake setup|owners|assign RACK ROLE|tidy --lake CATALOG",
            "as the lake's owner: install the catalog's guard (each rack writable only by its own PostgreSQL "
            "role), list or give racks to roles, merge every rack's files (docs/operations.md, \"A fleet on "
            'DuckLake")',
        ),
    ],
)


def _lake_catalog(s: Command) -> None:
    """The option every `lake` command takes, after its own."""
    s.add_argument("--lake", required=True, metavar="CATALOG", help=LAKE_HELP)


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


def _setup_options(s: Command) -> None:
    s.add_argument("--lake-data", metavar="PATH", help=LAKE_DATA_HELP)
    _lake_catalog(s)


@lake_commands.command(
    "setup", _setup_options, help="create the lake's tables, install its guard, grant moemeter_publisher"
)
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


def _owners_options(s: Command) -> None:
    s.set_defaults(lake_data=None)
    _lake_catalog(s)


@lake_commands.command("owners", _owners_options, help="each rack and the PostgreSQL role that may publish it")
def cmd_lake_owners(args: argparse.Namespace) -> int:
    with _lake_writer(args) as con:
        print(f"racks of {args.lake} and the roles that publish them:")
        _print_owners(con)
    return 0


def _assign_options(s: Command) -> None:
    s.add_argument("rack", help="the rack's name")
    s.add_argument("role", help="the PostgreSQL role its publisher logs in as")
    s.set_defaults(lake_data=None)
    _lake_catalog(s)


@lake_commands.command("assign", _assign_options, help="give a rack to a role (the lake's owner only)")
def cmd_lake_assign(args: argparse.Namespace) -> int:
    from warehouse.lake import assign_rack

    with _lake_writer(args) as con:
        assign_rack(con, args.rack, args.role)
    print(f"rack {args.rack}: published by role {args.role} from now on")
    return 0


def _tidy_options(s: Command) -> None:
    s.set_defaults(lake_data=None)
    _lake_catalog(s)


@lake_commands.command(
    "tidy", _tidy_options, help="merge and rewrite every rack's files, expire old snapshots (the owner only)"
)
def cmd_lake_tidy(args: argparse.Namespace) -> int:
    from warehouse.lake import tidy

    with _lake_writer(args) as con:
        done = tidy(con)
    print(
        f"lake tidied: {done.rewritten} files rewritten without deleted rows, {done.merged} merged, "
        f"{done.expired} snapshots expired, {done.removed} files removed"
    )
    return 0


def _publish_options(s: Command) -> None:
    s.add_argument("--db", default=DEFAULT_DB, help="DuckDB file (opened read-only)")
    s.add_argument("--lake", required=True, metavar="CATALOG", help=LAKE_HELP)
    s.add_argument("--lake-data", metavar="PATH", help=LAKE_DATA_HELP)
    s.add_argument("--rack", help="the name this rack publishes under (default: the host's name)")
    chunk_minutes(s)


@commands.command(
    "publish",
    _publish_options,
    help="publish what a warehouse file holds to a DuckLake, as serve --lake does",
    rows=[
        Row(
            "moemeter publish --db F --lake CATALOG [--lake-data PATH] --rack NAME",
            "publish a warehouse file to the fleet's DuckLake (PostgreSQL catalog, Parquet data), "
            "idempotently; `report cost`, `query` and `export` read it with `--lake CATALOG [--rack NAME]` "
            "(no `--rack`: every rack and the fleet's total)",
        ),
    ],
)
def cmd_publish(args: argparse.Namespace) -> int:
    """Publish what a warehouse file holds to the lake, up to its rollup watermark."""
    import duckdb

    from warehouse.lake import LakeError, Publisher, connect

    try:
        lake = connect(args.lake, args.lake_data)
        try:
            publisher = Publisher(lake, rack_name(args), timedelta(minutes=args.chunk_minutes))
            with open_read_only(args.db) as local:
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
