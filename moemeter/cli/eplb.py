"""`moemeter eplb plan|rules`: expert placement from observed load, and its hot-spot alerts."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .common import CliError, Command, Commands, Row

commands = Commands()
eplb_commands = Commands()
commands.group(
    "eplb",
    eplb_commands,
    help="EPLB tools: plan an expert placement from observed load",
    dest="eplb_command",
    metavar="EPLB_COMMAND",
)


def _plan_options(s: Command) -> None:
    from moemeter.contract.eplb import POLICIES

    s.add_argument(
        "--input",
        required=True,
        help='JSON: {"weight": [[load per logical expert] per layer], '
        '"num_replicas", "num_groups", "num_nodes", "num_gpus"}',
    )
    s.add_argument("--policy", choices=POLICIES, default="vllm", help="placement policy")
    s.add_argument("--json", action="store_true", help="print phy2log, rank_load and balancedness as JSON")


@eplb_commands.command(
    "plan",
    _plan_options,
    help="place logical experts into physical slots (vllm or refined policy)",
    rows=[
        Row(
            "moemeter eplb plan --input F.json --policy vllm|refined [--json]",
            "expert placement: vLLM's default EPLB policy exactly, or a refined one",
        ),
    ],
)
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


def _rules_options(s: Command) -> None:
    s.add_argument("--out", help="write to this file instead of stdout")


@eplb_commands.command(
    "rules",
    _rules_options,
    help="print the EPLB hot-spot alerts as a Prometheus alerting-rules file",
    rows=[
        Row(
            "moemeter eplb rules [--out F]",
            "only the EPLB hot-spot alerts, as a Prometheus alerting-rules file",
        ),
    ],
)
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
