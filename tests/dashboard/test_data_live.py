"""Live page queries on an in-memory DuckDB seeded by the migrations and real twin pages."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import numpy as np
import pandas as pd
import pytest

from collectors.parse import parse_page
from dashboard.data import live
from moemeter.contract import TargetInfo
from stack.twin.config import load_profile
from stack.twin.server import Twin
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.ingest import Ingestor, ScrapeBatch

T0 = datetime(2026, 11, 30, 12, 0, 0)
START = 1_000_000.0  # twin epoch seconds at T0


@pytest.fixture(scope="module")
def seeded():
    """Three scrapes 10 s apart of the whole twin rack, plus the twin's own counters at each."""
    con = duckdb.connect()
    apply_migrations(con)
    twin = Twin(load_profile("deepseek-v4.1-flash"), seed=11, start=START - 120, tick=0.5)  # 5x faster
    ing = Ingestor()
    truth = []
    for k in range(3):
        pages = twin.pages(START + 10 * k)
        eps = {e.name: e for e in twin.endpoints()}
        m = twin.model
        truth.append(
            {
                "prompt": sum(i.counters["prompt_tokens"].sum() for i in m.prefill),
                "cached": sum(i.counters["prompt_local_cache_hit"].sum() for i in m.prefill),
                "generated": sum(i.counters["generation_tokens"].sum() for i in m.decode),
            }
        )
        for name, text in pages.items():
            t = TargetInfo(name, f"http://twin/{name}", eps[name].role, eps[name].gpus, "twin:test", eps[name].hostname)
            ing.write(con, ScrapeBatch(t, T0 + timedelta(seconds=10 * k), True, 0.01, parse_page(text.encode())))
    ing.write(
        con,
        ScrapeBatch(
            TargetInfo("down", "http://x", "router", 0),
            T0 + timedelta(seconds=20),
            False,
            4.0,
            error="timeout after 4s",
        ),
    )
    return LocalQuery(con), truth


def window() -> live.Window:
    # through the scrapes at T0 + 20 s ([start, end): a microsecond past them); one raw step holds both intervals
    return live.Window(T0, T0 + timedelta(seconds=20, microseconds=1), 30)


def test_pool_gpus_come_from_the_targets(seeded):
    q, _ = seeded
    assert live.pool_gpus(live.targets(q)) == {"prefill": 8, "decode": 64, "rack": 72}
    assert live.pool_gpus(live.targets(q, window())) == {"prefill": 8, "decode": 64, "rack": 72}


def test_pool_gpus_count_only_the_targets_in_service_in_the_window():
    """A stack observed before into the same database (the twin, then the local CPU stack) is not in
    this one's pools."""
    con = duckdb.connect()
    apply_migrations(con)
    ing = Ingestor()
    earlier = [TargetInfo("prefill-7", "http://a", "prefill", 7), TargetInfo("decode-9", "http://b", "decode", 64)]
    now = [TargetInfo("prefill-0", "http://c", "prefill", 1), TargetInfo("decode-0", "http://d", "decode", 1)]
    for t in earlier:
        ing.write(con, ScrapeBatch(t, T0 - timedelta(hours=2), True, 0.01, parse_page(b"up_metric 1\n")))
    for t in now:
        ing.write(con, ScrapeBatch(t, T0 + timedelta(seconds=5), True, 0.01, parse_page(b"up_metric 1\n")))
    q = LocalQuery(con)
    assert live.pool_gpus(live.targets(q, window())) == {"prefill": 1, "decode": 1, "rack": 2}
    assert live.pool_gpus(live.targets(q)) == {"prefill": 8, "decode": 65, "rack": 73}  # all time: mixed


def test_tokens_per_gpu_follow_design_definitions_exactly(seeded):
    q, truth = seeded
    rates = live.token_rates(q, window())
    tpg = live.tokens_per_gpu(rates, {"prefill": 8, "decode": 64, "rack": 72}).set_index("series")["value"]
    d = {k: truth[2][k] - truth[0][k] for k in truth[0]}
    assert tpg["prefill logical"] == pytest.approx(d["prompt"] / 20 / 8, rel=1e-9)
    assert tpg["prefill computed"] == pytest.approx((d["prompt"] - d["cached"]) / 20 / 8, rel=1e-9)
    assert tpg["decode"] == pytest.approx(d["generated"] / 20 / 64, rel=1e-9)
    assert tpg["rack logical"] == pytest.approx((d["prompt"] + d["generated"]) / 20 / 72, rel=1e-9)


