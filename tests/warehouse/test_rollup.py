"""Per-minute rollups keep counter increases exactly, gauges as mean and max."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pytest

from collectors.parse import parse_page
from dashboard.data import live
from moemeter.contract import TargetInfo
from warehouse import rollup
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.read import Holdings, plan, served_by
from warehouse.rollup import Retention

from .layouts import written_before

T0 = datetime(2026, 11, 30, 12, 0, 0)
DECODE = TargetInfo("decode-0", "http://x/metrics", "decode", 2, "test")


def page(gen: float, running: float) -> str:
    return (
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{engine="0"}} {gen}\nvllm:generation_tokens_total{{engine="1"}} {2 * gen}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
    )


@pytest.fixture
def con():
    c = duckdb.connect()
    apply_migrations(c)
    ing = Ingestor()
    gen = 0.0
    for k in range(37):  # 12:00:00 .. 12:03:00 every 5 s, an engine restart at 12:01:30
        gen = 10.0 * (k - 18) if k >= 18 else gen + 100.0 + k
        ing.write(
            c, ScrapeBatch(DECODE, T0 + timedelta(seconds=5 * k), True, 0.01, parse_page(page(gen, k % 7).encode()))
        )
    return c


def test_minutes_roll_up_when_a_later_minute_arrives(con):
    assert con.execute("SELECT through FROM rollup_state WHERE name = '1m'").fetchall() == [
        (T0 + timedelta(minutes=3),)
    ]
    minutes = [r[0] for r in con.execute("SELECT DISTINCT ts FROM increments_1m ORDER BY 1").fetchall()]
    assert minutes == [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]


def split_by_minute(rows):
    """The reference: each raw interval (ts - seconds, ts] shared among the minutes it covers."""
    out: dict[tuple[int, datetime], list[float]] = {}
    for sid, ts, delta, seconds in rows:
        lo = ts - timedelta(seconds=seconds)
        m = lo.replace(second=0, microsecond=0)
        while m < ts:
            part = (min(ts, m + timedelta(minutes=1)) - max(lo, m)).total_seconds()
            acc = out.setdefault((sid, m), [0.0, 0.0, 0.0])
            acc[0] += delta * part / seconds
            acc[1] += part
            acc[2] += part if delta == 0 else 0.0
            m += timedelta(minutes=1)
    return sorted((sid, m, *v) for (sid, m), v in out.items())


def test_counter_increases_reconcile_exactly_with_the_raw_ones(con):
    through = T0 + timedelta(minutes=3)
    raw = con.execute("SELECT series_id, ts, delta, seconds FROM increments WHERE ts < ?", [through]).fetchall()
    rolled = con.execute("""SELECT series_id, ts, sum(delta), sum(seconds), sum(idle_seconds) FROM increments_1m
                            GROUP BY ALL ORDER BY ALL""").fetchall()
    expected = split_by_minute(raw)
    assert [r[:2] for r in rolled] == [r[:2] for r in expected]
    assert [r[2:] for r in rolled] == [pytest.approx(r[2:], rel=1e-12) for r in expected]
    # 5 s scrapes from 12:00:00: minute 12:00 holds the intervals closing at 12:00:05 .. 12:01:00
    engine0 = [r for r in rolled if r[0] == raw[0][0]]
    assert engine0[0][1:4] == (T0, pytest.approx(sum(100.0 + k for k in range(1, 13))), 60.0)
    assert sum(r[2] for r in rolled) == pytest.approx(sum(r[2] for r in raw))  # nothing lost, nothing twice
    resets = con.execute("SELECT ts, sum(resets) FROM increments_1m GROUP BY ts HAVING sum(resets) > 0").fetchall()
    assert resets == [(T0 + timedelta(minutes=1), 2)]  # both engines' counters restarted at 12:01:30


def test_gauges_keep_mean_and_max(con):
    rows = con.execute("""SELECT x.ts, x.value, x.max, x.n FROM samples_1m x JOIN series s USING (series_id)
                          WHERE s.metric = 'vllm:num_requests_running' ORDER BY x.ts""").fetchall()
    first_minute = [k % 7 for k in range(12)]
    assert rows[0] == (T0, pytest.approx(sum(first_minute) / 12), 6.0, 12)
    assert (
        con.execute("""SELECT count(*) FROM samples_1m x JOIN series s USING (series_id)
                          WHERE s.kind = 'counter'""").fetchall()[0][0]
        == 0
    )


def test_pages_give_the_same_numbers_from_rollups_and_raw(con):
    q = LocalQuery(con)
    w = live.Window(T0, T0 + timedelta(minutes=3), 60)
    assert plan(w.start, w.end, w.step_seconds, Holdings.of(q))["r0"] == T0  # the minute table serves it
    rolled = live.token_rates(q, w)
    raw = split_by_minute(con.execute("SELECT series_id, ts, delta, seconds FROM increments").fetchall())
    per_minute: dict[datetime, list[float]] = {}
    for _, m, delta, seconds, _ in raw:
        acc = per_minute.setdefault(m, [0.0, 0.0])
        acc[0], acc[1] = acc[0] + delta, max(acc[1], seconds)
    assert rolled["bucket"].tolist() == [T0 + timedelta(minutes=k) for k in range(3)]
    assert rolled["generated_per_s"].tolist() == pytest.approx([d / s for d, s in per_minute.values()], rel=1e-12)


def test_window_steps_of_a_minute_or_more_are_whole_minutes():
    w = live.Window.between(T0, T0 + timedelta(hours=3, minutes=7))
    assert w.step_seconds % 60 == 0 and w.period == timedelta(minutes=1)
    assert served_by(plan(T0, T0 + timedelta(minutes=15), live.Window.ending(T0, 900).step_seconds, Holdings())) == (
        "increments",
    )


HOURS_START = datetime(2026, 11, 30, 10, 0, 0)


def three_hours(c: duckdb.DuckDBPyConnection) -> Ingestor:
    """One scrape a minute for three hours, 10:00 .. 13:00, into `c`."""
    ing = Ingestor(Retention(raw_days=1 / 24, minute_days=2 / 24, hour_days=30))
    gen = 0.0
    for k in range(0, 3 * 3600 + 60, 60):
        gen += 60.0
        ing.write(
            c,
            ScrapeBatch(
                DECODE, HOURS_START + timedelta(seconds=k), True, 0.01, parse_page(page(gen, (k // 60) % 5).encode())
            ),
        )
    return ing


@pytest.mark.slow("three hours of rounds rolled up")
def test_hours_roll_up_from_minutes_and_retention_keeps_what_is_not_rolled_up():
    c = duckdb.connect()
    apply_migrations(c)
    three_hours(c)
    start = HOURS_START
    hours = c.execute("SELECT ts, sum(delta), sum(seconds) FROM increments_1h GROUP BY ts ORDER BY ts").fetchall()
    # An hour holds the intervals that cover it: 10:00 those closing at 10:01 .. 11:00, 11:00 sixty more,
    # 12:00 those closing at 12:01 .. 12:59 (the one closing at 13:00 is not rolled up until 13:01); x3 for
    # both engines.
    assert hours == [
        (start, 60 * 60.0 * 3, 60 * 60.0 * 2),
        (start + timedelta(hours=1), 60 * 60.0 * 3, 60 * 60.0 * 2),
        (start + timedelta(hours=2), 59 * 60.0 * 3, 59 * 60.0 * 2),
    ]
    raw_total = 3 * 3600 / 60 * 60.0 * 3  # every increase since the first scrape, both engines
    rolled = c.execute("SELECT sum(delta) FROM increments_1h").fetchall()[0][0]
    not_yet = c.execute("SELECT sum(delta) FROM increments WHERE ts >= '2026-11-30 13:00'").fetchall()[0][0]
    assert rolled + not_yet == raw_total  # hours + the open minute reconcile with every raw increase
    # Retention ran when 13:00 closed hour 12: raw older than an hour is gone, newer kept.
    oldest_raw = c.execute("SELECT min(ts) FROM increments").fetchall()[0][0]
    assert start + timedelta(hours=1, minutes=59) <= oldest_raw <= start + timedelta(hours=2)
    oldest_minute = c.execute("SELECT min(ts) FROM increments_1m").fetchall()[0][0]
    assert oldest_minute >= start + timedelta(minutes=59)
    oldest_six = c.execute("SELECT min(ts) FROM increments_6m").fetchall()[0][0]
    assert oldest_minute - timedelta(minutes=6) < oldest_six <= oldest_minute  # dropped at the minutes' cutoff
    gauge = c.execute("""SELECT x.value, x.max, x.n FROM samples_1h x JOIN series s USING (series_id)
                         WHERE s.metric = 'vllm:num_requests_running' ORDER BY x.ts LIMIT 1""").fetchall()[0]
    assert gauge == (pytest.approx(sum(m % 5 for m in range(60)) / 60), 4.0, 60)
    # each hour was compacted when a later one closed: one row per series and hour, not one per minute
    assert c.execute("SELECT count(*), count(DISTINCT (ts, series_id)) FROM increments_1h").fetchall() == [(6, 6)]


def hour_sums(c: duckdb.DuckDBPyConnection) -> list[tuple]:
    return c.execute("""SELECT h.ts, s.metric, s.labels, sum(delta), sum(seconds), sum(resets), sum(idle_seconds)
                        FROM increments_1h h JOIN series s USING (series_id) GROUP BY ALL ORDER BY ALL""").fetchall()


@pytest.mark.slow("hours of minutes written twice, before and after compaction")
def test_a_file_of_uncompacted_hours_is_compacted_in_place_by_its_migration(monkeypatch):
    """A warehouse written before hours were compacted (migrations up to 013, a writer that only
    appends a row per minute to the hour) keeps every hour's sums through migration 014."""
    monkeypatch.setattr(rollup, "compact_hours", lambda *a: None)  # the writer before compaction
    new = duckdb.connect()
    apply_migrations(new)
    three_hours(new)
    c = written_before(new, 14)
    before = hour_sums(c)
    assert (
        c.execute("SELECT count(*) FROM increments_1h").fetchall()[0][0] == 2 * 179
    )  # a row per engine and minute rolled
    assert apply_migrations(c)[0] == "014_compact_hour_rows.sql"
    assert c.execute("SELECT count(*) FROM increments_1h").fetchall()[0][0] == 6
    after = hour_sums(c)
    assert [r[:3] for r in after] == [r[:3] for r in before]
    assert [r[3:] for r in after] == [pytest.approx(r[3:], rel=1e-12) for r in before]


