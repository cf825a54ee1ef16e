"""The fleet's DuckLake on a real PostgreSQL catalog: a rack publishes what has closed, and the lake
answers the rack's own reports to the cent (the hand-computed rack of test_cost.py); publishing again
duplicates nothing; rows that arrive late replace what was published; readers cannot write."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest

import warehouse.lake as lake_module
from dashboard.data import live
from moemeter.cli import main
from moemeter.contract.requests import RequestRecord
from stack.ready import scaled
from tests.postgres import running_postgres
from warehouse.api import LocalQuery
from warehouse.db import Warehouse, apply_migrations
from warehouse.export import RackNameError
from warehouse.lake import (
    SERIES,
    SHEETS,
    TABLES,
    Publisher,
    commit_lock,
    connect,
    ensure_schema,
    open_reader,
    retry_conflicts,
    table_files,
    tidy,
)
from warehouse.read import Holdings
from warehouse.requests import RequestIngestor

from .conftest import FIXTURES, page
from .layouts import T0 as ROUNDS_T0
from .layouts import write_rounds, written_before

pytestmark = pytest.mark.integration  # starts PostgreSQL
WINDOW = ["--from", "2026-11-29T10:00:00Z", "--to", "2026-11-29T12:00:00Z"]


@pytest.fixture(scope="module")
def postgres():
    with running_postgres() as database:
        yield database


@pytest.fixture
def lake(postgres, tmp_path):
    """A new lake: a fresh catalog database and data path (catalog URI, data path)."""
    return postgres(f"lake_{tmp_path.name.lower().replace('-', '_')[:40]}"), str(tmp_path / "lake-files")


def ingest(db, name: str, role: str, gpus: int, capture: str, values: dict[str, float], at: datetime, tmp) -> None:
    f = tmp / f"{name}-{at:%H%M%S}.txt"
    f.write_text(page(capture, values))
    argv = ["ingest", "--file", str(f), "--target", name, "--at", at.isoformat(), "--db", str(db)]
    assert main([*argv, "--role", role, "--gpus", str(gpus)]) == 0


@pytest.fixture
def closed_rack(rack, tmp_path):
    """The cost rack, copied, with two more scrapes of each instance at 12:00:05 and 12:01:05
    (counters as at 11:59:55), so its 10:00-12:00 minutes and hours have closed: the interval that
    reaches back into 11:59 is rolled up once 12:00 has closed."""
    db, targets = rack
    copy = tmp_path / "rack.duckdb"
    shutil.copy(db, copy)
    for at in (datetime(2026, 11, 29, 12, 0, 5), datetime(2026, 11, 29, 12, 1, 5)):
        pf = {"vllm:prompt_tokens_total": 1_500_000, "vllm:prompt_tokens_by_source_total|local_cache_hit": 300_000}
        ingest(copy, "prefill-0", "prefill", 2, "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt", pf, at, tmp_path)
        dc = {"vllm:generation_tokens_total": 1_000_000}
        ingest(copy, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at, tmp_path)
    return copy, targets


def publish(db, lake, rack: str = "rack-a", *extra: str) -> None:
    uri, data = lake
    assert main(["publish", "--db", str(db), "--lake", uri, "--lake-data", data, "--rack", rack, *extra]) == 0


def cost(capsys, *source: str) -> dict:
    capsys.readouterr()
    assert main(["report", "cost", *WINDOW, "--json", *source]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_lake_answers_the_racks_own_cost_report_to_the_cent(closed_rack, lake, capsys):
    db, targets = closed_rack
    publish(db, lake)
    local = cost(capsys, "--db", str(db), "--targets", str(targets))
    uri, _ = lake
    from_lake = cost(capsys, "--lake", uri, "--rack", "rack-a")
    for part in ("pools", "total", "users", "window"):
        assert from_lake[part] == local[part], json.dumps([from_lake[part], local[part]])
    assert from_lake == local
    # the hand-computed numbers of test_cost.py
    assert from_lake["total"]["cost_usd"] == 467.52
    assert from_lake["pools"]["prefill"]["computed_prompt_tokens"] == 3_200_000
    assert from_lake["pools"]["decode"]["generated_tokens"] == 1_000_000
    assert {u["user"]: u["cost_usd"] for u in from_lake["users"]} == {"alice": 181.81, "bob": 285.71}


def test_the_lake_gives_the_live_pages_latency_histograms_as_the_rack_does(lake, tmp_path):
    """A lake's rack keeps no pool rollups: its per-series minute rows, summed per pool, give the
    counts the rack's own file gives from its pool rollups (two real pages, every value growing,
    130 minutes)."""
    db = tmp_path / "rack.duckdb"
    with duckdb.connect(str(db)) as con:
        apply_migrations(con)
        write_rounds(con, range(130))
    publish(db, lake)
    uri, data = lake
    w = live.Window(ROUNDS_T0, ROUNDS_T0 + timedelta(hours=2), 600)
    families = list(live.LATENCY_FAMILIES)
    with duckdb.connect(str(db), read_only=True) as con:
        assert Holdings.of(LocalQuery(con)).pooled
        local = live.histograms_counts(LocalQuery(con), w, families)
    with open_reader(uri, rack="rack-a", data_path=data) as con:
        assert not Holdings.of(LocalQuery(con)).pooled
        from_lake = live.histograms_counts(LocalQuery(con), w, families)
    for family in families:
        assert local[family]["count"].sum() > 0, family
        assert from_lake[family][["bucket", "role", "le"]].equals(local[family][["bucket", "role", "le"]])
        assert from_lake[family]["count"].to_numpy() == pytest.approx(local[family]["count"].to_numpy(), rel=1e-12)


def lake_rows(lake, table: str, rack: str = "rack-a") -> list[tuple]:
    uri, data = lake
    with open_reader(uri, data_path=data) as con:
        return con.execute(f"SELECT * EXCLUDE (rack) FROM lake.{table} WHERE rack = ? ORDER BY ALL", [rack]).fetchall()


def local_rows(db, table: str) -> list[tuple]:
    """The rows of a table of the rack's file that have closed (raw scrapes: before the rollups'
    minute; hour rows: before its hour, the open hour is published once it has closed), each
    series named by its key, as the lake names it."""
    minute = "(SELECT through FROM rollup_state WHERE name = '1m')"
    hour = "(SELECT through FROM rollup_state WHERE name = '1h')"
    closed = {
        "scrapes": f"WHERE ts < {minute}",
        "increments_1h": f"WHERE ts < time_bucket(INTERVAL 1 HOUR, {minute})",
        "requests_1h": f"WHERE ts < {hour}",  # a request's hour, published once its hour has rolled up
        "requests_itl_1h": f"WHERE ts < {hour}",
        "requests_slo_1h": f"WHERE ts < {hour}",
        "requests_slo_1m": "WHERE ts < (SELECT through FROM rollup_state WHERE name = 'requests_slo_1m')",
    }.get(table, "")
    with duckdb.connect(str(db), read_only=True) as con:
        if table == "series":
            return con.execute("SELECT * REPLACE (series_key AS series_id) FROM series ORDER BY ALL").fetchall()
        columns = {r[0] for r in con.execute(f"SELECT column_name FROM (DESCRIBE {table})").fetchall()}
        if "series_id" in columns:
            return con.execute(
                f"""SELECT x.* REPLACE (s.series_key AS series_id)
                    FROM (SELECT * FROM {table} {closed}) x JOIN series s USING (series_id) ORDER BY ALL"""
            ).fetchall()
        return con.execute(f"SELECT * FROM {table} {closed} ORDER BY ALL").fetchall()


def test_publishing_again_duplicates_nothing(closed_rack, lake, capsys):
    db, _ = closed_rack
    publish(db, lake)
    first = {t: lake_rows(lake, t) for t in ("increments_1m", "increments_1h", "scrapes", "requests_1h", "series")}
    publish(db, lake)
    assert "nothing new to publish" in capsys.readouterr().out
    again = {t: lake_rows(lake, t) for t in first}
    assert again == first
    for t in first:
        assert again[t] == local_rows(db, t), t  # and every row is the rack's own, once


def test_a_late_interval_replaces_the_minutes_it_reaches_back_into(closed_rack, lake, tmp_path):
    """A decode scrape after 10 minutes down covers the 10 minutes: its increase splits into minutes
    the lake already holds, and the next step replaces them."""
    db, _ = closed_rack
    publish(db, lake)
    for at in (datetime(2026, 11, 29, 12, 11, 5), datetime(2026, 11, 29, 12, 12, 5)):  # the second rolls the first
        dc = {"vllm:generation_tokens_total": 1_600_000}
        ingest(db, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at, tmp_path)
        pf = {"vllm:prompt_tokens_total": 1_500_000, "vllm:prompt_tokens_by_source_total|local_cache_hit": 300_000}
        ingest(db, "prefill-0", "prefill", 2, "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt", pf, at, tmp_path)
    publish(db, lake)
    assert lake_rows(lake, "increments_1m") == local_rows(db, "increments_1m")
    assert lake_rows(lake, "increments_1h") == local_rows(db, "increments_1h")
    minutes = [r for r in lake_rows(lake, "increments_1m") if r[0] >= datetime(2026, 11, 29, 12, 1) and r[2] > 0]
    assert len({r[0] for r in minutes}) == 11  # 12:01 .. 12:11 each hold their share of the 600,000


def test_hours_the_writer_compacted_after_they_were_published_are_published_again(closed_rack, lake, tmp_path):
    """The lake holds hour 11:00 with two rows per series (the interval closing at 12:00:05 added
    to it after it closed); when 13:00 closes, the writer compacts it to one, and so must the lake."""
    db, _ = closed_rack
    publish(db, lake)
    for at in (datetime(2026, 11, 29, 13, 0, 5), datetime(2026, 11, 29, 13, 1, 5)):
        dc = {"vllm:generation_tokens_total": 1_200_000}
        ingest(db, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at, tmp_path)
    local = local_rows(db, "increments_1h")
    assert len({r[:2] for r in local if r[0] == datetime(2026, 11, 29, 11)}) == len(
        [r for r in local if r[0] == datetime(2026, 11, 29, 11)]
    )  # compacted: one row per series
    publish(db, lake)
    assert lake_rows(lake, "increments_1h") == local


def lake_files(lake) -> dict[str, tuple[int, int]]:
    """Each lake table's data files and delete files in the current snapshot."""
    con = connect(*lake)
    try:
        return {name: (f.data, f.deletes) for name, f in table_files(con).items()}
    finally:
        con.close()