def test_decode_prompt_tokens_are_never_counted_again(seeded):
    q, _ = seeded
    rates = live.token_rates(q, window()).set_index("role")
    assert rates.loc["decode", "prompt_per_s"] > 0  # the decode pool does report them...
    tpg = live.tokens_per_gpu(rates.reset_index(), {"prefill": 8, "decode": 64, "rack": 72}).set_index("series")
    no_decode_prompt = (rates.loc["prefill", "prompt_per_s"] + rates.loc["decode", "generated_per_s"]) / 72
    assert tpg.loc["rack logical", "value"] == pytest.approx(no_decode_prompt)  # ...but they are not added


def test_histogram_quantile_matches_prometheus_interpolation():
    les = np.array([0.1, 0.5, 1.0, np.inf])
    cum = np.array([10.0, 30.0, 40.0, 40.0])
    assert live.histogram_quantile(0.5, les, cum) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert live.histogram_quantile(0.1, les, cum) == pytest.approx(0.04)
    assert live.histogram_quantile(1.0, les, np.array([10.0, 30.0, 40.0, 50.0])) == 1.0  # +Inf bucket
    assert np.isnan(live.histogram_quantile(0.5, les, np.zeros(4)))


def test_p90_per_user_is_one_over_the_p90_mean_itl_of_decode_requests(seeded):
    q, _ = seeded
    family = "vllm:request_time_per_output_token_seconds"
    tpot = live.histograms_counts(q, window(), [family])[family]
    per_user = live.per_user_tokens_per_second(tpot)
    dec = tpot[tpot["role"] == "decode"].groupby("le")["count"].sum()
    expected = 1.0 / live.histogram_quantile(0.9, dec.index.to_numpy(), dec.to_numpy())
    assert per_user["value"].iloc[0] == pytest.approx(expected)
    assert 150 < expected < 250  # the twin is calibrated near 196


def test_queue_kv_gpu_and_health(seeded):
    q, _ = seeded
    w = window()
    g = live.queue_and_kv(q, w).set_index("role")
    assert g.loc["decode", "running"] > 1000 and 0 < g.loc["decode", "kv_mean"] <= g.loc["decode", "kv_max"] <= 1
    gpus = live.gpus_latest(q, w.start)
    assert len(gpus) == 72 and gpus["util_pct"].between(0, 100).all()
    assert gpus["memory_temp_c"].isna().all()  # DCGM blank on GB300: missing, not 9.2e18
    health = live.scrape_health(q, w).set_index("target")
    assert not health.loc["down", "up"] and health.loc["down", "error"] == "timeout after 4s"
    assert health["up"].sum() == 25  # 24 rack endpoints and the gateway


def test_headline_uses_recent_complete_steps():
    tpg = pd.DataFrame({"bucket": [1, 2, 3, 4], "series": ["decode"] * 4, "value": [1.0, 2.0, 3.0, 99.0]})
    empty = pd.DataFrame(columns=["bucket", "role", "le", "count"])
    health = pd.DataFrame({"up": [True, False]})
    h = live.headline(tpg, empty, empty, empty, health, last_buckets=2)
    assert h.decode_tokens_per_gpu == 2.5  # bucket 4 is still filling
    assert (h.targets_up, h.targets_total) == (1, 2)
    assert np.isnan(h.p90_user_tokens_per_s)


def test_window_step_never_below_two_scrape_intervals():
    w = live.Window.ending(T0, 300)
    assert w.step_seconds == 10 and w.end == T0 + timedelta(microseconds=1)  # the scrape at T0 inside
    assert w.start == w.end - timedelta(seconds=300)
    assert live.Window.ending(T0, 86400).step_seconds == 720


