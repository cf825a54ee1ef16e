"""What one reader statement may cost (warehouse.readonly enforces it); no heavy imports, so the
command line can show the defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one reader statement may cost; `serve` takes them from its command line."""

    timeout_seconds: float = 30.0  # wall time, from the statement's start to its answer's last byte sent
    max_sql_chars: int = 64_000  # statement text, before it is parsed
    max_tree_nodes: int = 20_000  # nodes of the parsed tree
    max_relations: int = 64  # tables, views, table functions, subqueries (200 joined took 17 s to plan)
    max_selects: int = 256  # SELECTs, UNION branches included
    max_result_rows: int = 5_000_000
    max_result_bytes: int = 256 << 20  # of the answer (Arrow or JSON), counted as written: the most one holds


MAX_CONCURRENT = 4  # statements the query API runs at once; one more waits QUEUE_SECONDS, then gets 503
QUEUE_SECONDS = 5.0
