"""Users page queries on an in-memory DuckDB holding the twin gateway's request records."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import duckdb
import numpy as np
import pandas as pd
import pytest

from dashboard.data import users
from dashboard.data.live import Window
from stack.twin.config import load_profile
from stack.twin.model import RackModel
from warehouse import cost
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.requests import RequestIngestor
from warehouse.rollup import Rollups

T0 = datetime(2026, 11, 30, 12, 0, 0)
START = T0.replace(tzinfo=UTC).timestamp()


def feed(con, start: float, rounds: range, stored_at: datetime, gateway: str = "gateway") -> pd.DataFrame:
    """The twin rack's gateway records, fed in 15 s rounds as the collector would, stored from
    `stored_at` on; returns the records."""
    model = RackModel(load_profile("deepseek-v4.1-flash"), seed=5, start=start - 60, tick=0.5)
    ing, after, records = RequestIngestor(), 0, []
    for k in rounds:
        model.advance(start + 15 * k)
        page = model.gateway.page(after, 10**6)
        after = page["next"]
        records += page["records"]
        ing.write(con, gateway, page, stored_at + timedelta(seconds=15 * k))
    return pd.DataFrame(records)


@pytest.fixture(scope="module")
def seeded():
    """Five simulated minutes of the twin rack's requests, rolled up into their hour."""
    con = duckdb.connect()
    apply_migrations(con)
    records = feed(con, START, range(1, 21), T0)
    Rollups().advance(con, T0 + timedelta(hours=1))
    assert con.execute("SELECT sum(requests) FROM requests_1h").fetchall() == [(len(records),)]
    return LocalQuery(con), records