def test_a_publisher_leaves_one_file_per_table_and_rack_and_every_row_as_it_was(
    closed_rack, lake, tmp_path, monkeypatch
):
    """A backlog in 30-min steps, then a late interval that replaces minutes already published:
    each leaves files and delete files, and the publisher's tidy one file per table with no
    deleted rows; the files a replaced snapshot reads stay on disk until it is KEEP_SNAPSHOTS old."""
    db, _ = closed_rack
    uri, data = lake
    publish(db, lake, "rack-a", "--chunk-minutes", "30")  # five steps, then a tidy
    files = lake_files(lake)
    assert files["increments_1m"] == files["samples_1m"] == (1, 0), files
    for at in (datetime(2026, 11, 29, 12, 11, 5), datetime(2026, 11, 29, 12, 12, 5)):
        dc = {"vllm:generation_tokens_total": 1_600_000}
        ingest(db, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at, tmp_path)
    con = connect(uri, data)
    try:
        pub = Publisher(con, "rack-a")
        pub._tidied = time.monotonic()  # as if tidied just now: the step below leaves its files
        with duckdb.connect(str(db), read_only=True) as local:
            assert pub.catch_up(local)
        untidy = lake_files(lake)
        assert untidy["increments_1m"][0] >= 2 and untidy["increments_1m"][1] >= 1, untidy
        done = pub.tidy()
        assert done is not None and done.rewritten >= 1 and done.merged >= 1 and done.removed == 0, done
    finally:
        con.close()
    files = lake_files(lake)
    assert all(f == (1, 0) for f in files.values() if f != (0, 0)), files
    for name in [t.name for t in TABLES] + [*SHEETS, SERIES]:
        assert lake_rows(lake, name) == local_rows(db, name), name
    on_disk = lambda: sum(1 for _ in (tmp_path / "lake-files").rglob("*.parquet"))  # noqa: E731
    assert on_disk() > sum(n for n, _ in files.values())  # a read of an older snapshot finds its files
    orphan = tmp_path / "lake-files" / "main" / "increments_1m" / "ducklake-left-by-a-killed-step.parquet"
    shutil.copy(next((tmp_path / "lake-files" / "main" / "increments_1m").rglob("*.parquet")), orphan)
    monkeypatch.setattr(lake_module, "KEEP_SNAPSHOTS", timedelta(0))
    con = connect(uri, data)
    try:
        again = tidy(con)
    finally:
        con.close()
    assert again.rewritten == again.merged == 0 and again.removed > 0, again
    assert on_disk() == sum(n for n, _ in lake_files(lake).values()) and not orphan.exists()
    for name in [t.name for t in TABLES] + [*SHEETS, SERIES]:
        assert lake_rows(lake, name) == local_rows(db, name), name


