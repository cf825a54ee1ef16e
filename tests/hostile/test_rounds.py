"""Hostile cases of a collector round: a gateway record whose counts no request can hold, or
that finishes in the future, is refused alone; a roll-up that fails costs no round; a round none
of whose targets could be stored is a failed round on /health and the banner."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

import pytest

from collectors.parse import parse_page
from collectors.requests import FeedResult
from collectors.service import Collector
from dashboard.source import collector_warning
from moemeter.contract import TargetInfo
from moemeter.contract.columns import MAX_REQUEST_TOKENS
from moemeter.contract.requests import SCHEMA, RequestRecord
from tests.conftest import reply
from warehouse.api import LocalQuery
from warehouse.cost import user_tokens
from warehouse.db import Warehouse, computed_columns
from warehouse.ingest import ScrapeBatch
from warehouse.rollup import Rollups

DECODE = TargetInfo("decode-0", "http://decode-0/metrics", "decode", 1)
GATEWAY = TargetInfo("gateway", "http://gateway/metrics", "gateway", 0)
HOUR0 = (datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=3)).replace(minute=50, second=0, microsecond=0)


def record(seq: int, at: datetime, **kw: object) -> dict[str, object]:
    r = RequestRecord(
        request_id=f"r{seq}",
        started_at=(at - datetime(1970, 1, 1)).total_seconds(),
        user="alice",
        tenant="acme",
        model="m",
        endpoint="completions",
        stream=False,
        status=200,
        outcome="ok",
        prompt_tokens=100,
        cached_prompt_tokens=0,
        generated_tokens=10,
        e2e_seconds=0.5,
        usage_reported=True,
    )
    return {"seq": seq, **{**r.to_json(), **kw}}


def page(*records: dict[str, object]) -> dict[str, object]:
    return {"schema": SCHEMA, "log_id": "L", "records": list(records)}


def decode_batch(at: datetime, value: float) -> ScrapeBatch:
    text = f"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total {value}\n# TYPE g gauge\ng {value}\n"
    return ScrapeBatch(DECODE, at, True, 0.01, parse_page(text.encode()))


def gateway_batch(at: datetime) -> ScrapeBatch:
    return ScrapeBatch(GATEWAY, at, True, 0.01, parse_page(b"# TYPE up gauge\nup 1\n"))


@pytest.fixture
def collector(tmp_path):
    (tmp_path / "t.json").write_text("[]")
    wh = Warehouse(tmp_path / "w.duckdb")
    yield Collector(wh, tmp_path / "t.json", interval=60.0)
    wh.close()


def test_a_record_with_more_tokens_than_a_request_holds_is_refused_and_rounds_go_on(collector) -> None:
    c, wh = collector, collector.warehouse
    huge = record(2, HOUR0, prompt_tokens=2**62)
    over = record(3, HOUR0, generated_tokens=MAX_REQUEST_TOKENS + 1)
    c.store([gateway_batch(HOUR0)], feeds=[FeedResult(GATEWAY, [page(record(1, HOUR0), huge, over, record(4, HOUR0))])])
    for k in range(1, 16):  # a quarter of an hour, across the hour's end: the hourly roll-up runs
        at = HOUR0 + timedelta(minutes=k)
        c.store([gateway_batch(at), decode_batch(at, 10 * k)])
    assert c.health.ok and c.health.rounds == 16 and c.health.rounds_failed == 0
    assert wh.query_df("SELECT count(*) AS n FROM scrapes WHERE target = 'decode-0'")["n"][0] == 15
    refused = wh.query_df("SELECT reason, count FROM rejected WHERE kind = 'request' ORDER BY reason").values.tolist()
    assert refused == [
        ["generated_tokens is over 2,147,483,647, more than one request can hold: record refused", 1],
        ["prompt_tokens is over 2,147,483,647, more than one request can hold: record refused", 1],
    ]
    hourly = wh.query_df("SELECT sum(requests) AS n, sum(prompt_tokens) AS p FROM requests_1h")
    assert hourly.values.tolist() == [[2, 200]]  # the two plausible records, rolled up
    with wh.cursor() as cur:
        users = user_tokens(LocalQuery(cur), HOUR0 - timedelta(hours=1), HOUR0 + timedelta(hours=1))
    assert int(users["prompt_tokens"].sum()) == 200


def test_a_record_that_finishes_after_the_collectors_clock_is_refused(collector) -> None:
    c, wh = collector, collector.warehouse
    future = record(2, HOUR0 + timedelta(days=40))
    c.store([gateway_batch(HOUR0)], feeds=[FeedResult(GATEWAY, [page(record(1, HOUR0), future)])])
    assert wh.query_df("SELECT request_id FROM requests")["request_id"].tolist() == ["r1"]
    reason = wh.query_df("SELECT reason FROM rejected WHERE kind = 'request'")["reason"][0]
    assert "after the collector's clock: not yet happened" in reason
    assert wh.query_df("SELECT seq FROM request_feeds")["seq"][0] == 2  # read past: not asked for again


def test_a_failing_roll_up_costs_no_round_and_is_said(collector, monkeypatch) -> None:
    c, wh = collector, collector.warehouse
    advance = Rollups.advance
    tries = []

    def broken(self, con, now):  # named fake: a roll-up failing for a reason no input provokes now
        tries.append(now)
        raise RuntimeError("named fake: a roll-up that fails")

    c.store([decode_batch(HOUR0, 0)])
    monkeypatch.setattr(Rollups, "advance", broken)
    for k in range(1, 16):
        c.store([decode_batch(HOUR0 + timedelta(minutes=k), 10 * k)])
    assert wh.query_df("SELECT count(*) AS n FROM scrapes")["n"][0] == 16  # every round stored
    h = c.health.as_json()
    assert not h["ok"] and h["rollups_failing_since"] and "a roll-up that fails" in str(h["rollup_error"])
    assert h["rounds_failed"] == 0 and h["rounds"] == 16
    assert "roll-ups fail since" in (collector_warning(h) or "")
    assert wh.query_df("SELECT count(*) AS n FROM samples_1m")["n"][0] == 0
    assert len(tries) == 4  # rounds 1, 2, 4 and 8 after the first failure, not all 15
    monkeypatch.setattr(Rollups, "advance", advance)
    for k in range(16, 32):  # the next try, whenever it comes, rolls up what was missed
        c.store([decode_batch(HOUR0 + timedelta(minutes=k), 10 * k)])
        if c.health.ok:
            break
    assert c.health.ok and collector_warning(c.health.as_json()) is None
    minutes = wh.query_df("SELECT DISTINCT ts FROM samples_1m ORDER BY ts")["ts"].tolist()
    assert minutes == [HOUR0 + timedelta(minutes=m) for m in range(k)]  # the minutes it missed, rolled up now


def test_a_round_none_of_whose_targets_is_stored_is_a_failed_round(http_server, tmp_path, monkeypatch) -> None:
    """Through the collector's own loop: it scrapes a real target on loopback, every target's input
    breaks the round, and /health and the banner say the rounds fail (they said ok: true)."""
    url, routes = http_server
    routes["/metrics"] = reply(b"# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 1\n")
    (tmp_path / "t.json").write_text(
        json.dumps([{"name": "decode-0", "url": url + "/metrics", "role": "decode", "gpus": 1}])
    )
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, tmp_path / "t.json", interval=0.2)

    def broken(con, *a, **kw):  # named fake: every target's input breaks the round
        raise ValueError("named fake: nothing of this round can be stored")

    monkeypatch.setattr(c, "_write", broken)
    monkeypatch.setattr(c, "_note", broken)

    async def until_two_rounds_failed() -> None:
        stop = asyncio.Event()
        loop = asyncio.create_task(c.run(stop))
        deadline = time.monotonic() + 60
        while c.health.rounds_failed < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await loop

    asyncio.run(until_two_rounds_failed())
    h = c.health.as_json()
    assert h["rounds_failed"] >= 2 and not h["ok"] and "no target's input" in str(h["last_error"]), h
    assert "rounds fail since" in (collector_warning(h) or "")
    assert wh.query_df("SELECT count(*) AS n FROM scrapes")["n"][0] == 0  # nothing stored, and said so
    wh.close()


def test_a_batch_after_the_writers_clock_is_refused_whatever_its_source(tmp_path) -> None:
    import duckdb

    from warehouse.db import apply_migrations
    from warehouse.ingest import Ingestor

    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    apply_migrations(con)
    ing = Ingestor(clock=lambda: HOUR0)
    assert ing.write(con, decode_batch(HOUR0, 1)) == 2
    assert ing.write(con, decode_batch(HOUR0 + timedelta(days=40), 2)) == 0
    assert con.execute("SELECT count(*) FROM scrapes").fetchone() == (1,)
    assert con.execute("SELECT max(through) FROM rollup_state").fetchone()[0] <= HOUR0  # type: ignore[index]
    (reason,) = con.execute("SELECT reason FROM rejected WHERE kind = 'scrape'").fetchone()  # type: ignore[misc]
    assert "after the writer's clock" in reason
    assert ing.write(con, decode_batch(HOUR0 + timedelta(seconds=5), 3)) == 2  # later readings are not "late"


def test_an_offline_ingest_in_the_future_is_refused(tmp_path, capsys) -> None:
    from moemeter.cli import main

    page = tmp_path / "page.txt"
    page.write_text("# TYPE g gauge\ng 1\n")
    at = (datetime.now(UTC) + timedelta(days=40)).strftime("%Y-%m-%dT%H:%M:%S")
    db = tmp_path / "w.duckdb"
    assert main(["ingest", "--file", str(page), "--target", "x", "--at", at, "--db", str(db)]) != 0
    assert "is after this host's clock" in capsys.readouterr().err and not db.exists()


def test_while_the_disk_fails_every_lost_write_is_counted(tmp_path) -> None:
    wh = Warehouse(tmp_path / "w.duckdb")
    errors = [
        OSError("IO Error: No space left on device (named fake: a full disk)"),
        RuntimeError("named fake: a write failing otherwise on the full disk (the next round's message)"),
        RuntimeError("named fake: and again"),
    ]
    for exc in errors:

        def fail(con, exc=exc):  # type: ignore[no-untyped-def]
            raise exc

        with pytest.raises(type(exc)):
            wh.write(fail)
    h = wh.health.as_json()
    assert not h["ok"] and h["problem"] == "disk full" and h["failed_writes"] == 3
    wh.write(lambda con: None)
    assert wh.health.ok and wh.health.failed_writes == 0
    wh.close()


def test_a_warehouse_already_attacked_is_repaired_by_its_migration(tmp_path) -> None:
    """What the attacks left before the guards (named fake: the damage is written by hand, as the
    previous code wrote it): rows and watermarks 40 days ahead, and a record of 2^62 prompt tokens.
    Migration 022 takes them out and counts them; the collector then stores and rolls up again."""
    import duckdb

    (tmp_path / "t.json").write_text("[]")
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, tmp_path / "t.json", interval=60.0)
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    for k in range(10, 0, -1):
        c.store([decode_batch(now - timedelta(minutes=k), 10 * (11 - k))])
    c.store([gateway_batch(now)], feeds=[FeedResult(GATEWAY, [page(record(1, now - timedelta(minutes=1)))])])
    kept = wh.query_df("SELECT count(*) AS n FROM increments")["n"][0]
    future = now + timedelta(days=40)

    def damage(con) -> None:  # type: ignore[no-untyped-def]
        sid = con.execute("SELECT series_id FROM series WHERE metric = 'vllm:generation_tokens_total'").fetchone()[0]
        con.execute("INSERT INTO samples VALUES (?, ?, 1e12)", [future, sid])
        con.execute("INSERT INTO increments VALUES (?, ?, 1e12, 60.0, false)", [future, sid])
        con.execute("INSERT INTO scrapes VALUES (?, 'decode-0', true, 0.0, 1, 0, NULL)", [future])
        con.execute("UPDATE rollup_state SET through = ? WHERE name IN ('1m', '1h')", [future])
        con.execute("UPDATE slo_rules SET since = ?", [future])  # the rules' start, at the newest record
        con.execute(
            f"INSERT INTO requests SELECT * EXCLUDE ({', '.join(computed_columns(con, 'requests'))}) REPLACE "
            "(seq + 1 AS seq, 'huge' AS request_id_text, NULL AS request_id_number, 2^62::BIGINT AS prompt_tokens) "
            "FROM requests"
        )

    wh.close()
    with duckdb.connect(str(tmp_path / "w.duckdb")) as con:
        damage(con)
        con.execute("DELETE FROM schema_migrations WHERE version = 22")
        con.execute("CHECKPOINT")  # the deleted key leaves DuckDB's index before it is inserted again
    wh = Warehouse(tmp_path / "w.duckdb")  # a new moemeter opens the file: its migrations run
    assert wh.query_df("SELECT count(*) AS n FROM schema_migrations WHERE version = 22")["n"][0] == 1
    assert wh.query_df("SELECT max(ts) AS t FROM samples")["t"][0] <= now
    for table, column in (("rollup_state", "through"), ("slo_rules", "since")):
        assert wh.query_df(f"SELECT max({column}) AS t FROM {table}")["t"][0] <= now + timedelta(minutes=5)
    assert wh.query_df("SELECT request_id FROM requests")["request_id"].tolist() == ["r1"]
    removed = wh.query_df("SELECT kind, count FROM rejected WHERE reason LIKE '%migration 022%' ORDER BY kind")
    assert removed.values.tolist() == [["request", 1], ["scrape", 1]]
    assert wh.query_df("SELECT count(*) AS n FROM increments")["n"][0] == kept  # nothing honest lost
    c = Collector(wh, tmp_path / "t.json", interval=60.0)  # the writer on the repaired file
    c.store([decode_batch(datetime.now(UTC).replace(tzinfo=None), 500)])
    assert wh.query_df("SELECT count(*) AS n FROM increments")["n"][0] == kept + 1  # not refused as late
    assert c.health.ok
    wh.close()
