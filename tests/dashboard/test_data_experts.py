"""Experts page data on a warehouse seeded from the twin's plugin families and snapshots."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import duckdb
import numpy as np
import pandas as pd
import pytest

from collectors.parse import PageCache
from dashboard.data import experts as data
from dashboard.data.live import Window
from moemeter.contract import TargetInfo
from stack.twin.config import load_profile
from stack.twin.exposition import expert_snapshot, render_plugin
from stack.twin.model import RackModel
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.eplb import what_if
from warehouse.experts import ExpertIngestor, ExpertSnapshot
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.read import HOUR
from warehouse.rollup import Rollups

T0 = datetime(2026, 11, 30, 12, 0, 0)
TARGET = TargetInfo("decode-0", "http://twin/decode-0/metrics", "decode", 64, "twin:test")


def seed(con: duckdb.DuckDBPyConnection, minutes: float = 4.0, scrape: float = 5.0, snapshot_every: int = 6):
    """Scrape the twin decode instance's plugin families every 5 s and its snapshot every 30 s."""
    p = load_profile("deepseek-v4.1-flash").with_workload(agents=1500)
    p = dataclasses.replace(p, eplb=dataclasses.replace(p.eplb, rebalance_interval_seconds=90.0, window_seconds=60.0))
    start = T0.timestamp()
    m = RackModel(p, seed=5, start=start - 30)
    ing, exp, cache = Ingestor(), ExpertIngestor(), PageCache()  # the cache a collector keeps
    history = []
    for k in range(int(minutes * 60 / scrape) + 1):
        m.advance(start + k * scrape)
        ts = T0 + timedelta(seconds=k * scrape)
        page = render_plugin(m.experts.state, p.model.name)
        ing.write(con, ScrapeBatch(TARGET, ts, True, 0.01, cache.parse(page.encode())))
        if k % snapshot_every == 0:
            exp.write(
                con, TARGET.name, ts, ExpertSnapshot.from_json(expert_snapshot(m.experts.state, p.model.name, m.now))
            )
        history.append((ts, np.floor(m.experts.state.rank_tokens)))  # whole tokens, as the page says them
    return m, history


@pytest.fixture(scope="module")
def seeded():
    con = duckdb.connect()
    apply_migrations(con)
    m, history = seed(con)
    return LocalQuery(con), m, history


def window(minutes: float = 4.0, step: int = 30) -> Window:
    return Window(T0, T0 + timedelta(minutes=minutes), step)


def test_balancedness_is_mean_over_max_of_rank_load_from_the_counters(seeded):
    q, m, history = seeded
    steps = data.rank_steps(q, window(), "decode-0")
    bal = data.balancedness_over_time(steps)
    # the step [12:00:00, 12:00:30) holds the intervals that cover it: the scrapes closing at :05 .. :30
    first = {ts: r for ts, r in history}
    expected_load = first[T0 + timedelta(seconds=30)] - first[T0]
    b0 = bal[bal["bucket"] == pd.Timestamp(T0)].set_index("layer")["balancedness"]
    exp = expected_load.mean(axis=1) / expected_load.max(axis=1)
    assert np.allclose(b0.sort_index().to_numpy(), exp, rtol=1e-9)
    assert set(steps["rank"]) == set(range(64)) and steps["layer"].nunique() == 40


def test_rebalances_are_listed_and_measured_to_help(seeded):
    q, m, _ = seeded
    steps = data.rank_steps(q, window(step=10), "decode-0")
    events = data.measured_around(data.rebalances(q, window(), "decode-0"), data.balancedness_over_time(steps))
    assert len(events) == len(m.experts.state.rebalances) == 2
    assert (events["planned_after"] > events["planned_before"]).all()
    assert (events["measured_after"] > events["measured_before"]).all()


def test_a_rebalance_costs_its_pause_in_tokens_and_wins_them_back_with_its_gain():
    # Steps of 10 s from T0; the rebalance at T0 + 60 s paused the engine 2 s. The steps that end in
    # the 30 s before it (starting at +30, +40, +50) generated 100 tok/s, those starting in the 30 s
    # after it (+60, +70, +80) 110: 2 s x 100 = 200 tokens lost, won back at 10 tok/s in 20 s.
    starts = [T0 + timedelta(seconds=10 * k) for k in range(12)]
    rates = pd.DataFrame({"bucket": starts, "generated_per_s": [100.0] * 6 + [110.0] * 3 + [90.0] * 3})
    events = pd.DataFrame(
        {"ts": [T0 + timedelta(seconds=60), T0 + timedelta(seconds=90)], "duration_seconds": [2.0, 1.0]}
    )
    first, second = data.rebalance_cost(events, rates).to_dict("records")
    assert (first["tps_before"], first["tps_after"]) == (100.0, 110.0)
    assert first["tokens_lost"] == 200.0 and first["win_back_seconds"] == 20.0
    # The second (at +90 s, 1 s): the steps ending in (+60, +90] made 110 tok/s, those after it 90:
    # 110 tokens lost, and tokens/s fell, so nothing is won back.
    assert (second["tps_before"], second["tps_after"]) == (110.0, 90.0)
    assert second["tokens_lost"] == 110.0 and np.isnan(second["win_back_seconds"])
    empty = data.rebalance_cost(events, rates.iloc[:0])
    assert empty["tokens_lost"].isna().all() and len(empty) == 2