def deleted_by_last_commit(lake) -> set[str]:
    """The tables the lake's latest snapshot deleted rows from (files or inlined rows)."""
    uri, data = lake
    con = connect(uri, data)
    try:
        names = {
            str(i): n for n, i in con.execute("SELECT table_name, table_id FROM ducklake_table_info('lake')").fetchall()
        }
        [changes] = con.execute(
            "SELECT changes FROM ducklake_snapshots('lake') ORDER BY snapshot_id DESC LIMIT 1"
        ).fetchone()
    finally:
        con.close()
    return {names[i] for key in ("tables_deleted_from", "inlined_delete") for i in changes.get(key) or []}


def store_requests(db, at: datetime, *records: tuple[int, str, datetime, int, int, int]) -> None:
    """Gateway records stored by the round at `at`, after the cost rack's three of the same log:
    (seq, user, finished at, prompt, cached prompt, generated tokens) each."""
    recs = [
        {
            "seq": seq,
            **RequestRecord(
                f"late-{seq}",
                (finished - datetime(1970, 1, 1)).total_seconds() - 2,
                user,
                "acme",
                "m",
                "completions",
                False,
                200,
                "ok",
                prompt,
                cached,
                generated,
                e2e_seconds=2.0,
            ).to_json(),
        }
        for seq, user, finished, prompt, cached, generated in records
    ]
    wh = Warehouse(db)
    try:
        wh.write(
            lambda con: RequestIngestor().write(
                con, "gateway", {"schema": "moemeter.requests/1", "log_id": "A", "records": recs}, at
            )
        )
    finally:
        wh.close()


