"""Ingest: stable series ids, raw samples, and increases by Prometheus' increase() rules."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta

import duckdb
import pytest

from collectors.parse import PageCache, parse_page
from moemeter.contract import Page, TargetInfo
from warehouse.db import apply_migrations
from warehouse.export import named_by_key
from warehouse.ingest import Ingestor, ScrapeBatch, is_dcgm_blank, series_key

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


def read_back(con) -> dict[tuple[datetime, int], float]:
    """Every reading the `readings` view gives back, by time and series key."""
    return {
        (ts, key): value
        for ts, key, value in con.execute(
            "SELECT r.ts, s.series_key, r.value FROM readings r JOIN series s USING (series_id)"
        ).fetchall()
    }


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
    said = con.execute("SELECT kind, reason, count FROM rejected ORDER BY ts").fetchall()
    assert said == [("series", "counter readings at or before the series' last reading: not stored", 1)] * 2
    assert con.execute("SELECT count(*) FROM readings").fetchall() == [(2,)]  # 10 at 0:10, 25 at 0:15


def test_an_ingestor_restarted_on_the_same_file_continues_without_double_counting(tmp_path):
    path = str(tmp_path / "w.duckdb")
    c = duckdb.connect(path)
    apply_migrations(c)
    ingest(c, Ingestor(), page(100), T0)
    ingest(c, Ingestor(), page(160), T0 + timedelta(seconds=5))  # a new process
    assert increments(c, "vllm:generation_tokens_total") == [(60.0, False)]


def test_a_targets_row_keeps_its_first_sight_and_follows_its_last_scrape_and_its_latest_address(con):
    """A target's row is written whole when the target is new or changed (another url, role...) and
    only its last_seen moves otherwise, by a writer that runs on or by one restarted on the file."""
    moved = TargetInfo("decode-0", "http://y/metrics", "prefill", 8, "test", "host-b")
    other = TargetInfo("decode-1", "http://z/metrics", "decode", 64, "test")
    first, restarted = Ingestor(), Ingestor()
    rounds = [(first, TARGET), (first, TARGET), (Ingestor(), TARGET), (restarted, moved), (restarted, moved)]
    for i, (ing, target) in enumerate([*rounds, (restarted, other)]):
        ingest(con, ing, page(100 + i), T0 + timedelta(seconds=5 * i), target)
    rows = con.execute(
        "SELECT name, url, role, gpus, hostname, first_seen, last_seen FROM targets ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("decode-0", "http://y/metrics", "prefill", 8, "host-b", T0, T0 + timedelta(seconds=20)),
        ("decode-1", "http://z/metrics", "decode", 64, "", T0 + timedelta(seconds=25), T0 + timedelta(seconds=25)),
    ]


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
    scraped = {
        (T0 + timedelta(seconds=5 * i), series_key(TARGET.name, s.name, s.labels)): s.value
        for i, t in enumerate((text, bumped))
        for s in parse_page(t.encode())
    }
    assert read_back(con) == scraped
    assert con.execute("SELECT count(*) FROM samples").fetchone()[0] < len(scraped)  # counters once


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


@pytest.mark.parametrize("cached", [False, True])
def test_a_family_repeated_as_another_kind_on_a_series_first_page_keeps_one_series(con, cached):
    """Found by test_fuzz: a page that repeats a family under another TYPE names one series twice,
    first seen as a gauge, then as untyped. Its id was a provisional one for the second sight and
    was remembered so: the next page wrote samples under it (a series id with no series row) or
    failed the round (IndexError)."""
    pages = [
        "# TYPE :: gauge\n::{} 0.0\n# TYPE : counter\n:{} 0.0\n# TYPE :: untyped\n::{} 0.0\n",
        '# TYPE :: untyped\n::{} 1.0\n::{} 0.0\n::{A=""} 0.0\n',
        '# TYPE :: untyped\n::{} 2.0\n::{} 0.0\n::{A=""} 3.0\n',
    ]
    ing, cache = Ingestor(), PageCache()
    for k, text in enumerate(pages):
        samples = cache.parse(text.encode()) if cached else parse_page(text.encode())
        n = ing.write(con, ScrapeBatch(TARGET, T0 + timedelta(seconds=5 * k), True, 0.0, samples))
        assert n == len({(s.name, s.labels) for s in samples})
    orphans = "SELECT count(*) FROM samples WHERE series_id NOT IN (SELECT series_id FROM series)"
    assert con.execute(orphans).fetchall() == [(0,)]
    stored = "SELECT metric, labels, value FROM samples JOIN series USING (series_id) ORDER BY ts, metric, labels"
    assert con.execute(stored).fetchall() == [
        ("::", "{}", 0.0),
        (":_total", "{}", 0.0),
        ("::", '{"A": ""}', 0.0),
        ("::", "{}", 1.0),
        ("::", '{"A": ""}', 3.0),
        ("::", "{}", 2.0),
    ]


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
    round rolls up the minutes it closes: every table ends as writing each batch alone leaves it
    (series named by key: a round's new series are numbered together, a lone batch's alone)."""
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
        stores.append({t: c.execute(f"{named_by_key(t)} ORDER BY ALL").fetchall() for t in tables})
    alone, together = stores
    assert together == alone
    assert len(alone["increments_1m"]) >= 4 and len(alone["increments"]) == 2 * (len(stamps) - 1)