def test_retention_never_drops_rows_that_are_not_rolled_up():
    c = duckdb.connect()
    apply_migrations(c)
    ing = Ingestor()
    for k in range(3):
        ing.write(c, ScrapeBatch(DECODE, T0 + timedelta(seconds=5 * k), True, 0.01, parse_page(page(k, 1).encode())))
    counts = "SELECT (SELECT count(*) FROM samples), (SELECT count(*) FROM increments), (SELECT count(*) FROM readings)"
    before = c.execute(counts).fetchall()
    deleted = ing.rollups.apply_retention(c, T0 + timedelta(days=400))
    assert deleted["increments"] == 0 and deleted["samples"] == 0  # nothing of this minute is rolled up yet
    assert c.execute(counts).fetchall() == before and before[0][2] == 9


def test_day_ranges_read_hours():
    week, day = live.Window.ending(T0, 7 * 86400), live.Window.ending(T0, 86400)
    # whole hours from the hour table, the edge minutes (the window ends a microsecond past T0) from the minutes
    assert served_by(plan(week.start, week.end, week.step_seconds, Holdings())) == (
        "increments",
        "increments_1m",
        "increments_1h",
    )
    assert served_by(plan(day.start, day.end, day.step_seconds, Holdings())) == ("increments", "increments_1m")
    assert (week.period, day.period) == (timedelta(hours=1), timedelta(minutes=1))