def test_the_lake_counts_each_users_whole_hours_as_the_file_does_with_requests_stored_after_the_hour_rolled_up(
    closed_rack, lake, capsys, tmp_path
):
    """A request that finished in an hour's last seconds is stored by the next round, after the
    hour has rolled up (requests_1h adds the records by when they were stored). The file counts it
    from its records; the lake, which holds no records, must hold it in the hour's sums: it left it
    out until the next hour rolled up (a 3 h twin's 15:00-17:00: 2,839 requests stored at 17:00:01,
    586 of its 598 users off by up to 0.3%), and its users then differed from the file's."""
    db, targets = closed_rack
    uri, data = lake
    local_source = ("--db", str(db), "--targets", str(targets))
    lake_source = ("--lake", uri, "--rack", "rack-a")

    def same_users() -> list[dict]:
        local, from_lake = cost(capsys, *local_source), cost(capsys, *lake_source)
        assert from_lake["pools"] == local["pools"] and from_lake["total"] == local["total"]
        by_user = {(u["tenant"], u["user"]): u for u in local["users"]}
        for u in from_lake["users"]:  # requests, prompt, cached prompt, generated tokens and cost, user by user
            assert u == by_user.pop((u["tenant"], u["user"]), None), (
                u,
                [x for x in local["users"] if x["user"] == u["user"]],
            )
        assert not by_user, by_user  # no user of the file missing from the lake
        return local["users"]

    # stored at 12:00:30, after the hour roll-up at 12:00:05 (the rack's 1h watermark is 12:00)
    store_requests(
        db,
        datetime(2026, 11, 29, 12, 0, 30),
        (4, "alice", datetime(2026, 11, 29, 11, 59, 58), 700, 200, 40),
        (5, "dave", datetime(2026, 11, 29, 10, 59, 59), 500, 0, 25),
    )
    publish(db, lake)
    users = {u["user"]: u for u in same_users()}
    assert (users["alice"]["requests"], users["alice"]["prompt_tokens"], users["dave"]["requests"]) == (2, 1000, 1)
    # one more, stored after a running publisher's step that published the hour: its next step
    # publishes the hour again (it reaches back from its last minute watermark)
    con = connect(uri, data)
    try:
        pub = Publisher(con, "rack-a")
        steps = []
        for minute, late in ((2, None), (3, (6, "bob", datetime(2026, 11, 29, 11, 59, 59), 300, 100, 60))):
            if late is not None:
                store_requests(db, datetime(2026, 11, 29, 12, minute - 1, 30), late)
            dc = {"vllm:generation_tokens_total": 1_000_000}  # the minute closes
            capture = "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt"
            ingest(db, "decode-0", "decode", 4, capture, dc, datetime(2026, 11, 29, 12, minute, 5), tmp_path)
            with duckdb.connect(str(db), read_only=True) as local:
                steps.append(pub.step(local))
        assert steps[1] is not None and steps[1].rows["requests_1h"], steps
    finally:
        con.close()
    users = {u["user"]: u for u in same_users()}
    assert (users["bob"]["requests"], users["bob"]["generated_tokens"]) == (2, 210)


def add_events(db, *stamps: datetime) -> None:
    """Rebalance events of decode-0 finished at these times, stored as the collector stores them."""
    with duckdb.connect(str(db)) as con:
        for at in stamps:
            con.execute("INSERT OR IGNORE INTO eplb_rebalances VALUES (?, 'decode-0', 0.4, 12, 3, 0.8, 0.95)", [at])


