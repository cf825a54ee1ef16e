"""What the command modules share: how a command is declared beside its function (`Commands`,
`Command`), the error every bad flag raises, times and durations, and opening the warehouse, a file
read-only or the lake."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from moemeter.contract import LONGEST_DAYS
from moemeter.contract.errors import MoemeterError

log = logging.getLogger("moemeter")
DEFAULT_DB = "moemeter.duckdb"
DEFAULT_API_PORT = 8431


def memory_help(kind: str) -> str:
    """--memory-limit's help for a command whose warehouse does this kind of work."""
    from warehouse.limits import MEMORY_CEILING_MB

    return (
        "memory for the warehouse (DuckDB buffer pool, writer and queries together), e.g. 4GB; default: "
        f"an eighth of this machine's memory, at most {MEMORY_CEILING_MB[kind]:,} MB (docs/operations.md, Memory)"
    )


LAKE_HELP = "its catalog, e.g. 'postgres:dbname=lake host=/run/postgresql user=moemeter'"
LAKE_DATA_HELP = "where the lake's Parquet files go (a directory or s3://...); needed when the lake is new"


class CliError(MoemeterError):
    """A bad flag or argument (every MoemeterError is printed without a traceback, exit status 2)."""


# ------------------------------------------------------------------ declaring commands
Handler = Callable[[argparse.Namespace], int]
Options = Callable[["Command"], None]


class Row(NamedTuple):
    """One row of the README's command table: a command line (alternatives apart by " / ", each
    its own code span there) and what it does, in markdown."""

    synopsis: str
    what: str


