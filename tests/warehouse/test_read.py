"""Windows exact at their edges (docs/definitions.md, Windows), checked against numbers worked out by hand.

A day of scrapes every 5 minutes, 20 s past (2026-11-27 23:55:20 .. 2026-11-29 00:05:20)
of a prefill instance (2 GPUs) and a decode instance (4 GPUs), ingested as the collector does,
rolled up as the writer does. The counters move at constant rates, so every share is simple:
  prefill prompt 10,000 tokens/s, of them 2,000/s prefix-cache hits; decode generated 4,000/s,
  except that decode counted nothing in the hour 06:00:20 .. 07:00:20 (idle: 4 GPU-hours).
Three windows partition the day 2026-11-28, their edges cutting through scrape intervals:
  W1 [00:00:00, 07:30:30) 27,030 s   W2 [07:30:30, 16:45:10) 33,280 s   W3 [16:45:10, 24:00:00) 26,090 s
W1 by hand, at the default sheet ($38.96/GPU-hour; tokens peak $0.006 hit, $0.30 miss, $1.20
output per million, half off-peak 16:30 .. 00:30 UTC):
  prompt 10,000 x 27,030 = 270,300,000; cached 54,060,000; generated 4,000 x (27,030 - 3,600) = 93,720,000
  prefill 2 GPUs x 7.508333 h x $38.96 = $585.05; decode 4 x 7.508333 h x $38.96 = $1,170.10
  decode idle 4 GPU-hours = $155.84
  revenue off-peak 00:00 .. 00:30 (1,800 s): 3.6M hits x 0.003 + 14.4M misses x 0.15 + 7.2M out x 0.60 = $6.4908
          peak 00:30 .. 07:30:30: 50.46M x 0.006 + 201.84M x 0.30 + 86.52M x 1.20 = $164.67876 -> $171.17
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from collectors.parse import parse_page
from dashboard.data import cost as cost_page
from dashboard.data import live, overhead
from moemeter.contract import TargetInfo
from warehouse.api import LocalQuery
from warehouse.cost import cost_report, daily_statement, pool_tokens
from warehouse.db import apply_migrations
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.prices import GpuPrice, PriceSheet, default_sheet
from warehouse.read import Holdings, plan, served_by, steps
from warehouse.rollup import Retention
from warehouse.sql import sql

DAY = datetime(2026, 11, 28)
FIRST, LAST = datetime(2026, 11, 27, 23, 55, 20), datetime(2026, 11, 29, 0, 5, 20)
EVERY = timedelta(minutes=5)
IDLE = (DAY + timedelta(hours=6, seconds=20), DAY + timedelta(hours=7, seconds=20))
W1 = (DAY, DAY + timedelta(hours=7, minutes=30, seconds=30))
W2 = (W1[1], DAY + timedelta(hours=16, minutes=45, seconds=10))
W3 = (W2[1], DAY + timedelta(days=1))
PREFILL = TargetInfo("prefill-0", "http://p/metrics", "prefill", 2, "test")
DECODE = TargetInfo("decode-0", "http://d/metrics", "decode", 4, "test")
POOLS = {"prefill": [("prefill-0", 2)], "decode": [("decode-0", 4)]}
PREFILL_ONLY = {"prefill": POOLS["prefill"], "decode": []}
FLAT = PriceSheet("flat", (GpuPrice(datetime(2026, 1, 1), "*", 2.0, "test"),), ())  # whole hours: the hour table serves


def prefill_page(prompt: float, hits: float) -> str:
    labels = 'engine="0",model_name="tiny-deepseek"'
    return (
        "# TYPE vllm:prompt_tokens counter\n"
        f"vllm:prompt_tokens_total{{{labels}}} {prompt}\n"
        "# TYPE vllm:prompt_tokens_by_source counter\n"
        f'vllm:prompt_tokens_by_source_total{{{labels},source="local_cache_hit"}} {hits}\n'
        f'vllm:prompt_tokens_by_source_total{{{labels},source="local_compute"}} {prompt - hits}\n'
    )


TTFT = "vllm:time_to_first_token_seconds"
BUCKETS = {"decode": {0.1: 3.0, 1.0: 9.0, float("inf"): 12.0}, "prefill": {0.1: 0.0, 1.0: 5.0, float("inf"): 5.0}}
"""Each pool's TTFT bucket counts per second, summed over its engines (decode: engine 0 counts a third,
engine 1 two thirds; decode's move only while it generates)."""