@pytest.mark.slow("hours of minutes scraped off the minute, compacted")
def test_an_hours_minutes_are_compacted_series_by_series_once_it_has_closed(monkeypatch):
    """Scraped every minute half a minute off the minute, each minute's rows come in two rolls. Ten
    minutes after an hour closes (rollup.MINUTE_REACH: until then an interval may still add to its
    last minute) the writer leaves one row per series and minute of it, stored series by series,
    with the sums of the rows they replace."""

    def scrape(c: duckdb.DuckDBPyConnection, ing: Ingestor, k: int) -> None:
        at = HOURS_START + timedelta(minutes=k, seconds=30)
        ing.write(c, ScrapeBatch(DECODE, at, True, 0.01, parse_page(page(60.0 * k, k % 5).encode())))

    plain, compacting = duckdb.connect(), duckdb.connect()
    with monkeypatch.context() as m:
        m.setattr(rollup, "compact_minutes", lambda *a: None)
        apply_migrations(plain)
        ing = Ingestor()
        for k in range(71):  # 10:00:30 .. 11:10:30
            scrape(plain, ing, k)
    apply_migrations(compacting)
    ing = Ingestor()
    hour = "SELECT count(*), count(DISTINCT (ts, series_id)) FROM increments_1m WHERE ts < ?"
    sums = (
        "SELECT ts, series_id, sum(delta), sum(seconds), sum(idle_seconds) FROM increments_1m GROUP BY ALL ORDER BY ALL"
    )
    for k in range(70):  # 11:09:30: the minute roll is through 11:09
        scrape(compacting, ing, k)
    ten = HOURS_START + timedelta(hours=1)
    assert compacting.execute(hour, [ten]).fetchall() == plain.execute(hour, [ten]).fetchall() == [(2 * 119, 2 * 60)]
    scrape(compacting, ing, 70)  # 11:10:30: through 11:10, ten minutes past 11:00
    assert compacting.execute(hour, [ten]).fetchall() == [(2 * 60, 2 * 60)]
    got, want = compacting.execute(sums).fetchall(), plain.execute(sums).fetchall()
    assert [r[:2] for r in got] == [r[:2] for r in want]
    assert [r[2:] for r in got] == [pytest.approx(r[2:], rel=1e-12) for r in want]
    stored = compacting.execute("SELECT series_id, ts FROM increments_1m WHERE ts < ? ORDER BY rowid", [ten]).fetchall()
    assert stored == sorted(stored)  # series by series, each one's minutes in order