def finished(df: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(df.started_at + df.e2e_seconds, unit="s")


def test_summary_matches_the_records(seeded) -> None:
    q, rec = seeded
    w = Window.between(T0, T0 + timedelta(minutes=5))
    inside = rec[(finished(rec) >= w.start) & (finished(rec) < w.end)]
    s = users.summary(q, w)
    assert s is not None and s.exact
    assert (s.requests, s.users, s.generated_tokens) == (
        len(inside),
        inside.user.nunique(),
        inside.generated_tokens.sum(),
    )
    itl = inside.itl_mean_seconds.dropna().to_numpy()
    assert s.tps_p90 == pytest.approx(1 / np.quantile(itl, 0.9))  # the slow tail, docs/definitions.md
    assert s.tps_p50 == pytest.approx(1 / np.quantile(itl, 0.5))
    assert s.tps_p90 < s.tps_p50
    assert 150 < s.tps_p90 < 260  # the twin is calibrated to the write-up's 196 tokens/s


def test_hourly_quantiles_come_within_half_a_percent(seeded) -> None:
    q, rec = seeded
    w = Window.between(T0 - timedelta(hours=23), T0 + timedelta(hours=1))  # a 24 h window reads the hourly tables
    assert users.hourly(w)
    s = users.summary(q, w)
    itl = rec.itl_mean_seconds.dropna().to_numpy()
    assert s is not None and not s.exact
    assert s.requests == len(rec) and s.generated_tokens == rec.generated_tokens.sum()
    for got, p in ((s.tps_p50, 0.5), (s.tps_p90, 0.9)):
        assert got == pytest.approx(1 / np.quantile(itl, p), rel=0.006)
    over = users.tps_over_time(q, w)
    assert over.requests.sum() == len(itl)


def test_histogram_and_over_time_cover_every_timed_request(seeded) -> None:
    q, rec = seeded
    w = Window.between(T0, T0 + timedelta(minutes=5))
    inside = rec[(finished(rec) >= w.start) & (finished(rec) < w.end) & rec.itl_mean_seconds.notna()]
    hist = users.tps_histogram(q, w)
    assert hist.requests.sum() == len(inside)
    peak = hist.tokens_per_second[hist.requests.idxmax()]
    assert 0.5 * (1 / inside.itl_mean_seconds.median()) < peak < 2 * (1 / inside.itl_mean_seconds.median())
    over = users.tps_over_time(q, w)
    assert over.requests.sum() == len(inside) and (over.tps_p90 <= over.tps_p50).all()


def test_users_table_orders_and_sums(seeded) -> None:
    q, rec = seeded
    w = Window.between(T0 - timedelta(minutes=5), T0 + timedelta(minutes=5))
    top = users.users_table(q, w, limit=5)
    per_user = rec[finished(rec) < w.end].groupby("user")
    tokens = (per_user.prompt_tokens.sum() + per_user.generated_tokens.sum()).sort_values(ascending=False)
    assert list(top.user_id) == list(tokens.index[:5])
    assert list(top.tokens) == list(tokens.iloc[:5])
    u = top.user_id[0]
    mine = rec[(rec.user == u) & (finished(rec) < w.end)]
    assert top.tps_mean[0] == pytest.approx(mine.itl_mean_seconds.notna().sum() / mine.itl_mean_seconds.sum())
    with pytest.raises(ValueError, match="cannot order"):
        users.users_table(q, w, order="user_id; DROP TABLE requests")


def test_one_users_history(seeded) -> None:
    q, rec = seeded
    u = rec.user.value_counts().index[0]
    t = rec.tenant[rec.user == u].iloc[0]
    assert (t, u) in users.find_users(q, u[-3:]) and users.find_users(q, "no-such-user") == []
    assert (t, u) in users.find_users(q, t)  # a tenant's users are found by its name too
    w = Window.between(T0 - timedelta(minutes=5), T0 + timedelta(minutes=5))
    hist = users.user_history(q, w, t, u)
    assert hist.requests.sum() == (rec.user == u).sum()
    assert users.user_history(q, w, "another-tenant", u).empty  # the user of that name in another tenant
    latest = users.user_requests(q, t, u, w.end, limit=10)
    assert len(latest) == 10 and latest.finished_at.is_monotonic_decreasing


def test_an_empty_window_says_none(seeded) -> None:
    q, _ = seeded
    w = Window.between(T0 + timedelta(days=2), T0 + timedelta(days=2, hours=1))
    assert users.summary(q, w) is None
    assert users.tps_histogram(q, w).empty and users.tps_over_time(q, w).empty
    assert math.isnan(users.itl_quantiles_from_histogram(q, T0 + timedelta(days=2), T0 + timedelta(days=3))[0])


@pytest.mark.slow("three hours of roll-ups over two gateways' feeds")
def test_records_stored_after_their_hour_was_rolled_up_count_at_once_and_once() -> None:
    """A gateway read late (the collector was down): records that finished at 11:55-12:00 are
    stored from 12:05, after the 11:00 hour was rolled up. The hourly view counts them at once, and
    still once after the next roll-ups."""
    con = duckdb.connect()
    apply_migrations(con)
    rolls = Rollups()
    on_time = feed(con, START - 3600, range(1, 11), T0 - timedelta(hours=1))  # 11:00:15 .. 11:02:30
    rolls.advance(con, T0)  # 11:00 rolled up
    late = feed(con, START - 300, range(1, 21), T0 + timedelta(minutes=5), "gateway-b")  # finished 11:55 .. 12:00
    before = late[finished(late) < T0]
    assert len(before) > 100  # most finished in the rolled-up hour
    q = LocalQuery(con)
    w = Window.between(T0 - timedelta(hours=23), T0 + timedelta(hours=1, minutes=30))
    assert users.hourly(w)
    want = len(on_time) + len(late)
    for now in (None, T0 + timedelta(hours=1), T0 + timedelta(hours=2)):  # before and after the next roll-ups
        if now is not None:
            rolls.advance(con, now)
        s = users.summary(q, w)
        assert s is not None and s.requests == want, now
        assert s.generated_tokens == on_time.generated_tokens.sum() + late.generated_tokens.sum()
        assert users.tps_over_time(q, w).requests.sum() == (
            on_time.itl_mean_seconds.notna().sum() + late.itl_mean_seconds.notna().sum()
        )
        assert users.users_table(q, w, limit=1000).requests.sum() == want
        hours = users.user_history(q, w, str(late.tenant.iloc[0]), str(late.user.iloc[0]))
        both = pd.concat([on_time, late])
        assert hours.requests.sum() == (both.user == late.user.iloc[0]).sum()
        assert hours.set_index("bucket").requests.get(T0 - timedelta(hours=1), 0) >= 1
        # The Cost page's per-user tokens read the same hourly view: every record once, edges cut exactly.
        for a, b in ((w.start, w.end), (T0 - timedelta(minutes=4, seconds=21), T0 + timedelta(hours=1, seconds=7))):
            truth = con.execute(
                """SELECT tenant, user_id AS user, count(*) AS requests, sum(prompt_tokens) AS prompt_tokens,
                                          coalesce(sum(cached_prompt_tokens), 0) AS cached_prompt_tokens,
                                          sum(generated_tokens) AS generated_tokens
                                   FROM requests WHERE finished_at >= ? AND finished_at < ?
                                   GROUP BY tenant, user_id ORDER BY tenant, user_id""",
                [a, b],
            ).df()
            got = cost.user_tokens(q, a, b)
            assert len(truth) > 10 and got.to_dict("records") == truth.to_dict("records"), (now, a, b)