def test_a_step_appends_new_rebalance_events_and_replaces_no_request_sums_it_did_not_change(
    closed_rack, lake, tmp_path
):
    """Events never change and request sums change only when records roll up: a step that brings
    neither deletes nothing from their tables (it used to replace an hour of each, every minute);
    an event that arrives late is published once."""
    db, _ = closed_rack
    uri, data = lake
    add_events(db, datetime(2026, 11, 29, 11, 30), datetime(2026, 11, 29, 11, 59, 30))
    con = connect(uri, data)
    try:
        pub = Publisher(con, "rack-a", chunk=timedelta(minutes=30))
        with duckdb.connect(str(db), read_only=True) as local:
            assert pub.catch_up(local)
        for minute, late in ((2, None), (3, datetime(2026, 11, 29, 11, 45))):
            if late is not None:
                add_events(db, late)
            for name, role, gpus, capture, values in (
                ("decode-0", "decode", 4, "decode", {"vllm:generation_tokens_total": 1_000_000}),
                ("prefill-0", "prefill", 2, "prefill", {"vllm:prompt_tokens_total": 1_500_000}),
            ):
                capture = f"vllm-0.32.0-cpu-pd-{capture}-nixl.metrics.txt"
                ingest(db, name, role, gpus, capture, values, datetime(2026, 11, 29, 12, minute, 5), tmp_path)
            with duckdb.connect(str(db), read_only=True) as local:
                step = pub.step(local)
            assert step is not None and step.through["1m"] == datetime(2026, 11, 29, 12, minute)
            assert step.rows["eplb_rebalances"] == (0 if late is None else 1), step.rows
            deleted = deleted_by_last_commit(lake)
            assert not deleted & {"eplb_rebalances", "requests_1h", "requests_itl_1h", "requests_slo_1h"}, deleted
    finally:
        con.close()
    for name in [t.name for t in TABLES]:
        assert lake_rows(lake, name) == local_rows(db, name), name
    assert len(lake_rows(lake, "eplb_rebalances")) == 3


def test_a_price_sheet_loaded_between_steps_is_published_and_an_unchanged_one_is_not_rewritten(
    closed_rack, lake, tmp_path
):
    db, _ = closed_rack
    uri, data = lake
    con = connect(uri, data)
    try:
        pub = Publisher(con, "rack-a")
        with duckdb.connect(str(db), read_only=True) as local:
            assert "gpu_prices" not in {k for s in pub.catch_up(local) for k in s.rows}  # empty here and there
        with duckdb.connect(str(db)) as local:
            local.execute(
                "INSERT INTO gpu_prices VALUES ('2026-11-29 12:00', 'decode', 9.5, 'prices.csv', 'test', now()::TIMESTAMP)"
            )
        for minute in (2, 3):  # two more minutes close
            at = datetime(2026, 11, 29, 12, minute, 5)
            dc = {"vllm:generation_tokens_total": 1_000_000}
            ingest(db, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at, tmp_path)
            with duckdb.connect(str(db), read_only=True) as local:
                step = pub.step(local)
            assert step is not None
            assert ("gpu_prices" in step.rows) == (minute == 2), step.rows  # once, when it changed
    finally:
        con.close()
    assert lake_rows(lake, "gpu_prices") == local_rows(db, "gpu_prices") and len(local_rows(db, "gpu_prices")) == 1


def test_a_rack_publishes_in_bounded_steps_and_resumes_where_it_stopped(closed_rack, lake):
    db, _ = closed_rack
    uri, data = lake
    con = connect(uri, data)
    try:
        pub = Publisher(con, "rack-a", chunk=timedelta(minutes=30))
        with duckdb.connect(str(db), read_only=True) as local:
            first = pub.step(local)
            assert first is not None and first.through["1m"] == datetime(2026, 11, 29, 10, 30)
            again = Publisher(con, "rack-a", chunk=timedelta(minutes=30))  # as after a restart
            rest = again.catch_up(local)
    finally:
        con.close()
    assert [s.through["1m"].strftime("%H:%M") for s in rest] == ["11:00", "11:30", "12:00", "12:01"]
    assert lake_rows(lake, "increments_1m") == local_rows(db, "increments_1m")
    assert lake_rows(lake, "scrapes") == local_rows(db, "scrapes")


REQUEST_TABLES = [t.name for t in TABLES if t.reach == "requests"]


def test_a_restarted_publisher_removes_request_sums_published_past_its_watermark(closed_rack, lake, tmp_path):
    """The publisher before c84ee87 published request sums of periods its clock had not rolled up
    (a gateway's clock ahead stamps them there). Upgraded, its first commit removes them, so the
    watermark reaching them later does not count them twice."""
    db, _ = closed_rack
    uri, data = lake
    publish(db, lake)
    con = connect(uri, data)
    try:
        strays = {  # an hour past the rack's last rows: what the old version left
            name: con.execute(
                f"INSERT INTO lake.{name} SELECT * REPLACE (ts + INTERVAL 1 HOUR AS ts) FROM lake.{name} "
                f"WHERE rack = 'rack-a' AND ts = (SELECT max(ts) FROM lake.{name} WHERE rack = 'rack-a')"
            ).fetchone()[0]
            for name in REQUEST_TABLES
        }
        assert strays["requests_1h"] and strays["requests_slo_1m"], strays  # (this rack has no ITL sums)
        at = datetime(2026, 11, 29, 12, 2, 5)  # a minute closes
        dc = {"vllm:generation_tokens_total": 1_000_000}
        ingest(db, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at, tmp_path)
        with duckdb.connect(str(db), read_only=True) as local:
            assert Publisher(con, "rack-a").step(local) is not None
    finally:
        con.close()
    for name in [t.name for t in TABLES]:
        assert lake_rows(lake, name) == local_rows(db, name), name


