"""SQL the warehouse runs, one statement or CTE list per file, with named parameters ($start, $end).

A line `/*name*/` of a file stands for another file that several statements share (INCLUDES).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

INCLUDES = (
    "increase",
    "requests_hourly",
    "requests_hour_sums",
    "requests_hour_itl",
    "requests_hour_where",
    "request_slo",
)


@cache
def text(name: str) -> str:
    """warehouse/sql/<name>.sql as it is written."""
    return resources.files(__name__).joinpath(f"{name}.sql").read_text()


@cache
def sql(name: str) -> str:
    """warehouse/sql/<name>.sql with every include in place (includes may include others)."""
    out = text(name)
    while True:
        expanded = out
        for include in INCLUDES:
            expanded = expanded.replace(f"/*{include}*/", text(include))
        if expanded == out:
            return out
        out = expanded