MEAN_TTFT = 0.25
"""Seconds: every pool's TTFT sum grows at this times its count (the +Inf bucket)."""


def histogram(role: str, seconds: float) -> str:
    shares = {"prefill": {"0": 1.0}, "decode": {"0": 1 / 3, "1": 2 / 3}}[role]
    lines = [f"# TYPE {TTFT} histogram"]
    for engine, share in shares.items():
        labels = f'engine="{engine}",model_name="tiny-deepseek"'
        for le, per_s in BUCKETS[role].items():
            bound = "+Inf" if le == float("inf") else le
            lines.append(f'{TTFT}_bucket{{{labels},le="{bound}"}} {per_s * share * seconds}')
        count = BUCKETS[role][float("inf")] * share * seconds
        lines += [f"{TTFT}_count{{{labels}}} {count}", f"{TTFT}_sum{{{labels}}} {MEAN_TTFT * count}"]
    return "\n".join(lines) + "\n"


def decode_page(generated: float) -> str:
    return (
        "# TYPE vllm:generation_tokens counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="tiny-deepseek"}} {generated}\n'
    ) + histogram("decode", generated / 4_000)


def ingest(retention: Retention | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    apply_migrations(con)
    ing = Ingestor(retention)
    t, generated = FIRST, 0.0
    while t <= LAST:
        s = (t - FIRST).total_seconds()
        if t > FIRST and not IDLE[0] < t <= IDLE[1]:
            generated += 4_000 * EVERY.total_seconds()
        page = prefill_page(10_000 * s, 2_000 * s) + histogram("prefill", s)
        round_ = [  # one round, as a collector stores it
            ScrapeBatch(PREFILL, t, True, 0.01, parse_page(page.encode())),
            ScrapeBatch(DECODE, t, True, 0.01, parse_page(decode_page(generated).encode())),
        ]
        ing.write_all(con, round_)
        t += EVERY
    return con


@pytest.fixture(scope="module")
def day_file(tmp_path_factory) -> Path:
    """The day, written once to a file that the fixtures without some rollups copy."""
    path = tmp_path_factory.mktemp("day") / "day.duckdb"
    con = ingest()  # in memory, then copied whole: a file's own writes take twice as long
    con.execute(f"ATTACH '{path}' AS day")
    con.execute("COPY FROM DATABASE memory TO day")
    con.close()
    return path


@pytest.fixture(scope="module")
def day(day_file):
    return LocalQuery(duckdb.connect(str(day_file), read_only=True))


@pytest.fixture(scope="module")
def dropped():
    """The day with raw rows kept half a day: those before 12:00:20 retention dropped."""
    return LocalQuery(ingest(Retention(raw_days=0.5)))


@pytest.fixture(scope="module")
def hours_only():
    """The day with raw rows kept 6 hours and minute rows 12: before about 12:00 only hour rows."""
    return LocalQuery(ingest(Retention(raw_days=0.25, minute_days=0.5)))


def without(day_file: Path, marker: str, *tables: str) -> LocalQuery:
    """The day in a file without some rollups (drop_rollups)."""
    copy = day_file.with_name(f"without-{marker}.duckdb")
    shutil.copyfile(day_file, copy)
    return drop_rollups(LocalQuery(duckdb.connect(str(copy))), marker, *tables)


def drop_rollups(q: LocalQuery, marker: str, *tables: str) -> LocalQuery:
    """`q` without some rollups: their tables dropped (nothing can read them) and the rollup_state
    row that says the file keeps them deleted."""
    for table in tables:
        q.con.execute(f"DROP TABLE {table}")
    q.con.execute("DELETE FROM rollup_state WHERE name = ?", [marker])
    return q


@pytest.fixture(scope="module")
def unpooled(day_file):
    """The day in a file without pool rollups (as a lake's rack reads)."""
    return without(day_file, "pool_histograms", "pool_histograms_1m", "pool_histograms_1h")


@pytest.fixture(scope="module")
def without_sixes(day_file):
    """The day in a file without six-minute rollups (a lake's rack, or one before migration 019)."""
    return without(day_file, "increments_6m", "increments_6m", "pool_histograms_6m")


def seconds(a: datetime, b: datetime) -> float:
    return max(0.0, (b - a).total_seconds())


def by_hand(a: datetime, b: datetime) -> dict[str, float]:
    """The window's numbers from the constant rates alone, at the default sheet."""
    idle = seconds(max(a, IDLE[0]), min(b, IDLE[1]))
    off = sum(
        seconds(max(a, x), min(b, y))
        for x, y in (
            (DAY - timedelta(hours=7, minutes=30), DAY + timedelta(minutes=30)),
            (DAY + timedelta(hours=16, minutes=30), DAY + timedelta(days=1, minutes=30)),
        )
    )
    total = seconds(a, b)

    def revenue(sec: float, idle_sec: float, hit: float, miss: float, out: float) -> float:
        return (2_000 * sec * hit + 8_000 * sec * miss + 4_000 * (sec - idle_sec) * out) / 1e6

    idle_off = seconds(max(a, IDLE[0]), min(b, IDLE[1], DAY + timedelta(minutes=30)))  # never: idle is peak
    return {
        "prompt": 10_000 * total,
        "cached": 2_000 * total,
        "generated": 4_000 * (total - idle),
        "prefill_cost": 2 * total / 3600 * 38.96,
        "decode_cost": 4 * total / 3600 * 38.96,
        "idle_gpu_hours": 4 * idle / 3600,
        "idle_cost": 4 * idle / 3600 * 38.96,
        "revenue": revenue(total - off, idle - idle_off, 0.006, 0.30, 1.20) + revenue(off, idle_off, 0.003, 0.15, 0.60),
    }


def numbers(q: LocalQuery, window: tuple[datetime, datetime], sheet: PriceSheet | None = None) -> dict[str, float]:
    r = cost_report(q, POOLS, *window, sheet or default_sheet())
    return {
        "prompt": r.prompt_tokens,
        "cached": r.cached_prompt_tokens,
        "generated": r.generated_tokens,
        "prefill_cost": r.prefill.cost_usd,
        "decode_cost": r.decode.cost_usd,
        "idle_gpu_hours": r.decode.idle_gpu_hours + r.prefill.idle_gpu_hours,
        "idle_cost": r.decode.idle_cost_usd + r.prefill.idle_cost_usd,
        "revenue": r.revenue_usd or 0.0,
    }


def test_the_first_window_matches_the_numbers_worked_out_by_hand(day):
    r = cost_report(day, POOLS, *W1, default_sheet()).as_json()
    pf, dc, tot = r["pools"]["prefill"], r["pools"]["decode"], r["total"]
    assert (pf["prompt_tokens"], pf["cached_prompt_tokens"], dc["generated_tokens"]) == (
        270_300_000,
        54_060_000,
        93_720_000,
    )
    assert (pf["cost_usd"], dc["cost_usd"], dc["idle_gpu_hours"], dc["idle_cost_usd"]) == (585.05, 1170.10, 4.0, 155.84)
    assert pf["idle_gpu_hours"] == 0.0 and tot["revenue_usd"] == 171.17
    assert r["window"]["first_count"] == "2026-11-28T00:00:00Z" and r["window"]["last_count"] == "2026-11-28T07:30:20Z"


@pytest.mark.parametrize("window", [W1, W2, W3], ids=["W1", "W2", "W3"])
def test_each_window_is_exact_where_it_cuts_through_a_scrape_interval(day, window):
    got, want = numbers(day, window), by_hand(*window)
    assert got == {k: pytest.approx(v, rel=1e-12, abs=1e-6) for k, v in want.items()}


def test_a_window_ending_on_a_scrape_keeps_the_interval_closing_there(day):
    end = DAY + timedelta(hours=10, minutes=5, seconds=20)  # a scrape time
    got = numbers(day, (DAY + timedelta(hours=10), end))
    assert got["prompt"] == pytest.approx(10_000 * 320) and got["generated"] == pytest.approx(4_000 * 320)


def test_three_windows_partition_the_day_to_the_token_and_the_cent(day):
    whole = numbers(day, (DAY, DAY + timedelta(days=1)))
    parts = [numbers(day, w) for w in (W1, W2, W3)]
    for key, value in whole.items():
        assert sum(p[key] for p in parts) == pytest.approx(value, rel=1e-12, abs=1e-6), key
    assert round(whole["prompt"]) == 864_000_000 and round(whole["generated"]) == 4_000 * (86_400 - 3_600)
    assert round(whole["prefill_cost"] + whole["decode_cost"], 2) == round(6 * 24 * 38.96, 2)


def test_raw_minute_and_hour_tables_give_the_same_numbers(day, dropped):
    """The default sheet changes prices on half hours (minute table and raw edges serve its windows),
    a flat one only on whole hours (hour table); a database whose raw rows before 12:00:20 were dropped by
    retention serves W1's edges from the minute table. Each gives the numbers of the raw rows."""
    held = Holdings.of(day)
    assert plan(*W1, 1800, held)["h0"] == plan(*W1, 1800, held)["h1"]  # no hour table
    p = plan(*W1, 3600, held)
    assert (p["h0"], p["h1"]) == (DAY, DAY + timedelta(hours=7))  # hours 00:00 .. 07:00 from the hour table
    for window in (W1, W2, W3):
        hourly, want = numbers(day, window, FLAT), by_hand(*window)
        assert hourly["prompt"] == pytest.approx(want["prompt"], rel=1e-12)
        assert hourly["generated"] == pytest.approx(want["generated"], rel=1e-12)
        assert hourly["idle_gpu_hours"] == pytest.approx(want["idle_gpu_hours"], abs=1e-9)
        assert hourly["prefill_cost"] == pytest.approx(2 * seconds(*window) / 3600 * 2.0)
    assert Holdings.of(dropped).raw_from == datetime(2026, 11, 28, 12, 0, 20)
    for window in (W1, W2, W3):
        assert numbers(dropped, window) == {
            k: pytest.approx(v, rel=1e-12, abs=1e-6) for k, v in numbers(day, window).items()
        }


@pytest.mark.parametrize("step", [720, 1800, 7200, None], ids=["12min", "30min", "2h", "whole"])
def test_six_minute_rows_give_the_minutes_numbers(day, without_sixes, step):
    """A step of whole six minutes reads the six-minute rows between the minutes at a window's
    edges and its whole hours: the pages' token rates, and the costs, are those the minute rows
    give in a file without them, for windows that cut through scrape intervals. The costs read the
    minute rows either way (what the lake holds), so they are the same to the bit."""
    held = Holdings.of(day)
    assert held.sixes and not Holdings.of(without_sixes).sixes
    p, hours = plan(*W2, step, held), step is None or step % 3600 == 0
    at = (datetime(2026, 11, 28, *hm) for hm in ((7, 31), (7, 36), (8, 0), (16, 0), (16, 42), (16, 45)))
    r0, s0, h0, h1, s1, r1 = at if hours else (a if k in (0, 1, 4, 5) else None for k, a in enumerate(at))
    assert (p["r0"], p["s0"], p["s1"], p["r1"]) == (r0, s0, s1, r1)
    assert (p["h0"], p["h1"]) == ((h0, h1) if hours else (s0, s0))  # minutes, six minutes, hours nested
    tables = ("increments", "increments_1m", "increments_6m")
    assert served_by(p) == (*tables, "increments_1h") if hours else tables
    assert not {"increments_6m"} & set(served_by(plan(*W2, step, Holdings.of(without_sixes))))
    for window in (W1, W2, W3, (FIRST, LAST)):
        w = live.Window(*window, step) if step else live.Window.between(*window)
        got, want = live.token_rates(day, w), live.token_rates(without_sixes, w)
        assert got[["bucket", "role"]].equals(want[["bucket", "role"]]) and len(got) > 1
        for column in ("prompt_per_s", "cached_per_s", "generated_per_s"):
            assert got[column].to_numpy() == pytest.approx(want[column].to_numpy(), rel=1e-12), column
        assert numbers(day, window) == numbers(without_sixes, window)
        report = cost_report(day, POOLS, *window, default_sheet()).as_json()
        assert report == cost_report(without_sixes, POOLS, *window, default_sheet()).as_json()


def test_a_window_whose_minutes_were_dropped_takes_its_share_of_the_hours(day, hours_only):
    """Retention dropped W1's raw and minute rows: its hour rows serve it, the hour it ends in
    prorated (07:00 .. 07:30:30 of the 07:00 row, not the whole row). The prefill pool's tokens
    come at a constant rate, so its share is exact, in one bucket and in steps of 15 minutes."""
    held = Holdings.of(hours_only)
    assert held.minutes_from is not None and held.minutes_from > W1[1]
    p = plan(*W1, None, held)
    assert (p["h0"], p["h1"]) == W1  # no whole hour at the end: the last one is cut
    got, want = numbers(hours_only, W1), by_hand(*W1)
    for key in ("prompt", "cached"):
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    chart = cost_page.over_time(hours_only, POOLS, default_sheet(), *W1, timedelta(minutes=15))
    assert chart["prompt_tokens"].sum() == pytest.approx(want["prompt"], rel=1e-12)


def ttft(q: LocalQuery, window: tuple[datetime, datetime], step: int) -> pd.DataFrame:
    """The Live page's TTFT bucket counts per step, pool and bound (a pooled statement)."""
    return live.histograms_counts(q, live.Window(*window, step), [TTFT])[TTFT]


@pytest.mark.parametrize("step", [150, 600, 720, 3600], ids=["raw", "minutes", "sixes", "hours"])
def test_histograms_summed_per_pool_match_the_rates_and_the_per_series_rollups(day, unpooled, dropped, step):
    """The pool rollups serve the whole minutes and hours of a pooled statement, the raw rows its edges:
    each window's counts are the rates times the seconds counted, and every step's counts are those
    of the same file read without pool rollups (the per-series rows summed per pool), and of a file
    whose raw rows before 12:00:20 retention dropped."""
    assert Holdings.of(day).pooled and not Holdings.of(unpooled).pooled
    for window in (W1, W2, W3):
        got = ttft(day, window, step)
        whole = got.groupby(["role", "le"])["count"].sum()
        active = {
            "prefill": seconds(*window),
            "decode": seconds(*window) - seconds(max(window[0], IDLE[0]), min(window[1], IDLE[1])),
        }
        want = pd.Series({(role, le): n * active[role] for role, by_le in BUCKETS.items() for le, n in by_le.items()})
        assert whole.to_dict() == pytest.approx(want.to_dict(), rel=1e-12, abs=1e-6)
        for other in (unpooled, dropped):
            again = ttft(other, window, step)
            assert again[["bucket", "role", "le"]].equals(got[["bucket", "role", "le"]])
            assert again["count"].to_numpy() == pytest.approx(got["count"].to_numpy(), rel=1e-12, abs=1e-6)
        # a sum and a count pooled: the prefill pool's mean TTFT in every step (CPU overhead page)
        for q in (day, unpooled, dropped):
            means = overhead.api_server_delay(q, live.Window(*window, step))["ttft_ms"]
            assert len(means) >= seconds(*window) // step
            assert means.to_numpy() == pytest.approx(1000 * MEAN_TTFT, rel=1e-12)


@pytest.mark.parametrize("window", [W1, W2, W3], ids=["W1", "W2", "W3"])
def test_a_report_without_revenue_reads_whole_hours_and_costs_the_same_to_the_cent(day, window):
    """The default sheet's off-peak half hours make a report's steps half hours (minute rows for
    every hour); its GPU prices change on whole hours, so a report without revenue (the Fleet
    page's) counts in hours, from the hour table, with the same cost, idle cost and tokens."""
    sheet = default_sheet()
    assert (sheet.step_seconds(), sheet.step_seconds(tokens=False)) == (1800, 3600)
    held = Holdings.of(day)
    assert plan(*window, 1800, held)["h0"] == plan(*window, 1800, held)["h1"]  # no hour rows
    p = plan(*window, 3600, held)
    assert p["h0"] < p["h1"], p  # whole hours from the hour table
    full = cost_report(day, POOLS, *window, sheet).as_json()
    fleet = cost_report(day, POOLS, *window, sheet, revenue_too=False).as_json()
    assert full["total"]["revenue_usd"] is not None and fleet["total"]["revenue_usd"] is None
    for pool in ("prefill", "decode"):
        assert fleet["pools"][pool] == full["pools"][pool], pool
    assert fleet["total"]["cost_usd"] == full["total"]["cost_usd"]
    assert fleet["users"] == full["users"]


def test_the_cost_page_the_report_and_the_live_page_count_the_same_tokens(day):
    """The Cost page's chart sums, the report and the Live page's rates x seconds, for one window."""
    r = cost_report(day, POOLS, *W2, default_sheet())
    chart = cost_page.over_time(day, POOLS, default_sheet(), *W2, timedelta(minutes=15))
    assert chart["prompt_tokens"].sum() == pytest.approx(r.prompt_tokens, rel=1e-12)
    assert chart["generated_tokens"].sum() == pytest.approx(r.generated_tokens, rel=1e-12)
    w = live.Window.between(*W2, live.scrape_interval(day))
    rates = live.token_rates(day, w)
    width = [seconds(max(b, W2[0]), min(b + timedelta(seconds=w.step_seconds), W2[1])) for b in rates["bucket"]]
    rates["seconds"] = width
    by_role = rates.assign(prompt=rates.prompt_per_s * rates.seconds, generated=rates.generated_per_s * rates.seconds)
    assert by_role.loc[by_role.role == "prefill", "prompt"].sum() == pytest.approx(r.prompt_tokens, rel=1e-12)
    assert by_role.loc[by_role.role == "decode", "generated"].sum() == pytest.approx(r.generated_tokens, rel=1e-12)


def refuse(sql: str, params: object = None) -> pd.DataFrame:
    raise AssertionError(f"read again: {sql.splitlines()[0]}")


@pytest.mark.parametrize("window", [W1, W2, W3, (FIRST, LAST)], ids=["W1", "W2", "W3", "all"])
def test_the_cost_chart_sums_the_reports_steps_to_what_the_counters_give_in_its_own(day, window):
    """The Cost page's chart in hours and days, from its report's half-hour steps (no read: `refuse`
    fails the test), is the chart read from the counters in those steps: same buckets, same tokens."""
    sheet = default_sheet()
    r = cost_report(day, POOLS, *window, sheet)
    assert r.step_seconds == 1800 and len(r.tokens)
    for step in (timedelta(hours=1), timedelta(days=1)):
        summed = cost_page.over_time(refuse, POOLS, sheet, *window, step, r)
        pd.testing.assert_frame_equal(summed, cost_page.over_time(day, POOLS, sheet, *window, step), rtol=1e-12)
    # a step the report's does not divide is read from the counters
    with pytest.raises(AssertionError, match="read again"):
        cost_page.over_time(refuse, POOLS, sheet, *window, timedelta(minutes=15), r)


def test_each_day_of_the_statement_is_that_days_report_from_one_read_of_the_counters(day):
    """The daily statement over 2026-11-27 23:55:20 .. 2026-11-29 00:05:20 reads the pools' tokens
    once and gives each day what a report of that day alone gives, to the cent and the token."""
    sheet = default_sheet()
    statements: list[str] = []

    def counted(sql: str, params: object = None) -> pd.DataFrame:
        statements.append(sql)
        return day(sql, params)  # type: ignore[arg-type]

    rows = daily_statement(counted, POOLS, FIRST, LAST, sheet)
    assert sum(s.startswith(sql("pool_tokens").splitlines()[0]) for s in statements) == 1
    assert list(rows.day) == ["2026-11-27", "2026-11-28", "2026-11-29"]
    for row, (a, b) in zip(rows.itertuples(), [(FIRST, DAY), (DAY, DAY + timedelta(days=1)), (W3[1], LAST)]):
        r = cost_report(day, POOLS, a, b, sheet)
        assert (row.gpu_hours, row.cost_usd) == (
            round(r.prefill.gpu_hours + r.decode.gpu_hours, 3),
            round(r.cost_usd, 2),
        )
        assert (row.input_tokens, row.output_tokens) == (round(r.prompt_tokens), round(r.generated_tokens))
        assert row.revenue_usd == round(r.revenue_usd, 2)
    assert rows.input_tokens[1] == 10_000 * 86_400


def test_an_interval_hours_long_counts_its_share_in_a_window_it_reaches_back_into():
    """A target scraped at 10:00 and next at 13:00 (the collector was down): the increase of 9,000
    tokens spreads over the three hours, so 11:00:30 .. 11:59:30 holds 59/180 of it, whether the
    raw row or its rolled-up minutes and hours serve the window."""
    con = duckdb.connect()
    apply_migrations(con)
    ing = Ingestor()
    for t, prompt in ((DAY + timedelta(hours=10), 0.0), (DAY + timedelta(hours=13), 9_000.0)):
        ing.write(con, ScrapeBatch(PREFILL, t, True, 0.01, parse_page(prefill_page(prompt, 0.0).encode())))
    window = (DAY + timedelta(hours=11, seconds=30), DAY + timedelta(hours=11, minutes=59, seconds=30))
    assert numbers(LocalQuery(con), window)["prompt"] == pytest.approx(9_000 * 59 / 180)
    ing.write(
        con,
        ScrapeBatch(
            PREFILL, DAY + timedelta(hours=14, minutes=1), True, 0.01, parse_page(prefill_page(9_000.0, 0.0).encode())
        ),
    )
    assert Holdings.of(LocalQuery(con)).through == DAY + timedelta(hours=14, minutes=1)  # rolled up now
    assert numbers(LocalQuery(con), window)["prompt"] == pytest.approx(9_000 * 59 / 180)
    assert Holdings.of(LocalQuery(con)).longest_seconds == 3 * 3600


def test_a_restart_after_a_gap_counts_from_the_process_start_not_over_the_gap():
    """Scraped at 12:00 (5,000 prompt tokens so far), the collector away, the engine restarted at
    12:50 and showing 600 at 13:00: those 600 were counted in 12:50 .. 13:00 (vLLM's
    process_start_time_seconds says when), none in the hour before."""
    con = duckdb.connect()
    apply_migrations(con)
    ing = Ingestor()
    restarted = DAY + timedelta(hours=12, minutes=50)
    for t, prompt, started in (
        (DAY + timedelta(hours=12), 5_000.0, DAY),
        (DAY + timedelta(hours=13), 600.0, restarted),
    ):
        page = (
            prefill_page(prompt, 0.0)
            + f"process_start_time_seconds {(started - datetime(1970, 1, 1)).total_seconds()}\n"
        )
        ing.write(con, ScrapeBatch(PREFILL, t, True, 0.01, parse_page(page.encode())))
    q = LocalQuery(con)
    assert numbers(q, (DAY + timedelta(hours=12), restarted))["prompt"] == 0
    assert numbers(q, (restarted, DAY + timedelta(hours=13, seconds=1)))["prompt"] == pytest.approx(600)
    assert numbers(q, (restarted + timedelta(minutes=5), DAY + timedelta(hours=13)))["prompt"] == pytest.approx(300)


ADDS = (0.1, 100_000_000.2, 0.3)  # tokens a minute: the twin's prefill counts 2e8 a minute


def engines_in_order(order: list[int], every: int = 1, scrapes: int = 13) -> LocalQuery:
    """Three prefill engines whose counters add ADDS a minute (a counter is a double: a sum of them
    rounds), scraped `scrapes` times `every` minutes apart, each page listing them in `order`: the
    file stores the same rows, in that order."""
    con = duckdb.connect()
    apply_migrations(con)
    ing = Ingestor()
    for n in range(0, every * scrapes, every):
        page = "# TYPE vllm:prompt_tokens counter\n" + "".join(
            f'vllm:prompt_tokens_total{{engine="{e}",model_name="tiny-deepseek"}} {n * ADDS[e]!r}\n' for e in order
        )
        ing.write(con, ScrapeBatch(PREFILL, DAY + timedelta(minutes=n), True, 0.01, parse_page(page.encode())))
    return LocalQuery(con)


def test_the_same_rows_in_another_order_cost_the_same_to_the_bit():
    """A sum of doubles depends on the order it adds them in, which the threads and the file's layout
    decide; a rack's file and its copy in the lake once gave reports a thousandth apart where a
    figure was a tie at its rounding (the fleet test, on CI). The cost statement sums exactly: the
    same rows give the same bits whatever their order."""
    ahead, behind = engines_in_order([0, 1, 2]), engines_in_order([2, 1, 0])
    for start, end, step in (
        (DAY + timedelta(seconds=20), DAY + timedelta(minutes=8, seconds=40), None),
        (DAY, DAY + timedelta(minutes=9), 60),
        (DAY + timedelta(seconds=30), DAY + timedelta(minutes=9), 120),
    ):
        a, b = (pool_tokens(q, PREFILL_ONLY, start, end, step) for q in (ahead, behind))
        assert len(a) and a["prompt"].sum() == pytest.approx(sum(ADDS) * (end - start).total_seconds() / 60)
        pd.testing.assert_frame_equal(a, b, check_exact=True)
        reports = [cost_report(q, PREFILL_ONLY, start, end, default_sheet()).as_json() for q in (ahead, behind)]
        assert reports[0] == reports[1]


def test_the_cost_reads_the_rows_a_racks_copy_in_the_lake_holds():
    """The lake holds no six-minute rows, and a six-minute row is its minutes added as doubles (its
    last bit may differ from theirs summed exactly): the cost reads the minute rows with or without
    them, so a rack's file and its copy in the lake give the same bits."""
    # scraped every 7 minutes: each roll-up adds a six-minute row of the minutes' shares it closed
    held = engines_in_order([0, 1, 2], 7)
    lake_like = drop_rollups(engines_in_order([0, 1, 2], 7), "increments_6m", "increments_6m", "pool_histograms_6m")
    assert Holdings.of(held).sixes and held.con.execute("SELECT count(*) FROM increments_6m").fetchone()[0]
    assert not Holdings.of(lake_like).sixes
    for step in (360, 720, None):
        a, b = (pool_tokens(q, PREFILL_ONLY, DAY, DAY + timedelta(minutes=84), step) for q in (held, lake_like))
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_a_counter_too_large_to_sum_exactly_is_still_counted():
    """A broken exporter's counter that jumps by 1e20 and 1e300 in a scrape interval (past what the
    exact sum holds) is added as a double: the report counts it, and fails on nothing."""
    con = duckdb.connect()
    apply_migrations(con)
    ing = Ingestor()
    for n, prompt in enumerate((0.0, 7.0, 1e20, 1e300)):
        page = prefill_page(prompt, 0.0).encode()
        ing.write(con, ScrapeBatch(PREFILL, DAY + timedelta(minutes=n), True, 0.01, parse_page(page)))
    q = LocalQuery(con)
    assert pool_tokens(q, PREFILL_ONLY, DAY, DAY + timedelta(minutes=2), None)["prompt"].tolist() == [1e20]
    assert pool_tokens(q, PREFILL_ONLY, DAY, DAY + timedelta(minutes=3), None)["prompt"].tolist() == [1e300]
    assert pool_tokens(q, PREFILL_ONLY, DAY, DAY + timedelta(minutes=1), None)["prompt"].tolist() == [7.0]


def test_steps_are_epoch_aligned_and_cut_to_the_window():
    """One home for "each step of the window": the cost report, its chart and the FOCUS export
    price a step over the part of it inside the window (a window's first step priced from the
    window's start into the next step was a bug, 5ebd3bc)."""
    day, hour = datetime(2026, 12, 1), timedelta(hours=1)
    t = lambda h, m=0: day + timedelta(hours=h, minutes=m)  # noqa: E731
    assert list(steps(t(10, 20), t(11, 40), hour)) == [(t(10), t(10, 20), t(11)), (t(11), t(11), t(11, 40))]
    assert list(steps(t(10), t(12), hour)) == [(t(10), t(10), t(11)), (t(11), t(11), t(12))]
    assert list(steps(t(10, 5), t(10, 10), hour)) == [(t(10), t(10, 5), t(10, 10))]
    assert list(steps(t(10), t(10), hour)) == []