def identified(con, prefix: str = "", where: str = "") -> list[tuple]:
    """Minute rows with their series' target, metric and labels in place of its id."""
    return con.execute(
        f"""SELECT s.target, s.metric, s.labels, s.le, x.ts, x.delta, x.seconds, x.resets, x.idle_seconds
            FROM {prefix}increments_1m x JOIN {prefix}series s ON s.series_id = x.series_id {where} ORDER BY ALL"""
    ).fetchall()


def test_a_rack_published_before_series_were_renumbered_answers_as_its_own_file_after(
    closed_rack, lake, tmp_path, capsys
):
    """A rack that published while its series ids were hashes, then had its file renumbered by
    migration 015 and published on: the lake names every series by its key (the old id) before
    and after, so it holds each series once and answers as the rack's file does."""
    db, targets = closed_rack
    hashed = tmp_path / "hashed.duckdb"
    with duckdb.connect(str(db), read_only=True) as new:
        written_before(new, 15, str(hashed)).close()
    uri, data = lake
    publish(db, lake)  # the same rows; then made as the version before 015 published them from `hashed`
    with duckdb.connect(str(db), read_only=True) as local:
        hashes = local.execute("SELECT series_id AS id, series_key AS key FROM series").to_arrow_table()
    con = connect(uri, data)
    try:
        con.register("hashes", hashes)
        for name in ("series", "increments_1m", "increments_1h", "samples_1m", "samples_1h"):
            con.execute(
                f"UPDATE lake.{name} SET series_id = h.key FROM hashes h "
                f"WHERE lake.{name}.series_id = h.id AND lake.{name}.rack = 'rack-a'"
            )
        con.execute("ALTER TABLE lake.series DROP COLUMN series_key")  # the series ids hashes, no key column
    finally:
        con.close()
    for at in (datetime(2026, 11, 29, 12, 2, 5), datetime(2026, 11, 29, 12, 3, 5)):
        # the upgraded writer opens the file (migration 015); a million tokens over 12:01:05-12:02:05
        dc = {"vllm:generation_tokens_total": 2_000_000}
        ingest(hashed, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at, tmp_path)
    publish(hashed, lake)
    with open_reader(uri, data_path=data) as con:
        in_lake = identified(con, "lake.", "WHERE x.rack = 'rack-a' AND s.rack = 'rack-a'")
        ids = con.execute(
            "SELECT count(*), count(DISTINCT series_id) FROM lake.series WHERE rack = 'rack-a'"
        ).fetchall()
    with duckdb.connect(str(hashed), read_only=True) as con:
        assert in_lake == identified(con, where="WHERE x.ts < (SELECT through FROM rollup_state WHERE name = '1m')")
        n = con.execute("SELECT count(*) FROM series").fetchall()[0][0]
    assert ids == [(n, n)]  # each series once, under its key, before and after the renumbering
    window = ["--from", "2026-11-29T10:00:00Z", "--to", "2026-11-29T12:02:00Z"]  # minutes closed in both
    capsys.readouterr()
    assert main(["report", "cost", *window, "--json", "--db", str(hashed), "--targets", str(targets)]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["report", "cost", *window, "--json", "--lake", uri, "--rack", "rack-a"]) == 0
    from_lake = json.loads(capsys.readouterr().out)
    for part in ("pools", "total", "users", "window"):
        assert from_lake[part] == local[part], json.dumps([from_lake[part], local[part]])
    assert from_lake == local
    # a million under the hashed ids, and 55 s of the next interval's million under the new ones
    assert local["pools"]["decode"]["generated_tokens"] == 1_916_667  # counted across the renumbering


def test_the_lake_reader_writes_nothing_and_names_what_it_refuses(closed_rack, lake, capsys):
    db, _ = closed_rack
    publish(db, lake)
    uri, data = lake
    before = lake_rows(lake, "increments_1m")
    for sql in ("DELETE FROM lake.increments_1m", "SELECT * FROM read_parquet('/etc/passwd')"):
        assert main(["query", "--lake", uri, "--lake-data", data, sql]) == 2
        assert "refused" in capsys.readouterr().err
    with open_reader(uri, data_path=data) as con, pytest.raises(duckdb.Error, match="read-only|READ_ONLY"):
        con.execute("DELETE FROM lake.increments_1m")
    assert lake_rows(lake, "increments_1m") == before
    assert main(["query", "--lake", uri, "--rack", "rack-b", "SELECT 1"]) == 2
    assert "rack 'rack-b' has published nothing to this lake (racks: rack-a)" in capsys.readouterr().err
    assert main(["query", "--lake", uri, "--rack", "rack-a", "SELECT count(*) AS n FROM series"]) == 0
    assert int(capsys.readouterr().out.split()[-1]) == len(local_rows(db, "series"))