def stream(seed: int) -> list[tuple[datetime, str | None]]:
    """Rounds of a page holding a whole-number counter, one with fractions, one near 2^53, a
    histogram and a gauge, 60 s apart across four clock hours: counters that reset, read
    NaN, -1 or +Inf for a round, and a target that misses rounds (None: no page)."""
    rng = random.Random(seed)
    whole, frac, big, n, total = 0.0, 0.0, 2.0**53 - 5e6, 0.0, 0.0
    out = []
    for k in range(200):
        at = T0 + timedelta(seconds=60 * k)
        if rng.random() < 0.03:
            out.append((at, None))
            continue
        whole = float(rng.randrange(0, 50)) if rng.random() < 0.02 else whole + rng.randrange(0, 400)
        frac += rng.random() * 3
        big = min(big + rng.randrange(0, 80_000), 2.0**53 + 1e6)  # passes 2^53: not whole-exact any more
        odd = rng.choice(["NaN", "-1", "+Inf"]) if rng.random() < 0.02 else repr(whole)
        in_bucket = rng.randrange(0, 5)
        n += in_bucket
        total += in_bucket * rng.random()
        text = (
            f"# TYPE a_total counter\na_total {odd}\n"
            f"# TYPE b_seconds_total counter\nb_seconds_total {frac!r}\n"
            f"# TYPE c_bytes_total counter\nc_bytes_total {big!r}\n"
            f'# TYPE h histogram\nh_bucket{{le="1.0"}} {n!r}\nh_bucket{{le="+Inf"}} {n!r}\n'
            f"h_count {n!r}\nh_sum {total!r}\n"
            f"# TYPE g gauge\ng {rng.random()!r}\n"
        )
        out.append((at, text))
    return out


@pytest.mark.slow("200 rounds written twice, once by a writer restarted at random")
@pytest.mark.parametrize("seed", range(3))
def test_a_counter_is_stored_once_and_gives_back_every_reading_through_writer_restarts(tmp_path, seed):
    """Against one writer that never stops: a writer restarted at random rounds on its file stores
    the same increases, `readings` gives back every scraped value exactly, and `samples` keeps a
    counter's reading only where its increases cannot give it back."""
    rounds = stream(seed)
    reference = duckdb.connect()
    apply_migrations(reference)
    ing = Ingestor()
    for at, text in rounds:
        if text is not None:
            ingest(reference, ing, text, at)
    path = str(tmp_path / "w.duckdb")
    rng = random.Random(seed)
    con = duckdb.connect(path)
    apply_migrations(con)
    ing = Ingestor()
    for at, text in rounds:
        if rng.random() < 0.05:  # the writer restarts: a new process, the file reopened
            con.close()
            con, ing = duckdb.connect(path), Ingestor()
        if text is not None:
            ingest(con, ing, text, at)

    def increases(c):
        return c.execute(
            "SELECT ts, series_key, delta, seconds, reset FROM increments JOIN series USING (series_id) ORDER BY ALL"
        ).fetchall()

    assert increases(con) == increases(reference)
    scraped = {
        (at, series_key(TARGET.name, s.name, s.labels)): "NaN" if math.isnan(s.value) else s.value
        for at, text in rounds
        if text is not None
        for s in parse_page(text.encode())
    }
    back = {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in read_back(con).items()}
    assert back == scraped
    stored = dict(
        con.execute("SELECT metric, count(*) FROM samples JOIN series USING (series_id) GROUP BY 1").fetchall()
    )
    rounds_read = sum(text is not None for _, text in rounds)
    assert stored["g"] == stored["b_seconds_total"] == rounds_read  # a gauge, and fractions: every reading
    assert stored["h_bucket"] < rounds_read / 2 and stored["a_total"] < rounds_read / 4


