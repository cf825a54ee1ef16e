"""SQL the warehouse runs, reads and writes alike, one statement or CTE list per file, with named
parameters ($start, $end): no statement is built in Python (dbt-duckdb's layout is the model).

A line `/*name*/` of a file stands for another file that several statements share (INCLUDES).
`{{pools}}` stands for the contract's pools as an SQL list, `('prefill', 'decode')`. Any other
`{{key}}` is an identifier (a table's name) given by the caller, and only one of IDENTIFIERS:
values are bound, never templated, except where an engine binds none (ATTACH's path, DDL,
PostgreSQL text sent whole): warehouse/lake.py's `_statement` quotes those by the engine's rules.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any

from moemeter.contract import POOLS

INCLUDES = (
    "increase",
    "requests_hourly",
    "requests_hour_sums",
    "requests_hour_itl",
    "requests_hour_where",
    "request_slo",
    "request_slo_judged",
    "requests_slo",
    "requests_slo_minutes",
    "requests_slo_counts",
    "requests_slo_rolled",
    "requests_slo_add",
    "roll_increments",
    "roll_pool_histograms",
    "last_readings",
    "lake_edges",
    "lake_pg_owner_only",
)
IDENTIFIERS: frozenset[str] = frozenset()
"""Every identifier a statement's `{{key}}` may be given: a fixed list, never a user's text."""
IDENTIFIERS |= {"samples", "increments", "scrapes", "series", "targets", "expert_load", "expert_placement"}  # tables
IDENTIFIERS |= {"samples_1m", "samples_1h", "increments_1m", "increments_6m", "increments_1h", "expert_load_1h"}
IDENTIFIERS |= {"pool_histograms_1m", "pool_histograms_6m", "pool_histograms_1h", "eplb_rebalances"}
IDENTIFIERS |= {"requests", "requests_1h", "requests_itl_1h", "requests_slo_1h", "requests_slo_1m", "request_feeds"}
IDENTIFIERS |= {"request_records"}  # the view of a record's own columns (migration 024) the export writes
IDENTIFIERS |= {"gpu_prices", "token_prices", "slo_classes", "slo_assignments"}
IDENTIFIERS |= {"compacted", "rolled", "rolled_minutes"}  # a roll's temp tables (warehouse/rollup.py)
IDENTIFIERS |= {"ts", "finished_at"}  # the time columns the export reads a day by (warehouse/export.py)
IDENTIFIERS |= {"enable_external_access", "python_enable_replacements"}  # settings (warehouse/readonly.py)
IDENTIFIERS |= {"rejected"}  # a table export.named_by_key may be asked for (tests compare stores by it)
IDENTIFIERS |= {"lake_state", "rollup_state", "lake_commits"}  # the lake's tables, its lock's database (lake.py)
IDENTIFIERS |= {"moemeter_publisher", "moemeter_reader", "moemeter_guard"}  # the lake's PostgreSQL roles, trigger
POOLS_SQL = "(" + ", ".join(f"'{p}'" for p in POOLS) + ")"
_SLOT = re.compile(r"\{\{(\w+)\}\}")


@cache
def text(name: str) -> str:
    """warehouse/sql/<name>.sql as it is written."""
    return resources.files(__name__).joinpath(f"{name}.sql").read_text()


@cache
def _expanded(name: str) -> str:
    out = text(name)
    while True:
        expanded = out
        for include in INCLUDES:
            expanded = expanded.replace(f"/*{include}*/", text(include))
        if expanded == out:
            return out.replace("{{pools}}", POOLS_SQL)
        out = expanded


def sql(name: str, **identifiers: str) -> str:
    """warehouse/sql/<name>.sql with every include in place (includes may include others), the
    pools written out, and each `{{key}}` replaced by `identifiers[key]`, one of IDENTIFIERS."""
    out = _expanded(name)
    if not identifiers and "{{" not in out:
        return out

    def fill(m: re.Match[str]) -> str:
        value = identifiers.get(m[1])
        if value is None:
            raise KeyError(f"warehouse/sql/{name}.sql needs an identifier for {{{{{m[1]}}}}}")
        if value not in IDENTIFIERS:
            raise ValueError(f"{value!r} is not one of the warehouse's identifiers (warehouse/sql IDENTIFIERS)")
        return value

    return _SLOT.sub(fill, out)


PARAMETER = re.compile(r"\$([a-z_][a-z0-9_]*)")


def bind(text: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The statement and the parameters it names (DuckDB refuses any other); a missing one is an error."""
    names = set(PARAMETER.findall(text))
    missing = names - set(params)
    if missing:
        raise ValueError(f"the statement needs parameters {sorted(missing)}")
    return text, {k: params[k] for k in names}