def test_expert_shares_and_hot_experts(seeded):
    q, _, _ = seeded
    shares = data.expert_share(q, window(), "decode-0")
    assert np.allclose(shares.groupby("layer")["share"].sum(), 1.0)
    hot = data.hot_experts(shares, data.share_trend(q, window(), "decode-0"), n=5)
    assert hot["share"].iloc[0] == pytest.approx(shares["share"].max())
    assert all(len(t) >= 5 for t in hot["trend"])  # one point per snapshot interval
    picked = data.share_trend(q, window(), "decode-0", hot)  # only the top experts' rows, same shares
    assert set(zip(picked["layer"], picked["expert"])) == set(zip(hot["layer"], hot["expert"]))
    assert data.hot_experts(shares, picked, n=5)["trend"].tolist() == hot["trend"].tolist()


def test_placement_marks_redundant_replicas(seeded):
    q, m, _ = seeded
    pl = data.placement(q, window(), "decode-0", 3)
    assert len(pl) == 448 and pl["rank"].max() == 63
    assert pl["expert"].tolist() == m.experts.state.phy2log[3].tolist()
    assert (pl["replicas"] > 1).sum() >= 64  # 64 redundant slots make at least 64 replicated slots
    placed, ranks = data.current_placement(q, window(), "decode-0")
    assert placed.shape == (40, 448) and ranks == 64


def test_what_if_predicts_with_the_planner_on_observed_load(seeded):
    q, _, _ = seeded
    shares = data.expert_share(q, window(), "decode-0")
    load = data.load_matrix(shares)
    placed, ranks = data.current_placement(q, window(), "decode-0")
    same = what_if(load, placed, ranks, 64, "vllm")
    assert same["slots"].iloc[0] == 448
    assert same["planned_balancedness"].mean() >= same["current_balancedness"].mean() - 1e-9
    more = what_if(load, placed, ranks, 128, "refined")
    assert more["slots"].iloc[0] == 512
    assert more["planned_balancedness"].mean() > same["planned_balancedness"].mean()
    none = what_if(load, placed, ranks, 0, "vllm")
    assert none["slots"].iloc[0] == 384


def test_hottest_since_is_the_start_of_the_trailing_run():
    b = pd.to_datetime(["2026-11-30 12:00", "2026-11-30 12:01", "2026-11-30 12:02", "2026-11-30 12:03"])
    rows = [
        (b[0], 0, 0, 9.0),
        (b[0], 0, 1, 1.0),
        (b[1], 0, 0, 1.0),
        (b[1], 0, 1, 9.0),
        (b[2], 0, 0, 1.0),
        (b[2], 0, 1, 9.0),
        (b[3], 0, 0, 2.0),
        (b[3], 0, 1, 8.0),
    ]
    steps = pd.DataFrame(rows, columns=["bucket", "layer", "rank", "tokens"])
    assert data.hottest_since(steps, 0, 1) == b[1]
    assert data.hottest_since(steps, 0, 0) is None


SNAPSHOTS_FROM = datetime(2026, 11, 30, 10, 0, 30)
SNAPSHOTS = [
    (SNAPSHOTS_FROM + timedelta(minutes=k), "decode-0", layer, expert, float((k % 7 + 1) * (expert + 1) + layer))
    for k in range(190)  # 10:00:30 .. 13:09:30
    for layer in range(2)
    for expert in range(4)
]


def three_hours() -> duckdb.DuckDBPyConnection:
    """SNAPSHOTS stored and rolled up to 12:59:40: 10:00 and 11:00 in expert_load_1h, 12:00 not yet."""
    con = duckdb.connect()
    apply_migrations(con)
    con.executemany("INSERT INTO expert_load VALUES (?, ?, ?, ?, ?)", SNAPSHOTS)
    Rollups().advance(con, datetime(2026, 11, 30, 12, 59, 40))
    assert con.execute("SELECT count(DISTINCT ts) FROM expert_load_1h").fetchall() == [(2,)]
    return con