class Paragraphs(argparse.HelpFormatter):
    """argparse's help, with a description's and an epilog's paragraphs (apart by a blank line)
    each filled on its own, and markdown's bold left out."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(super(Paragraphs, self)._fill_text(p, width, indent) for p in text.split("\n\n"))

    def _format_text(self, text: str) -> str:
        return super()._format_text(text.replace("**", ""))


class Command(argparse.ArgumentParser):
    """A command's parser. Its options are declared when it is first used (to parse or for help),
    so `moemeter --help` and each command import only what their own options need. `rows` are its
    rows of the README's command table (moemeter/cli/reference.py)."""

    rows: tuple[Row, ...] = ()
    pending: Options | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Paragraphs)
        super().__init__(*args, **kwargs)

    def declared(self) -> Command:
        """This parser with its options declared."""
        if self.pending is not None:
            options, self.pending = self.pending, None
            options(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        return super(Command, self.declared()).parse_known_args(args, namespace)

    def format_usage(self) -> str:
        return super(Command, self.declared()).format_usage()

    def format_help(self) -> str:
        return super(Command, self.declared()).format_help()

    def subcommands(self) -> list[tuple[str, str, Command]]:
        """(name, help, parser) of each of its subcommands, in order (none for a command)."""
        found = []
        for action in self.declared()._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [(a.dest, a.help or "", action.choices[a.dest]) for a in action._choices_actions]
        return found


@dataclass(frozen=True)
class Spec:
    name: str
    help: str
    options: Options
    """Declares the command's options (a group's: its subcommands)."""
    func: Handler | None
    """What runs it; None for a group."""
    rows: tuple[Row, ...]


class Commands:
    """Commands that share a parent, each declared beside its function:

        def _options(s: Command) -> None:
            s.add_argument(...)

        @commands.command("name", _options, help="...", rows=[Row("moemeter name ...", "...")])
        def cmd_name(args: argparse.Namespace) -> int: ...

    The first row's `what` is the command's description in its --help, the others its epilog."""

    def __init__(self, *parts: Commands) -> None:
        self.specs: dict[str, Spec] = {}
        for part in parts:
            for spec in part.specs.values():
                self._add(spec)

    def _add(self, spec: Spec) -> None:
        if spec.name in self.specs:
            raise ValueError(f"two commands named {spec.name}")
        self.specs[spec.name] = spec

    def command(
        self, name: str, options: Options, *, help: str, rows: Iterable[Row] = ()
    ) -> Callable[[Handler], Handler]:
        def declare(func: Handler) -> Handler:
            self._add(Spec(name, help, options, func, tuple(rows)))
            return func

        return declare

    def group(
        self, name: str, members: Commands, *, help: str, dest: str, metavar: str, rows: Iterable[Row] = ()
    ) -> None:
        """A command whose subcommands are `members` (its name is in `args.<dest>`)."""
        self._add(Spec(name, help, partial(members.add_to, dest=dest, metavar=metavar), None, tuple(rows)))

    def add_to(self, parser: Command, dest: str, metavar: str, order: Sequence[str] = ()) -> None:
        """Each command as a subcommand of `parser`, in `order` (every one named once) or as declared."""
        if order and sorted(order) != sorted(self.specs):
            raise ValueError(f"the order {sorted(order)} does not name each of {sorted(self.specs)} once")
        commands = parser.add_subparsers(dest=dest, required=True, metavar=metavar)
        for spec in (self.specs[name] for name in order or self.specs):
            main, *more = spec.rows or (None,)
            s = commands.add_parser(
                spec.name,
                help=spec.help,
                description=main.what if main else None,
                epilog="\n\n".join(f"{r.synopsis}: {r.what}" for r in more) or None,
            )
            s.pending, s.rows = spec.options, spec.rows
            if spec.func is not None:
                s.set_defaults(func=spec.func)


def chunk_minutes(s: argparse.ArgumentParser) -> None:
    """--chunk-minutes, for publishing to the lake (its default warehouse.lake's CHUNK)."""
    from warehouse.lake import CHUNK

    s.add_argument(
        "--chunk-minutes",
        type=number(0.001, 366 * 1440, "minutes"),
        default=CHUNK / timedelta(minutes=1),
        help="the most minutes one lake transaction publishes (a backlog goes in steps of this)",
    )


def lake_reading(s: argparse.ArgumentParser, rack: bool = True) -> None:
    s.add_argument("--lake", metavar="CATALOG", help="read the fleet's DuckLake instead (" + LAKE_HELP + ")")
    s.add_argument("--lake-data", metavar="PATH", help="the lake's data path (default: the one its catalog holds)")
    if rack:
        s.add_argument("--rack", help="with --lake: one rack, under the warehouse's table names (else lake.<table>)")


# ------------------------------------------------------------------ reading flags
def parse_time(text: str) -> datetime:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise CliError(f"not an ISO 8601 time: {text!r}") from exc
    return dt.astimezone(UTC).replace(tzinfo=None) if dt.tzinfo else dt


LONGEST = LONGEST_DAYS * 86400.0
"""The longest duration a flag takes, in seconds (longer ones overflow a timestamp's arithmetic)."""


def parse_duration(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except (ValueError, IndexError) as exc:
        raise CliError(f"not a duration (e.g. 90s, 30m, 24h): {text!r}") from exc
    if not 0 < seconds <= LONGEST:  # NaN too
        raise CliError(f"a duration must be above 0 and at most {LONGEST_DAYS:,} days, not {text!r}")
    return seconds


def number(least: float, most: float, unit: str, whole: bool = False) -> Callable[[str], float]:
    """An argparse `type=` for a flag's number: whole or not, from `least` to `most` (NaN, the
    infinities and values past either bound are refused, naming the flag, before anything runs)."""

    def parse(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if whole else ''}number: {text!r}") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{unit} from {_plain(least)} to {_plain(most)}, not {text}")
        return value

    return parse


def _plain(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,g}"


SECONDS = number(0.001, 7 * 86400, "seconds")
"""An interval, a step or a timeout: a millisecond to a week."""
DAYS = number(0.001, LONGEST_DAYS, "days")
"""How long something is kept."""
PORT = number(0, 65535, "a TCP port", whole=True)
COUNT = number(0, 2**31 - 1, "a count", whole=True)
AT_LEAST_ONE = number(1, 2**31 - 1, "a count", whole=True)
SEED = number(0, 2**32 - 1, "a seed", whole=True)


def rack_name(args: argparse.Namespace) -> str:
    """--rack, else this host's name (as a rack name)."""
    from warehouse.export import host_rack

    return host_rack(args.rack)


# ------------------------------------------------------------------ opening data
def open_warehouse(  # type: ignore[no-untyped-def]
    db: str,
    serve_read_only: bool = False,
    memory_limit: str | None = None,
    checkpoint_threshold: str | None = None,
    threads: int | None = None,
    kind: str = "command",
):
    """The read-write warehouse on `db`, or a CliError saying why it cannot be opened. With
    `serve_read_only`, an existing file that cannot be written opens read-only instead, so the
    query API keeps serving what it holds. Without `memory_limit`, the default for its `kind` of
    work (warehouse.limits.MEMORY_CEILING_MB)."""
    from warehouse.db import Warehouse, WarehouseError, storage_problem
    from warehouse.limits import default_memory_limit

    memory_limit = memory_limit or default_memory_limit(kind)
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


def open_read_only(db: str):  # type: ignore[no-untyped-def]
    """A read-only connection to the file, or a CliError that says to use the API instead."""
    import duckdb

    from warehouse.limits import default_memory_limit
    from warehouse.readonly import lock_down

    if not Path(db).exists():
        raise CliError(f"no database at {db}")
    try:
        con = duckdb.connect(db, read_only=True, config={"memory_limit": default_memory_limit("command")})
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


def open_lake(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The lake opened read-only and locked down as the query API's connections are: with --rack,
    the warehouse's table names are that rack's; without, `lake.<table>` holds every rack's rows."""
    from warehouse.lake import LakeError, open_reader

    try:
        return open_reader(args.lake, args.rack, args.lake_data)
    except LakeError as exc:
        raise CliError(str(exc)) from exc
