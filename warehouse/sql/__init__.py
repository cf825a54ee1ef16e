"""SQL the warehouse runs, one statement or CTE list per file, with named parameters ($start, $end)."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def sql(name: str) -> str:
    """The text of warehouse/sql/<name>.sql."""
    return resources.files(__name__).joinpath(f"{name}.sql").read_text()