def test_expert_shares_read_the_hours_the_hourly_table_holds_and_give_the_snapshots_sums():
    """Snapshots once a minute for three hours: a window of whole hours and cut ones takes the
    hours the rollup closed from expert_load_1h and the rest (its edges, the open hour) from the
    snapshots, and every expert's tokens are the sum of its snapshots in the window."""
    con = three_hours()
    start, rows = SNAPSHOTS_FROM, SNAPSHOTS
    q = LocalQuery(con)
    want_first: dict[tuple[int, int], float] = {}
    for a, b, step in (
        ((10, 17, 30), (12, 41, 10), 60),  # 11:00 from the hourly table
        ((10, 0, 0), (13, 9, 40), 720),  # 10:00 and 11:00 from it, 12:00 and 13:00 from the snapshots
        ((11, 0, 0), (12, 0, 0), 3600),  # one whole hour, stepped in hours
        ((12, 30, 0), (12, 40, 0), 60),  # no whole hour
    ):
        w = Window(
            start.replace(hour=a[0], minute=a[1], second=a[2]), start.replace(hour=b[0], minute=b[1], second=b[2]), step
        )
        got = data.expert_share(q, w, "decode-0")
        want = {}
        for ts, _, layer, expert, tokens in rows:
            if w.start <= ts < w.end:
                want[layer, expert] = want.get((layer, expert), 0.0) + tokens
        want_first = want_first if a != (10, 17, 30) else want
        assert dict(zip(zip(got["layer"], got["expert"]), got["tokens"])) == want, (a, b)
    # the whole hour 11:00 of the first window is the hourly table's row, not sixty snapshots
    con.execute(
        "UPDATE expert_load_1h SET tokens = tokens + 1000 WHERE ts = ? AND layer = 1 AND expert = 3",
        [start.replace(hour=11, second=0)],
    )
    w = Window(start.replace(minute=17), start.replace(hour=12, minute=41, second=10), 60)
    got = data.expert_share(q, w, "decode-0").set_index(["layer", "expert"])["tokens"]
    assert got[1, 3] == want_first[1, 3] + 1000


def test_a_days_trend_has_a_point_per_hour_from_the_hourly_load_where_it_holds_the_hour():
    """A day's window (stepped in minutes) gives each hot expert's share of its layer per hour:
    the sums of that hour's snapshots in the window, 10:00 and 11:00 from expert_load_1h, 12:00 and
    13:00 (not rolled up yet) from the snapshots; a shorter window still gives every snapshot."""
    con = three_hours()
    q = LocalQuery(con)
    end = datetime(2026, 11, 30, 13, 9, 40)
    w = Window.between(end - timedelta(days=1), end)
    assert w.period != HOUR and data.hourly_trend(w)
    experts = pd.DataFrame({"layer": [0, 1], "expert": [3, 1]})
    tokens: dict[tuple[datetime, int, int], float] = {}
    for ts, _, layer, expert, n in SNAPSHOTS:
        key = (ts.replace(minute=0, second=0), layer, expert)
        tokens[key] = tokens.get(key, 0.0) + n

    def share(hour: datetime, layer: int, expert: int) -> float:
        return tokens[hour, layer, expert] / sum(tokens[hour, layer, e] for e in range(4))

    got = data.share_trend(q, w, "decode-0", experts)
    hours = [datetime(2026, 11, 30, h) for h in (10, 11, 12, 13)]
    assert sorted(set(got.ts)) == hours
    for r in got.itertuples():
        assert r.share == pytest.approx(share(r.ts, r.layer, r.expert), rel=1e-12), r
    assert set(zip(got.layer, got.expert)) == {(0, 3), (1, 1)}
    # 11:00 is the hourly table's row, not its sixty snapshots
    con.execute("UPDATE expert_load_1h SET tokens = tokens * 3 WHERE ts = ? AND layer = 1 AND expert = 1", [hours[1]])
    again = data.share_trend(q, w, "decode-0", experts).set_index(["ts", "layer", "expert"])["share"]
    t = tokens[hours[1], 1, 1]
    assert again[hours[1], 1, 1] == pytest.approx(3 * t / (3 * t + sum(tokens[hours[1], 1, e] for e in (0, 2, 3))))
    assert again[hours[2], 1, 1] == pytest.approx(share(hours[2], 1, 1))
    short = Window.between(end - timedelta(hours=2), end)
    assert not data.hourly_trend(short)
    since = short.start.replace(second=0)  # the minute the window starts in counts whole
    snapshots = {ts for ts, *_ in SNAPSHOTS if since <= ts < short.end}
    assert set(data.share_trend(q, short, "decode-0", experts).ts) == snapshots and len(snapshots) == 121
