"""Every dashboard page's queries over 1 h, 24 h and 7 days of a warehouse file, p50/p95 of 5 runs.

`python -m benchmarks.pages DB` (the history section of `make bench` builds such a file; it times
the Live, Experts and Users pages, this adds CPU overhead and Cost).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import duckdb

from dashboard.data import cost, live, overhead
from warehouse.api import LocalQuery

from .run import _timed, experts_queries, live_queries, users_queries


def overhead_queries(q: live.Query, w: live.Window) -> None:
    overhead.per_step(overhead.step_time(q, w))
    overhead.api_server_delay(q, w)
    mid = w.start + (w.end - w.start) / 2
    overhead.compare(q, (w.start, mid), (mid, w.end))


def cost_queries(q: live.Query, w: live.Window) -> None:
    pools = cost.pools(q, w.start, w.end)
    r = cost.cost_report(q, pools, w.start, w.end)
    r.as_json()
    step = timedelta(days=1) if w.end - w.start > timedelta(days=2) else timedelta(hours=1)
    cost.over_time(q, pools, cost.price_sheet(q), w.start, w.end, step)
    cost.daily_statement(q, pools, w.start.replace(hour=0, minute=0, second=0, microsecond=0), w.end)


PAGES = {"live": live_queries, "experts": experts_queries, "users": users_queries, "overhead": overhead_queries,
         "cost": cost_queries}  # fmt: skip


def main() -> None:
    con = duckdb.connect(sys.argv[1], read_only=True)
    q = LocalQuery(con)
    end = live.latest_scrape_time(q)
    assert end is not None, "no scrapes in this file"
    out: dict[str, object] = {}
    for label, seconds in (("1h", 3600), ("24h", 86400), ("7d", 7 * 86400)):
        w = live.Window.ending(end, seconds)
        for page, fn in PAGES.items():
            p50, p95 = _timed(lambda f=fn, w=w: f(q, w), 5)  # type: ignore[misc]
            out[f"{page}_{label}_p50_seconds"], out[f"{page}_{label}_p95_seconds"] = p50, p95
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