def test_six_minute_rows_are_the_minutes_per_six_minutes_compacted_when_their_hour_closes():
    """Scraped every minute half a minute off the minute: each six minutes' rows hold the sums of
    its minutes' rows, per series; those of a closed hour are one per series and period, stored
    series by series (compacted with the hour rows), those of the open hour come a roll at a time."""
    c = duckdb.connect()
    apply_migrations(c)
    ing = Ingestor()
    for k in range(71):  # 10:00:30 .. 11:10:30
        at = HOURS_START + timedelta(minutes=k, seconds=30)
        ing.write(c, ScrapeBatch(DECODE, at, True, 0.01, parse_page(page(60.0 * k, k % 5).encode())))
    sums = """SELECT {period} AS ts, series_id, sum(delta), sum(seconds), sum(idle_seconds), sum(resets)
              FROM {table} GROUP BY ALL ORDER BY ALL"""
    minutes = c.execute(sums.format(period="time_bucket(INTERVAL 6 MINUTE, ts)", table="increments_1m")).fetchall()
    sixes = c.execute(sums.format(period="ts", table="increments_6m")).fetchall()
    assert [r[:2] for r in sixes] == [r[:2] for r in minutes] and len({r[0] for r in sixes}) == 12  # 10:00 .. 11:06
    assert [r[2:] for r in sixes] == [pytest.approx(r[2:], rel=1e-12) for r in minutes]
    eleven = HOURS_START + timedelta(hours=1)
    per_key = dict(
        c.execute(
            "SELECT ts, max(n) FROM (SELECT ts, count(*) AS n FROM increments_6m GROUP BY ts, series_id) GROUP BY ts"
        ).fetchall()
    )
    # 10:00 .. 10:48 compacted when 11:00 closed; the interval straddling 11:00 added to 10:54 in the
    # next roll (compacted with the hours when 12:00 closes: COMPACT_REACH); 11:00 .. 11:06 a row per roll
    assert [per_key[HOURS_START + timedelta(minutes=m)] for m in range(0, 60, 6)] == [1] * 9 + [2]
    assert per_key[eleven] > 2
    fifty_four = HOURS_START + timedelta(minutes=54)
    stored = c.execute("SELECT series_id, ts FROM increments_6m WHERE ts < ? ORDER BY rowid", [fifty_four]).fetchall()
    assert stored == sorted(stored)  # series by series, each one's periods in order


def test_a_day_is_read_in_six_minute_rows_and_a_week_in_hours():
    """A day's 12-minute step reads the six-minute rows where the file keeps them; six hours read
    minutes; a file without them (a lake's rack) reads the minutes at every step a day needs."""
    day, six = live.Window.ending(T0, 86400), live.Window.ending(T0, 6 * 3600)
    assert (day.step_seconds, six.step_seconds) == (720, 180)
    held = Holdings(sixes=True)
    assert served_by(plan(day.start, day.end, day.step_seconds, held)) == (
        "increments",
        "increments_1m",
        "increments_6m",
    )
    assert served_by(plan(six.start, six.end, six.step_seconds, held)) == ("increments", "increments_1m")
    assert served_by(plan(day.start, day.end, day.step_seconds, Holdings())) == ("increments", "increments_1m")
    assert live.Window.between(T0, T0 + timedelta(hours=15)).step_seconds == 720  # 450 s: whole six minutes


@pytest.mark.parametrize("days", [0.0, -1.0, float("nan"), float("inf"), 1e6])
def test_a_retention_of_no_time_or_past_ten_years_is_refused(days):
    """A negative one would put its cutoff in the future (every row dropped as it closed); NaN or
    one past ten years would stop the roll-ups (a timestamp's overflow)."""
    for name in ("raw_days", "minute_days", "hour_days"):
        with pytest.raises(ValueError, match=rf"Retention.{name} must be above 0 and at most 3,650 days"):
            Retention(**{name: days})