def test_health_shows_the_last_scrapes_own_error_so_a_recovered_target_shows_none():
    con = duckdb.connect()
    apply_migrations(con)
    ing, t = Ingestor(), TargetInfo("flaky", "http://x", "router", 0)
    ing.write(con, ScrapeBatch(t, T0 + timedelta(seconds=2), False, 4.0, error="timeout after 4s"))
    ing.write(con, ScrapeBatch(t, T0 + timedelta(seconds=5), True, 0.01, parse_page(b"up_metric 1\n")))
    row = live.scrape_health(LocalQuery(con), window()).set_index("target").loc["flaky"]
    assert row["up"] and pd.isna(row["error"]) and row["failures"] == 1 and row["samples"] == 1


def test_health_shows_what_each_target_had_refused_in_the_window():
    con = duckdb.connect()
    apply_migrations(con)
    ing = Ingestor(max_series=2)
    loud, quiet = TargetInfo("loud", "http://x", "decode", 1), TargetInfo("quiet", "http://y", "decode", 1)
    for k, at in enumerate((T0 + timedelta(seconds=2), T0 + timedelta(seconds=7))):
        page = "".join(f'g{{id="{k}-{i}"}} 1\n' for i in range(3)).encode()
        ing.write(con, ScrapeBatch(loud, at, True, 0.01, parse_page(page)))
        ing.write(con, ScrapeBatch(quiet, at, True, 0.01, parse_page(b"g 1\n")))
    health = live.scrape_health(LocalQuery(con), window()).set_index("target")
    assert health.loc["loud", "refused"] == 1 + 3 and health.loc["quiet", "refused"] == 0
    assert health.loc["loud", "last_refusal"] == "series: new series over the limit of 2 per target: samples refused"
    assert pd.isna(health.loc["quiet", "last_refusal"])


@pytest.mark.slow("the whole rack's pages for nine 30 s rounds")
def test_serve_interval_30_gives_a_rate_in_every_step():
    """`serve --interval 30`: the pages take the interval the collector stored, so every step holds
    increases and each step's rate is its tokens over its seconds. With the old fixed 5 s, two of
    every three 10 s steps held nothing."""
    con = duckdb.connect()
    apply_migrations(con)
    twin = Twin(load_profile("deepseek-v4.1-flash"), seed=12, start=START - 120, tick=0.5)  # 5x faster
    ing, generated = Ingestor(), []
    for k in range(9):  # 4 minutes of 30 s rounds
        pages = twin.pages(START + 30 * k)
        eps = {e.name: e for e in twin.endpoints()}
        generated.append(sum(i.counters["generation_tokens"].sum() for i in twin.model.decode))
        for name in ("decode-0", "prefill-0"):
            e = eps[name]
            t = TargetInfo(name, f"http://twin/{name}", e.role, e.gpus, "twin:test", e.hostname)
            ing.write(con, ScrapeBatch(t, T0 + timedelta(seconds=30 * k), True, 0.01, parse_page(pages[name].encode())))
    q = LocalQuery(con)
    interval = live.scrape_interval(q)
    assert interval == 30.0
    latest = live.latest_scrape_time(q)
    w = live.Window.ending(latest, 180, interval)
    assert w.step_seconds == 60
    rates = live.token_rates(q, w)
    decode = rates[rates.role == "decode"].reset_index(drop=True)
    assert (decode.generated_per_s > 0).all()
    at = [T0 + timedelta(seconds=30 * k) for k in range(len(generated))]
    # A 60 s step [b, b + 60 s) holds the two rounds' intervals that cover it, (b, b + 30 s] and
    # (b + 30 s, b + 60 s]: its rate is their tokens over the 60 s.
    for r in decode.itertuples():
        tokens = generated[at.index(r.bucket + timedelta(minutes=1))] - generated[at.index(r.bucket)]
        assert r.generated_per_s == pytest.approx(tokens / 60)
    assert decode.bucket.tolist() == [T0 + timedelta(minutes=m) for m in range(1, 4)]  # no step empty
    # Read with the old fixed 5 s (10 s steps, of which only every third held a scrape's time), every
    # step still holds its share of the 30 s interval that covers it, at that interval's rate.
    old = live.token_rates(q, live.Window.ending(latest, 180, 5.0))
    old = old[old.role == "decode"].reset_index(drop=True)
    assert len(old) == 18 and old.generated_per_s.iloc[:3].tolist() == pytest.approx([old.generated_per_s[0]] * 3)
