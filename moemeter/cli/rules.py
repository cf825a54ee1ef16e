"""`moemeter rules`: the alert pack as one Prometheus rules file (and a file_sd file of the targets);
`moemeter mixin`: the pack, the figures' recording rules and Grafana boards as a monitoring mixin."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from .common import Command, Commands, Row

commands = Commands()


def _sheet_options(s: Command) -> None:
    """What `_inputs` reads."""
    s.add_argument(
        "--targets", help="targets file: each pool's GPUs, for the per-GPU and $/M-token rules (else left out)"
    )
    s.add_argument("--price-sheet", help="TOML price sheet (default: warehouse/price_sheets/default.toml)")
    s.add_argument(
        "--slo-sheet",
        help="TOML SLO sheet: its default class sets the burn-rate objectives (default: warehouse/slo_sheets/default.toml)",
    )


def _rules_options(s: Command) -> None:
    _sheet_options(s)
    s.add_argument("--out", help="write the rules file here instead of stdout")
    s.add_argument(
        "--sd-out", help="also write a Prometheus file_sd file of the targets, with the labels the rules read"
    )


def _inputs(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """(targets, pools, SLO class) from --targets, --price-sheet and --slo-sheet."""
    from collectors.targets import load_targets
    from warehouse.prices import default_sheet, load_sheet
    from warehouse.promql import pool_costs
    from warehouse.rules import RulesError
    from warehouse.slo import default_slo_sheet, load_slo_sheet

    now = datetime.now(UTC).replace(tzinfo=None)
    targets = load_targets(args.targets) if args.targets else None
    pools = None
    if targets is not None:
        sheet = load_sheet(args.price_sheet) if args.price_sheet else default_sheet()
        pools = pool_costs(targets, sheet, now)  # the prices in effect now
    else:
        print("no --targets: the $/M-token rules (they need each pool's GPUs) are left out", file=sys.stderr)
    slo_sheet = load_slo_sheet(args.slo_sheet) if args.slo_sheet else default_slo_sheet()
    slo = slo_sheet.default_at(now)
    if slo is None:
        raise RulesError(f"SLO sheet {slo_sheet.name}: no default class is in effect now")
    return targets, pools, slo


@commands.command(
    "rules",
    _rules_options,
    help="the alert pack: SLO burn, NIXL, KV cache, preemptions, stragglers, targets, idle, $/M, EPLB",
    rows=[
        Row(
            "moemeter rules [--targets F] [--slo-sheet F] [--out F] [--sd-out F]",
            "the **alert pack** as one Prometheus rules file: SLO fast and slow burn, NIXL failures and "
            "expired KV, KV-cache saturation, preemptions, DP-engine stragglers, targets down or absent, "
            "idle pools, $/M spikes, EPLB hot spots; each with promtool tests (docs/alerts.md)",
        ),
    ],
)
def cmd_rules(args: argparse.Namespace) -> int:
    import json

    from warehouse.alerts import AlertRules
    from warehouse.mixin import as_yaml
    from warehouse.rules import RulesError, alert_pack, file_sd

    targets, pools, slo = _inputs(args)
    text = as_yaml(alert_pack(AlertRules(), slo, pools, targets))
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


def _mixin_options(s: Command) -> None:
    s.add_argument("--out", required=True, help="directory to write the mixin into (made if missing)")
    _sheet_options(s)
    s.add_argument(
        "--rack", default="", help="the `rack` label of the recorded GPUs and prices, as your scrape config sets it"
    )


@commands.command(
    "mixin",
    _mixin_options,
    help="the monitoring mixin: recording rules, alerts, Grafana boards, provisioning, Kubernetes",
    rows=[
        Row(
            "moemeter mixin --out DIR [--targets F] [--rack R]",
            "the **monitoring mixin** for an existing Prometheus and Grafana: every headline figure as a "
            "recording rule, the alert pack, six Grafana boards (grafana-foundation-sdk), provisioning "
            "files, a PrometheusRule and a dashboards ConfigMap (docs/grafana.md)",
        ),
    ],
)
def cmd_mixin(args: argparse.Namespace) -> int:
    from warehouse.mixin import files, write

    targets, pools, slo = _inputs(args)
    if pools is None:
        print("no --targets: the per-GPU figures are left out too; their panels stay empty", file=sys.stderr)
    texts = files(slo, pools, targets, args.rack)  # everything built before anything is written
    written = write(Path(args.out), texts)
    print(f"wrote {len(written)} files under {args.out}", file=sys.stderr)
    return 0
