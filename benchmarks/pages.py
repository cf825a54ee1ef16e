"""Every page's alert banner, and every dashboard page's queries over 1 h, 24 h and 7 days of a
warehouse file (or 30 days of a month's), p50/p95 of 5 runs, through the query API as the
dashboard sends them (HTTP, SQL checked, Arrow back, no cache); then each page rendered whole
(AppTest: queries, figures and widgets, no browser) for those ranges.

`python -m benchmarks.pages DB [SPAN...]` times a file you have; the history section of `make bench`
builds a day of twin history and runs this on it, then on the month made from it (benchmarks.month).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from dashboard.data import alerts, cost, dp, experts, live, overhead, slo, users
from moemeter.contract import windows
from warehouse.api import QueryClient, QueryServer
from warehouse.db import Warehouse
from warehouse.read import Holdings, plan, served_by


def live_queries(q: live.Query, w: live.Window) -> None:
    tgts = live.targets(q)
    tpg = live.tokens_per_gpu(live.token_rates(q, w), live.pool_gpus(tgts))
    ttft, itl, tpot = live.histograms_counts(q, w, list(live.LATENCY_FAMILIES)).values()
    live.headline(tpg, ttft, itl, tpot, live.scrape_health(q, w))
    live.per_user_tokens_per_second(tpot)
    live.queue_and_kv(q, w)
    live.gpus_latest(q, w.start)
    live.gpus_over_time(q, w)


def experts_queries(q: live.Query, w: live.Window) -> None:
    """What the Experts page asks for one decode target."""
    target = experts.eplb_targets(q)[0]
    steps = experts.rank_steps(q, w, target)
    bal = experts.balancedness_over_time(steps)
    experts.measured_around(experts.rebalances(q, w, target), bal)
    shares = experts.expert_share(q, w, target)
    experts.hot_experts(shares, experts.share_trend(q, w, target, shares.nlargest(10, "share")))
    experts.rank_matrix(steps)
    current = experts.current_placement(q, w, target)
    if current is not None:
        experts.placement(q, w, target, 0)
    experts.load_matrix(shares)


def users_queries(q: live.Query, w: live.Window) -> None:
    """What the Users page asks for at its first render."""
    s = users.summary(q, w)
    users.tps_histogram(q, w)
    users.tps_over_time(q, w)
    top = users.users_table(q, w, limit=25)
    if s is not None and len(top):
        users.user_history(q, w, str(top.tenant[0]), str(top.user_id[0]))


def slo_queries(q: live.Query, w: live.Window) -> None:
    """What the SLOs page asks for: the window ends at the newest request record, not scrape."""
    latest = users.latest_request_time(q)
    if latest is None:
        return
    observed = slo.observed(q, users.window(latest, w.seconds))
    report, _ = slo.reports(q, observed)
    slo.attainment_over_time(q, observed, report)
    slo.budget_over_time(q, observed, report)
    slo.operating_points(q, observed)


def timed(fn, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    times.sort()
    return round(statistics.median(times), 3), round(times[int(0.95 * (len(times) - 1))], 3)


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
    cost.over_time(q, pools, cost.price_sheet(q), w.start, w.end, step, r)
    cost.daily_statement(q, pools, w.start.replace(hour=0, minute=0, second=0, microsecond=0), w.end)


def dp_queries(q: live.Query, w: live.Window) -> None:
    """What the DP ranks page asks for the decode pool."""
    dp.straggler_scores(dp.engines_over_time(q, w, "decode"), alerts.RULES)


PAGES = {
    "live": live_queries,
    "dp": dp_queries,
    "experts": experts_queries,
    "users": users_queries,
    "slo": slo_queries,
    "overhead": overhead_queries,
    "cost": cost_queries,
}


SPANS = ("1h", "24h", "7d")
"""The windows timed on a day's file (moemeter.contract.windows keys); a month's adds "30d"."""


def time_pages(db: Path, repeats: int = 5, spans: tuple[str, ...] = SPANS) -> dict[str, object]:
    """p50/p95 seconds of each page's queries over the last `spans` of the file's history, asked as
    the dashboard asks them: through the query API over HTTP (SQL checked, Arrow back), uncached."""
    wh = Warehouse(db, read_only="benchmark")
    api = QueryServer(wh)
    api.start()
    out: dict[str, object] = {}
    try:
        q = QueryClient(api.url, timeout=120)
        end = live.latest_scrape_time(q)
        if end is None:
            raise SystemExit(f"{db}: no scrapes in this file")
        # every page's banner: the whole alert pack judged at the latest scrape (one window, its own)
        out["banner_p50_seconds"], out["banner_p95_seconds"] = timed(lambda: alerts.firing(q, end), repeats)
        for label in spans:
            w = live.Window.ending(end, windows.span(label).total_seconds())
            out[f"tables_{label}"] = ",".join(served_by(plan(w.start, w.end, w.step_seconds, Holdings.of(q))))
            for page, fn in PAGES.items():
                p50, p95 = timed(lambda f=fn, w=w: f(q, w), repeats)  # type: ignore[misc]
                out[f"{page}_{label}_p50_seconds"], out[f"{page}_{label}_p95_seconds"] = p50, p95
        out.update(render_pages(api.url, spans, repeats=3))
    finally:
        api.shutdown()
        api.server_close()
        wh.close()
    return out


PAGE_DIR = Path(__file__).parents[1] / "dashboard" / "views"
RANGE = {s: s for s in ("1h", "24h", "7d", "30d")}  # the span timed: the picker's key
RENDER = {  # page: its file, the key of its range control, the control's key per span timed
    "live": ("live.py", "range", RANGE),
    "experts": ("experts.py", "exp_range", RANGE),
    "users": ("users.py", "users_range", RANGE),
    "overhead": ("overhead.py", "ovh_range", RANGE),
    "dp": ("dp.py", "dp_range", RANGE),
    "slo": ("slo.py", "slo_range", RANGE),
    "spec": ("spec.py", "spec_range", RANGE),
    "roofline": ("roofline.py", "roof_range", RANGE),
    "cost": ("cost.py", "cost_window", {"24h": "24h", "7d": "week", "30d": "last_month"}),
}


def render_pages(api_url: str, spans: tuple[str, ...] = SPANS, repeats: int = 3) -> dict[str, float]:
    """Seconds to render each page whole (queries, figures, widgets; Streamlit's AppTest, no browser)
    after choosing each span's range, its query cache cleared each time."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    before, os.environ["MOEMETER_API"] = os.environ.get("MOEMETER_API"), api_url
    out: dict[str, float] = {}
    try:
        for page, (file, key, values) in RENDER.items():
            at = AppTest.from_file(str(PAGE_DIR / file), default_timeout=300)
            at.run()  # imports and the default range, not timed

            def render(at: AppTest = at, key: str = key, value: str = "", page: str = page) -> None:
                st.cache_data.clear()
                at.segmented_control(key=key).set_value(value).run()
                if at.exception:
                    raise RuntimeError(f"{page} page failed: {at.exception}")

            for label in (s for s in spans if s in values):
                value = values[label]
                p50, _ = timed(lambda v=value: render(value=v), repeats)  # type: ignore[misc]
                out[f"{page}_{label}_render_p50_seconds"] = p50
    finally:
        if before is None:
            os.environ.pop("MOEMETER_API", None)
        else:
            os.environ["MOEMETER_API"] = before
    return out


def main() -> None:
    if len(sys.argv) < 2 or not Path(sys.argv[1]).is_file() or any(s not in RANGE for s in sys.argv[2:]):
        raise SystemExit(f"usage: python -m benchmarks.pages WAREHOUSE.duckdb [SPAN...], SPAN one of {list(RANGE)}")
    print(json.dumps(time_pages(Path(sys.argv[1]), spans=tuple(sys.argv[2:]) or SPANS), indent=2))


if __name__ == "__main__":
    main()
