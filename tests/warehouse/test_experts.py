"""Expert snapshots: increases between snapshots, restarts from zero, placement stored on change."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import numpy as np
import pytest

from warehouse.db import apply_migrations
from warehouse.experts import ExpertIngestor, ExpertSnapshot, SnapshotError

T0 = datetime(2026, 11, 30, 12, 0, 0)


def snap(load, phy2log, ranks=2, rebalances=()):
    return ExpertSnapshot.from_json(
        {
            "schema": "moemeter.experts/1",
            "logical_tokens_total": load,
            "phy2log": phy2log,
            "ranks": ranks,
            "rebalances": list(rebalances),
        }
    )


@pytest.fixture
def con():
    c = duckdb.connect()
    apply_migrations(c)
    return c


def test_load_is_the_increase_between_snapshots_and_a_drop_is_a_restart(con):
    ing = ExpertIngestor()
    place = [[0, 1, 2, 0], [3, 2, 1, 0]]
    ing.write(con, "decode-0", T0, snap([[10, 0, 5, 1], [1, 1, 1, 1]], place))
    ing.write(con, "decode-0", T0 + timedelta(seconds=60), snap([[30, 4, 5, 1], [2, 1, 1, 9]], place))
    ing.write(con, "decode-0", T0 + timedelta(seconds=120), snap([[3, 0, 0, 0], [0, 0, 0, 2]], place))  # restart
    rows = con.execute("""SELECT ts, layer, expert, tokens FROM expert_load WHERE tokens > 0
                          ORDER BY ts, layer, expert""").fetchall()
    t1, t2 = T0 + timedelta(seconds=60), T0 + timedelta(seconds=120)
    assert rows == [
        (t1, 0, 0, 20.0),
        (t1, 0, 1, 4.0),
        (t1, 1, 0, 1.0),
        (t1, 1, 3, 8.0),
        (t2, 0, 0, 3.0),
        (t2, 1, 3, 2.0),
    ]
    snaps = con.execute("SELECT seconds, reset FROM expert_snapshots ORDER BY ts").fetchall()
    assert snaps == [(None, False), (60.0, False), (60.0, True)]


def test_placement_is_stored_only_when_it_changes_and_survives_a_restart(con):
    ing = ExpertIngestor()
    load = [[1, 1, 1, 1]]
    ing.write(con, "d", T0, snap(load, [[0, 1, 2, 3]]))
    ing.write(con, "d", T0 + timedelta(seconds=60), snap(load, [[0, 1, 2, 3]]))
    ing.write(con, "d", T0 + timedelta(seconds=120), snap(load, [[3, 2, 1, 0]]))
    ExpertIngestor().write(con, "d", T0 + timedelta(seconds=180), snap(load, [[3, 2, 1, 0]]))  # new process
    versions = con.execute("SELECT ts, count(*) FROM expert_placement GROUP BY ts ORDER BY ts").fetchall()
    assert versions == [(T0, 4), (T0 + timedelta(seconds=120), 4)]
    ranks = con.execute("SELECT slot, rank FROM expert_placement WHERE ts = ? ORDER BY slot", [T0]).fetchall()
    assert ranks == [(0, 0), (1, 0), (2, 1), (3, 1)]


def test_rebalance_events_are_stored_once_per_layer(con):
    ing = ExpertIngestor()
    ev = {
        "time": 1_796_000_000.0,
        "duration_seconds": 0.5,
        "moved_replicas": 7,
        "balancedness_before": [0.8, 0.7],
        "balancedness_planned": [0.98, 0.97],
    }
    for k in range(2):
        ing.write(con, "d", T0 + timedelta(seconds=60 * k), snap([[1, 1], [1, 1]], [[0, 1], [1, 0]], rebalances=[ev]))
    rows = con.execute(
        "SELECT layer, balancedness_before, balancedness_planned FROM eplb_rebalances ORDER BY layer"
    ).fetchall()
    assert rows == [(0, 0.8, 0.98), (1, 0.7, 0.97)]
    # a restarted collector, the same recent events again plus a newer one: only the new one is added
    later = {**ev, "time": ev["time"] + 600, "balancedness_before": [0.6, 0.5]}
    ExpertIngestor().write(
        con, "d", T0 + timedelta(seconds=180), snap([[1, 1], [1, 1]], [[0, 1], [1, 0]], rebalances=[ev, later])
    )
    assert con.execute("SELECT count(*), count(DISTINCT ts) FROM eplb_rebalances").fetchall() == [(4, 2)]


@pytest.mark.parametrize(
    "body,match",
    [
        ({"schema": "other"}, "not a moemeter.experts/1"),
        ({"schema": "moemeter.experts/1", "phy2log": [[0]], "ranks": 1}, "malformed"),
        (
            {"schema": "moemeter.experts/1", "logical_tokens_total": [[1, 2]], "phy2log": [[0, 1], [0, 1]], "ranks": 1},
            "shapes disagree",
        ),
        (
            {"schema": "moemeter.experts/1", "logical_tokens_total": [[1, 2]], "phy2log": [[0, 1, 1]], "ranks": 2},
            "do not divide",
        ),
        (
            {"schema": "moemeter.experts/1", "logical_tokens_total": [[1, -2]], "phy2log": [[0, 1]], "ranks": 1},
            "non-negative",
        ),
        (
            {"schema": "moemeter.experts/1", "logical_tokens_total": [[1, 2]], "phy2log": [[0, 5]], "ranks": 1},
            "does not exist",
        ),
    ],
)
def test_bad_snapshots_are_refused(body, match):
    with pytest.raises(SnapshotError, match=match):
        ExpertSnapshot.from_json(body)


def test_snapshot_matrices_keep_their_shape():
    s = snap(np.ones((3, 4)).tolist(), [[0, 1, 2, 3, 0, 1]] * 3, ranks=3)
    assert s.logical_tokens_total.shape == (3, 4) and s.phy2log.shape == (3, 6)


@pytest.mark.slow("hours of expert-load pages rolled to hours")
def test_expert_load_downsamples_to_hours_and_retention_keeps_what_is_not_rolled_up(con):
    from collectors.parse import parse_page
    from moemeter.contract import TargetInfo
    from warehouse.ingest import Ingestor, ScrapeBatch
    from warehouse.rollup import Retention

    scrapes, experts = Ingestor(Retention(raw_days=1 / 24)), ExpertIngestor()
    target = TargetInfo("decode-0", "http://x/metrics", "decode", 2, "test")
    place, start = [[0, 1, 2, 0], [3, 2, 1, 0]], datetime(2026, 11, 30, 10, 0, 0)
    for k in range(3 * 60 + 1):  # a snapshot and a scrape every minute, 10:00 .. 13:00
        at = start + timedelta(minutes=k)
        experts.write(con, "decode-0", at, snap([[k, 2 * k, 0, 0], [0, 0, 3 * k, 0]], place))
        scrapes.write(con, ScrapeBatch(target, at, True, 0.01, parse_page(b'# TYPE up gauge\nup{x="1"} 1\n')))
    hours = con.execute("""SELECT ts, layer, expert, tokens, snapshots FROM expert_load_1h WHERE tokens > 0
                           ORDER BY ALL""").fetchall()
    h = [start + timedelta(hours=i) for i in range(3)]
    # 10:00 holds 59 increases (the first snapshot has none), 11:00 and 12:00 sixty each.
    assert hours == [
        (h[0], 0, 0, 59.0, 59),
        (h[0], 0, 1, 118.0, 59),
        (h[0], 1, 2, 177.0, 59),
        (h[1], 0, 0, 60.0, 60),
        (h[1], 0, 1, 120.0, 60),
        (h[1], 1, 2, 180.0, 60),
        (h[2], 0, 0, 60.0, 60),
        (h[2], 0, 1, 120.0, 60),
        (h[2], 1, 2, 180.0, 60),
    ]
    # Retention ran when 13:00 closed hour 12: per-snapshot rows older than an hour are gone.
    oldest = con.execute("SELECT min(ts) FROM expert_load").fetchall()[0][0]
    assert start + timedelta(hours=2) <= oldest
    kept = con.execute("SELECT sum(tokens) FROM expert_load WHERE ts >= '2026-11-30 13:00'").fetchall()[0][0]
    assert con.execute("SELECT sum(tokens) FROM expert_load_1h").fetchall()[0][0] + kept == 180 * 6.0