def test_the_fleet_report_adds_up_the_racks(closed_rack, lake, capsys):
    db, _ = closed_rack
    publish(db, lake, "rack-a")
    publish(db, lake, "rack-b")
    uri, _ = lake
    fleet = cost(capsys, "--lake", uri)
    assert sorted(fleet["racks"]) == ["rack-a", "rack-b"]
    assert fleet["fleet"]["cost_usd"] == 2 * 467.52
    assert fleet["fleet"]["generated_tokens"] == 2_000_000
    assert fleet["fleet"]["usd_per_mtok_input"] == 48.70  # the racks' $/M, as both are alike
    assert main(["report", "cost", *WINDOW, "--lake", uri]) == 0
    text = capsys.readouterr().out
    assert "fleet" in text and "$935.04" in text


def test_bad_lake_arguments_say_what_is_wrong(closed_rack, tmp_path, capsys):
    db, _ = closed_rack
    argv = ["publish", "--db", str(db), "--lake", f"postgres:dbname=lake host={tmp_path} port=1", "--rack", "a"]
    assert main(argv) == 2
    assert "cannot attach the lake" in capsys.readouterr().err
    with pytest.raises(RackNameError, match="rack name"):
        Publisher(duckdb.connect(), "../etc")


def test_export_reads_a_rack_of_the_lake(closed_rack, lake, tmp_path):
    db, _ = closed_rack
    publish(db, lake)
    uri, data = lake
    out = tmp_path / "out"
    argv = ["export", "--lake", uri, "--rack", "rack-a", "--out", str(out), *WINDOW]
    assert main([*argv, "--tables", "increments_1m,series"]) == 0
    with duckdb.connect() as con:
        exported = con.execute(
            f"SELECT * EXCLUDE (rack, day) FROM read_parquet('{out}/increments_1m/**/*.parquet', hive_partitioning = true) "
            "ORDER BY ALL"
        ).fetchall()
    window = [
        r for r in local_rows(db, "increments_1m") if datetime(2026, 11, 29, 10) <= r[0] < datetime(2026, 11, 29, 12)
    ]
    assert exported == window and len(window) > 100
    assert main(["export", "--lake", uri, "--out", str(out), *WINDOW]) == 2  # which rack, then?


def test_the_focus_export_of_a_rack_of_the_lake_is_the_racks_own_row_for_row(closed_rack, lake, tmp_path, capsys):
    """`report focus --lake --rack` over whole hours writes the rows the rack's own file gives, on
    both bases, per user; their BilledCost adds up to the lake's `report cost` to the cent."""
    db, targets = closed_rack
    publish(db, lake)
    uri, data = lake
    local_source = ("--db", str(db), "--targets", str(targets))
    lake_source = ("--lake", uri, "--lake-data", data)
    for basis in ("allocation", "usage"):
        exported = []
        for name, source in (("file", local_source), ("lake", lake_source)):
            out = tmp_path / f"focus-{basis}-{name}.parquet"
            argv = ["report", "focus", *WINDOW, *source, "--rack", "rack-a", "--by", "user", "--basis", basis]
            assert main([*argv, "--out", str(out)]) == 0
            exported.append(pd.read_parquet(out))
        local, from_lake = exported
        assert len(local) > 10 and set(local["x_AllocatedResourceId"].dropna()) == {"acme/alice", "acme/bob"}
        pd.testing.assert_frame_equal(from_lake, local, rtol=1e-12)  # floats summed in another order
        total = cost(capsys, *lake_source, "--rack", "rack-a", "--basis", basis)["total"]["cost_usd"]
        assert round(from_lake["BilledCost"].sum(), 2) == round(local["BilledCost"].sum(), 2) == total == 467.52


def test_writers_of_a_lake_commit_one_at_a_time(lake):
    """A second writer's transaction waits for the commit lock the first holds (PostgreSQL shows it
    waiting), commits nothing meanwhile, and goes through once the lock is let go."""
    uri, data = lake
    first, second, watch = connect(uri, data), connect(uri, data), connect(uri, data)
    try:
        ensure_schema(first)
        row = "INSERT INTO lake.lake_state VALUES ('rack-b', '1m', '2026-11-29 12:00', now()::TIMESTAMP)"
        done = threading.Event()
        with commit_lock(first):
            writer = threading.Thread(target=lambda: (retry_conflicts(second, lambda: second.execute(row)), done.set()))
            writer.start()
            waiting = (
                "SELECT * FROM postgres_query('lake_commits', "
                "'SELECT count(*) FROM pg_locks WHERE locktype = ''advisory'' AND NOT granted')"
            )
            deadline = time.monotonic() + scaled(30)
            while watch.execute(waiting).fetchall()[0][0] == 0:
                assert time.monotonic() < deadline, "the second writer never waited for the lock"
                time.sleep(0.05)
            assert not done.is_set()
            assert watch.execute("SELECT count(*) FROM lake.lake_state WHERE rack = 'rack-b'").fetchall() == [(0,)]
        writer.join(scaled(30))
        assert done.is_set()
        assert watch.execute("SELECT count(*) FROM lake.lake_state WHERE rack = 'rack-b'").fetchall() == [(1,)]
    finally:
        for c in (first, second, watch):
            c.close()


