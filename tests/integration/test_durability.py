"""SIGKILL the warehouse mid-run: the database opens clean and at most one interval is lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import duckdb
import httpx
import pytest

from stack.ready import scaled
from stack.twin.config import load_profile
from stack.twin.server import Twin, write_targets
from warehouse.db import Warehouse, migrations

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]
INTERVAL = 1.0


@pytest.fixture(scope="module")
def twin_targets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("twin")
    twin = Twin(load_profile("deepseek-v4.1-flash"), seed=8)
    targets = tmp / "targets.json"
    # Light targets, so a round takes a small part of the 1 s interval even on a busy CI machine.
    write_targets([t for t in twin.serve() if t["role"] in ("prefill", "router", "gpu")], targets)
    yield targets
    twin.close()


def serve(targets: Path, db: Path) -> tuple[subprocess.Popen, str]:  # type: ignore[type-arg]
    """`moemeter serve` (its log beside the database) and its query API's address, from the line it prints."""
    with (db.parent / "serve.log").open("a") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "moemeter",
                "serve",
                "--targets",
                str(targets),
                "--db",
                str(db),
                "--interval",
                str(INTERVAL),
                "--api-port",
                "0",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    first = proc.stdout.readline() if proc.stdout else ""
    if "query API http://" not in first:
        proc.kill()  # never left running for later tests
        proc.wait()
        raise AssertionError(f"serve said {first!r}: {(db.parent / 'serve.log').read_text()[-2000:]}")
    return proc, first.split("query API ")[1].split(";")[0]


def wait_rounds(api: str, n: int, within: float = 60) -> None:
    """Until the collector behind `api` has stored `n` rounds, with a deadline."""
    deadline = time.monotonic() + scaled(within)
    stored = 0
    while stored < n:
        assert time.monotonic() < deadline, f"{stored} of {n} rounds stored within {scaled(within):.0f} s"
        time.sleep(INTERVAL / 4)
        try:
            part = httpx.get(api + "/health", timeout=5).json().get("collector", {})
        except httpx.HTTPError:
            continue
        stored = part.get("rounds", 0)


def last_round(db: Path) -> tuple[datetime, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        ts, rounds = con.execute("SELECT max(ts), count(DISTINCT ts) FROM scrapes").fetchall()[0]
        orphans = con.execute(
            "SELECT count(*) FROM samples WHERE series_id NOT IN (SELECT series_id FROM series)"
        ).fetchall()
        assert orphans[0][0] == 0
    return ts, rounds


def test_sigkill_loses_at_most_one_interval_and_the_file_reopens(twin_targets, tmp_path):
    db = tmp_path / "w.duckdb"
    proc, api = serve(twin_targets, db)
    try:
        wait_rounds(api, 6)  # several rounds
        reported = httpx.get(api + "/health", timeout=5).json()["collector"]["rounds"]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    # The writer opens the same file again (replaying its write-ahead log) and applies nothing new...
    wh = Warehouse(db)
    assert wh.query_df("SELECT count(*) AS n FROM schema_migrations")["n"][0] == len(migrations())
    wh.close()
    ts, rounds = last_round(db)
    # Every round the collector reported stored before the kill is in the file; the round in flight
    # (at most one interval of data), and the one that committed between the question and the
    # kill, are the most that can be missing or added. (No clock in this: on a busy machine rounds
    # start late, which loses nothing.)
    assert reported <= rounds <= reported + 1, (reported, rounds)
    # ...and a collector restarted after an outage of two more intervals counts the tokens served
    # meanwhile in its first interval. (The outage has to be made: a restart alone can take under
    # one interval, when the kill lands just after a round began.)
    time.sleep(2 * INTERVAL)  # the outage itself: a length of time, not a wait for readiness
    restarted_at = datetime.utcnow()
    proc, api = serve(twin_targets, db)
    try:
        wait_rounds(api, 3)
    except AssertionError:
        proc.kill()
        raise
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT max(ts) FROM scrapes WHERE ts < ?", [restarted_at]).fetchall()[0][0] == ts
        first_after = con.execute("SELECT min(ts) FROM scrapes WHERE ts > ?", [ts]).fetchall()[0][0]
        # Each series' first increase after the restart, and how long since that series' own last
        # sample: a target whose scrape failed in the round before the kill was last seen earlier.
        gaps = con.execute(
            """SELECT i.seconds, epoch(i.ts) - epoch(max(p.ts)) FROM increments i
               JOIN series s USING (series_id)
               JOIN readings p ON p.series_id = i.series_id AND p.ts < i.ts
               WHERE s.metric = 'vllm:prompt_tokens_total' AND i.ts = ?
               GROUP BY i.series_id, i.seconds, i.ts""",
            [first_after],
        ).fetchall()
        # Per counter, the stored increases add up to exactly its rise from the first sample to the
        # last, across the kill and the outage: nothing lost, nothing counted twice.
        drift = con.execute("""
            SELECT s.series_id, (SELECT sum(delta) FROM increments i WHERE i.series_id = s.series_id),
                   arg_max(value, ts) - arg_min(value, ts)
            FROM readings JOIN series s USING (series_id)
            WHERE s.metric = 'vllm:prompt_tokens_total' GROUP BY s.series_id""").fetchall()
    assert first_after > restarted_at  # the restarted writer's first round
    # Each increase spans exactly the outage as that series saw it, from its last stored sample to
    # the first new round; those scraped in the last round before the kill span it from there.
    assert gaps and all(abs(seconds - since) < 1e-3 for seconds, since in gaps), gaps
    assert any(abs(seconds - (first_after - ts).total_seconds()) < 1e-3 for seconds, _ in gaps), (gaps, ts)
    assert min(seconds for seconds, _ in gaps) > 2 * INTERVAL
    assert drift and all(abs(summed - rise) < 1e-6 for _, summed, rise in drift), drift
