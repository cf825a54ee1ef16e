"""Ingest: stable series ids, raw samples, and increases by Prometheus' increase() rules."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pytest

from collectors.parse import parse_page
from moemeter.contract import TargetInfo
from warehouse.db import apply_migrations
from warehouse.ingest import Ingestor, ScrapeBatch, is_dcgm_blank

T0 = datetime(2026, 11, 30, 12, 0, 0)
TARGET = TargetInfo("decode-0", "http://x/metrics", "decode", 64, "test")


@pytest.fixture
def con():
    c = duckdb.connect()
    apply_migrations(c)
    return c


def ingest(con, ing, text: str, at: datetime, target=TARGET):
    batch = ScrapeBatch(target, at, True, 0.01, parse_page(text.encode()))
    return ing.write(con, batch)


def increments(con, metric: str) -> list[tuple[float, bool]]:
    return con.execute(
        """SELECT delta, reset FROM increments JOIN series USING (series_id)
                          WHERE metric = ? ORDER BY ts""",
        [metric],
    ).fetchall()


def page(value: float) -> str:
    return f'# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{{engine="0"}} {value}\n'


def test_first_sight_gives_no_increase_then_differences(con):
    ing = Ingestor()
    for i, v in enumerate([100, 130, 170]):
        ingest(con, ing, page(v), T0 + timedelta(seconds=5 * i))
    assert increments(con, "vllm:generation_tokens_total") == [(30.0, False), (40.0, False)]
    secs = con.execute("SELECT seconds FROM increments").fetchall()
    assert secs == [(5.0,), (5.0,)]


def test_a_counter_that_goes_down_is_a_restart_never_a_negative_rate(con):
    ing = Ingestor()
    for i, v in enumerate([1000, 1200, 50, 80]):
        ingest(con, ing, page(v), T0 + timedelta(seconds=5 * i))
    assert increments(con, "vllm:generation_tokens_total") == [(200.0, False), (50.0, True), (30.0, False)]
    assert con.execute("SELECT min(delta) FROM increments").fetchone()[0] >= 0


def test_out_of_order_and_repeated_scrapes_add_no_increase(con):
    ing = Ingestor()
    ingest(con, ing, page(10), T0 + timedelta(seconds=10))
    ingest(con, ing, page(5), T0)  # late arrival from the past
    ingest(con, ing, page(10), T0 + timedelta(seconds=10))  # duplicate
    ingest(con, ing, page(25), T0 + timedelta(seconds=15))
    assert increments(con, "vllm:generation_tokens_total") == [(15.0, False)]


def test_an_ingestor_restarted_on_the_same_file_continues_without_double_counting(tmp_path):
    path = str(tmp_path / "w.duckdb")
    c = duckdb.connect(path)
    apply_migrations(c)
    ingest(c, Ingestor(), page(100), T0)
    ingest(c, Ingestor(), page(160), T0 + timedelta(seconds=5))  # a new process
    assert increments(c, "vllm:generation_tokens_total") == [(60.0, False)]


def test_histogram_buckets_count_and_sum_get_increases_gauges_do_not(con, capture):
    ing = Ingestor()
    text = capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt")
    ingest(con, ing, text, T0)
    bumped = text.replace(
        'vllm:num_requests_running{engine="0",model_name="tiny-deepseek"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="tiny-deepseek"} 7.0',
    )
    bumped = bumped.replace(
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-deepseek"} 3.0',
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-deepseek"} 5.0',
    )
    ingest(con, ing, bumped, T0 + timedelta(seconds=5))
    assert increments(con, "vllm:time_to_first_token_seconds_count") == [(2.0, False)]
    assert increments(con, "vllm:num_requests_running") == []
    kinds = dict(con.execute("SELECT metric, kind FROM series").fetchall())
    assert kinds["vllm:time_to_first_token_seconds_bucket"] == "histogram"
    les = con.execute("""SELECT le FROM series WHERE metric = 'vllm:time_to_first_token_seconds_bucket'
                         ORDER BY le""").fetchall()
    assert les[0][0] == 0.001 and les[-1][0] == float("inf")
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] == 2 * len(parse_page(text.encode()))


def test_dcgm_blank_values_are_stored_as_missing(con):
    ing = Ingestor()
    text = (
        '# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge\nDCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775794\n'
        '# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{gpu="0"} 61\n'
        '# TYPE DCGM_FI_DEV_POWER_USAGE gauge\nDCGM_FI_DEV_POWER_USAGE{gpu="0"} 140737488355328\n'
    )
    ingest(con, ing, text, T0, TargetInfo("tray", "http://x", "gpu", 4))
    rows = dict(con.execute("SELECT metric, value FROM samples JOIN series USING (series_id)").fetchall())
    assert rows == {"DCGM_FI_DEV_MEMORY_TEMP": None, "DCGM_FI_DEV_GPU_TEMP": 61.0, "DCGM_FI_DEV_POWER_USAGE": None}
    assert not is_dcgm_blank("vllm:prompt_tokens_total", 9.3e18)


def test_a_duplicate_sample_in_one_page_is_stored_once(con):
    ing = Ingestor()
    n = ingest(con, ing, "a 1\na 2\n", T0, TargetInfo("r", "http://x", "router", 0))
    assert n == 1
    assert con.execute("SELECT value FROM samples").fetchall() == [(1.0,)]


def test_an_unhealthy_scrape_is_stored_as_data(con):
    ing = Ingestor()
    ing.write(con, ScrapeBatch(TARGET, T0, False, 4.0, error="timeout after 4s"))
    assert con.execute("SELECT target, up, error FROM scrapes").fetchall() == [("decode-0", False, "timeout after 4s")]


def test_negative_or_infinite_counter_values_add_no_increase(con):
    ing = Ingestor()
    for i, v in enumerate(["5", "-1", "+Inf", "+Inf", "9"]):
        ingest(con, ing, page(v), T0 + timedelta(seconds=5 * i))  # type: ignore[arg-type]
    assert increments(con, "vllm:generation_tokens_total") == [(4.0, False)]  # 5 -> 9 only


def test_rounds_written_together_store_what_batch_by_batch_writes_store():
    """write_all inserts the raw rows of a round at once, and those of each round before the next
    round rolls up the minutes it closes: every table ends as writing each batch alone leaves it."""
    other = TargetInfo("prefill-0", "http://y/metrics", "prefill", 8, "test")
    stamps = [T0 + timedelta(seconds=s) for s in (20, 40, 60, 65, 125, 130)]  # crossing two minutes
    batches = [
        ScrapeBatch(t, at, True, 0.01, parse_page((page(100 + 7 * k + i) + f"g {k}\nDCGM_X {9.3e18}\n").encode()))
        for k, at in enumerate(stamps)
        for i, t in enumerate((TARGET, other))
    ]
    tables = ("samples", "increments", "increments_1m", "samples_1m", "scrapes", "series", "rollup_state")
    stores = []
    for write in (
        lambda ing, con: sum(ing.write(con, b) for b in batches),
        lambda ing, con: ing.write_all(con, batches),
    ):
        c = duckdb.connect()
        apply_migrations(c)
        assert write(Ingestor(), c) == 3 * len(batches)
        stores.append({t: c.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables})
    alone, together = stores
    assert together == alone
    assert len(alone["increments_1m"]) >= 4 and len(alone["increments"]) == 2 * (len(stamps) - 1)
