"""The `moemeter` command: the composition root that wires stack, collectors, warehouse and
dashboard. One module per group of commands, each command's options declared beside its function
(common.Commands); this module only assembles them."""

from __future__ import annotations

import logging
import sys

from moemeter.contract.errors import MoemeterError

from . import data, eplb, gateway, lake, reports, rules, running, serve, twin
from .common import Command, Commands

GROUPS = (running, twin, serve, lake, gateway, data, eplb, rules, reports)
ORDER = (
    "up",
    "launch",
    "localstack",
    "twin",
    "serve",
    "publish",
    "lake",
    "gateway",
    "loadgen",
    "dashboard",
    "ingest",
    "eplb",
    "rules",
    "mixin",
    "pull",
    "export",
    "report",
    "prices",
    "slo",
    "query",
)
"""The order `moemeter --help` lists the commands in."""


def build_parser() -> Command:
    p = Command(
        prog="moemeter", description="Observability and cost accounting for PD-disaggregated, wide-EP vLLM MoE serving."
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    Commands(*(group.commands for group in GROUPS)).add_to(p, "command", "COMMAND", ORDER)
    return p


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