class FakeConflictOnce(Publisher):
    """FAKE: a publisher whose first commit is refused as DuckLake refuses one that conflicts with
    another writer's (two racks' first steps met so in tests/integration/test_fleet.py, which
    lost rack-a's series; the timing is not reproducible here)."""

    attempts = 0

    def _commit(self, *args):  # type: ignore[no-untyped-def]
        self.attempts += 1
        out = super()._commit(*args)
        if self.attempts == 1:
            raise duckdb.TransactionException("Transaction conflict - (fake) another transaction has deleted from it")
        return out


def test_a_step_whose_commit_conflicts_is_published_whole_on_the_retry(closed_rack, lake):
    db, _ = closed_rack
    uri, data = lake
    con = connect(uri, data)
    try:
        pub = FakeConflictOnce(con, "rack-a", chunk=timedelta(minutes=30))
        with duckdb.connect(str(db), read_only=True) as local:
            steps = pub.catch_up(local)
    finally:
        con.close()
    assert pub.attempts == len(steps) + 1  # the first step was refused once and tried again
    for table in ("series", "increments_1m", "scrapes"):
        assert lake_rows(lake, table) == local_rows(db, table), table


def test_a_process_loads_the_lake_extensions_hundreds_of_times_without_crashing():
    """Each lake connection loads the extensions. When each got its own copy of the postgres
    extension, the process crashed (segmentation fault) at the 199th or 200th: `make test`'s
    lake tests came to that. Run in a child process, so a crash is a failure, not the end of pytest."""
    loop = (
        "import duckdb\n"
        "from warehouse.lake import _load_extensions\n"
        "for _ in range(230):\n"
        "    con = duckdb.connect()\n"
        "    _load_extensions(con)\n"
        "    con.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", loop], cwd=Path(__file__).parents[2], capture_output=True, text=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])


def spec_page(scale: float) -> str:
    """The real spec-decoding decode page with its spec-decode and generated-token counters x scale."""
    text = (FIXTURES / "vllm-0.32.0-cpu-pd-decode-spec.metrics.txt").read_text()

    def scaled(m: re.Match[str]) -> str:
        return f"{m.group(1)} {float(m.group(2)) * scale}"

    return re.sub(
        r"^((?:vllm:spec_decode_\w+_total|vllm:generation_tokens_total)\{[^}]*\}) (\S+)$", scaled, text, flags=re.M
    )


def test_the_lake_answers_the_racks_spec_report_as_the_rack_does(lake, tmp_path, capsys):
    """Spec-decode counters are stored, rolled up and published like every counter: a rack whose
    decode instance drafted 71 x 100 drafts an hour answers `report spec` from the lake as from its
    own file, equal to vLLM's arithmetic on the real capture's counts."""
    db = tmp_path / "spec.duckdb"
    times = [datetime(2026, 11, 29, 10, 0, 5) + timedelta(minutes=30 * k) for k in range(4)]
    times += [datetime(2026, 11, 29, 11, 59, 55), datetime(2026, 11, 29, 12, 0, 5), datetime(2026, 11, 29, 12, 1, 5)]
    for k, at in enumerate(times):
        f = tmp_path / f"decode-{k}.txt"
        f.write_text(spec_page(50.0 * min(k, 4)))  # 0, 50, ..., 200 x the capture, then unchanged
        argv = ["ingest", "--file", str(f), "--target", "decode-0", "--at", at.isoformat(), "--db", str(db)]
        assert main([*argv, "--role", "decode", "--gpus", "4"]) == 0
    publish(db, lake)
    uri, _ = lake
    reports = []
    for source in (["--db", str(db)], ["--lake", uri, "--rack", "rack-a"]):
        capsys.readouterr()
        assert main(["report", "spec", *WINDOW, "--by", "engine", "--json", *source]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    local, from_lake = reports
    assert from_lake["rows"] == local["rows"]
    [row] = local["rows"]
    assert (row["drafts"], row["draft_tokens"], row["accepted_tokens"]) == (71 * 200, 176 * 200, 116 * 200)
    assert row["mean_acceptance_length"] == pytest.approx(1 + 116 / 71, abs=1e-6)
    assert row["position_rates"] == pytest.approx([56 / 71, 33 / 71, 27 / 71], abs=1e-6)
    assert row["rejected_share"] == pytest.approx(60 / (192 + 60), abs=1e-6)
    capsys.readouterr()
    assert main(["report", "spec", *WINDOW, "--lake", uri]) == 2  # the fleet has no one draft path
    assert "--lake needs --rack" in capsys.readouterr().err
