"""moemeter's contract: every word two layers share, declared once, importing nothing of the
project (client_python's `samples.py` is the model). Every layer may import it; it imports no layer.

- `targets`: `TargetInfo`, `Sample`, `Page` (what the parser and the collectors hand the
  warehouse), `ROLES`, `POOLS` (which targets form the two GPU pools), `instance_of`.
- `tokens`: the four token measures (docs/definitions.md).
- `families`: every metric family moemeter reads or emits (docs/metrics.md's table).
- `requests`: the gateway's request record, its feed schema, the server's faults, the latency
  buckets and how a tenant's user is named.
- `windows`: the spans pages and benchmarks offer, as (key, label, span) values.
- `alerts`: the alert specs both the banner and the Prometheus rules renderer read.
- `eplb`: the expert placement policy, shared by the twin and the warehouse's what-if planner.
- `errors`, `clock`, `columns`: the base of every error a user sees, the writer's clock, what
  fits a column.

The names below are the contract's most used words, re-exported so `from moemeter.contract import
POOLS` reads as it always has; each has its one home in the module named.
"""

from __future__ import annotations

from .families import FAMILIES, KINDS, SOURCES, Family, Source, family, markdown_table, of
from .targets import POOLS, ROLES, Layout, Page, Sample, TargetInfo, instance_of
from .tokens import CACHED, COMPUTED, GENERATED, PROMPT, TOKEN_MEASURES, computed_tokens

DEFAULT_INTERVAL = 5.0
"""Seconds between scrape rounds unless `serve --interval` says otherwise: the collector's
default, the read layer's bucket for a window without a stored interval, the benchmarks'."""
LONGEST_DAYS = 3650
"""The longest a duration or a retention may be (ten years): a flag's, or `Retention`'s."""

__all__ = [
    "CACHED",
    "COMPUTED",
    "DEFAULT_INTERVAL",
    "LONGEST_DAYS",
    "FAMILIES",
    "GENERATED",
    "KINDS",
    "POOLS",
    "PROMPT",
    "ROLES",
    "SOURCES",
    "TOKEN_MEASURES",
    "Family",
    "Layout",
    "Page",
    "Sample",
    "Source",
    "TargetInfo",
    "computed_tokens",
    "family",
    "instance_of",
    "markdown_table",
    "of",
]