def test_a_restarted_writer_numbers_new_series_after_every_stored_one_counters_odd_others_even(tmp_path):
    path = str(tmp_path / "w.duckdb")
    c = duckdb.connect(path)
    apply_migrations(c)
    ingest(
        c, Ingestor(), "# TYPE a_total counter\na_total 1\n# TYPE g gauge\ng 1\n# TYPE b_total counter\nb_total 1\n", T0
    )
    c.close()
    c = duckdb.connect(path)
    more = "# TYPE c_total counter\nc_total 1\n# TYPE h gauge\nh 1\n# TYPE d_total counter\nd_total 1\n"
    ingest(c, Ingestor(), more, T0 + timedelta(seconds=5))
    ids = dict(c.execute("SELECT metric, series_id FROM series").fetchall())
    assert ids == {"a_total": 1, "g": 2, "b_total": 3, "c_total": 5, "h": 6, "d_total": 7}


def cached_stream(seed: int) -> list[tuple[datetime, TargetInfo, str]]:
    """Rounds of two targets' pages as a plugin writes them: a hot-expert gauge whose expert label
    moves (to experts seen before and to new ones), counters that reset when the process restarts,
    a DCGM blank, a duplicate line; now and then a page with odd spacing, another comment, or a
    line fewer, which the scrape cache reads another way."""
    rng = random.Random(seed)
    other = TargetInfo("prefill-0", "http://y/metrics", "prefill", 8, "test")
    count = {TARGET.name: 0, other.name: 0}
    started = {TARGET.name: 1.7e9, other.name: 1.7e9}
    out = []
    for k in range(120):
        at = T0 + timedelta(seconds=15 * k)
        for t in (TARGET, other):
            if rng.random() < 0.03:
                started[t.name] += 15 * k
                count[t.name] = 0
            count[t.name] += rng.randrange(0, 90)
            hot = sorted(rng.sample(range(12 if k < 60 else 40), 3))
            lines = [
                "# HELP process_start_time_seconds Start time.",
                "# TYPE process_start_time_seconds gauge",
                f"process_start_time_seconds {started[t.name]!r}",
                "# TYPE vllm:generation_tokens counter",
                f'vllm:generation_tokens_total{{engine="0"}} {float(count[t.name])!r}',
                f'vllm:generation_tokens_total{{engine="0"}} {float(count[t.name] + 1)!r}',  # a duplicate: the first counts
                "# TYPE moemeter_expert_hot_share gauge",
                *(f'moemeter_expert_hot_share{{expert="{e}",layer="3"}} {rng.random()!r}' for e in hot),
                "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
                f"DCGM_FI_DEV_XID_ERRORS {rng.choice(['9.223372036854775e+18', '0.0'])}",
            ]
            odd = rng.random()
            if odd < 0.05:
                lines[4] = lines[4].replace("} ", "}  ")  # odd spacing: read line by line
            elif odd < 0.08:
                lines[0] = "# HELP process_start_time_seconds When it started."  # parsed afresh
            elif odd < 0.1:
                lines.pop()  # a line fewer
            out.append((at, t, "\n".join(lines) + "\n"))
    return out


@pytest.mark.slow("every round stored twice, through the cache and parsed alone")
@pytest.mark.parametrize("seed", range(3))
def test_pages_read_through_the_scrape_cache_store_what_the_same_pages_parsed_alone_store(seed):
    """The collector hands the ingestor Pages that share a layout while the target's series stay
    the same, and one made from the last by the lines that moved: written column by column, they
    store what the same pages parsed alone (lists of samples) store, new series refused over the
    per-round limit included."""
    rounds = cached_stream(seed)
    caches: dict[str, PageCache] = {}
    moved = 0
    stores = []
    for cached in (True, False):
        c = duckdb.connect()
        apply_migrations(c)
        ing = Ingestor(max_new_series=5)
        stored = []
        for at in sorted({at for at, _, _ in rounds}):  # a round parsed, then stored, as the collector does
            batches = []
            for _, t, text in (r for r in rounds if r[0] == at):
                if cached:
                    samples = caches.setdefault(t.name, PageCache()).parse(text.encode())
                    moved += isinstance(samples, Page) and samples.layout.parent is not None
                else:
                    samples = parse_page(text.encode())
                batches.append(ScrapeBatch(t, at, True, 0.01, samples))
            stored.append(ing.write_all(c, batches))
        tables = ("samples", "increments", "series", "rejected", "scrapes", "targets")
        stores.append((stored, {t: c.execute(f"{named_by_key(t)} ORDER BY ALL").fetchall() for t in tables}))
    assert moved > 20  # the hot-expert lines moved: the ingestor remapped only them
    assert stores[0] == stores[1]
    assert any(r[3].startswith("new series over the limit") for r in stores[0][1]["rejected"])
