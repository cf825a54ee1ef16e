"""SLO attainment, goodput, burn rates and error budget, checked against numbers computed by hand.

Sheet: class `chat` (default; TTFT 1 s, ITL 20 ms, objective 0.9 over 1 day; own_targets: a
request's own targets may loosen it), class `batch` (e2e 60 s, objective 0.8 over 1 day); tenant
acme is in batch, its user alice in chat. Window 12:30 .. 14:30 on 2026-11-30 (two edges and one
whole hour). Requests, by finishing time:

  n  who            at     measures                                       verdict
  9  bob   (other)  12:20  ok                                             before the window
  1  bob   (other)  12:40  TTFT 0.5, ITL 10 ms; 100 + 10 tokens           met
 11  carol (acme)   13:05  e2e 30 s, TTFT 5 (batch sets none); 1000 + 100  met (batch)
  2  bob            13:10  TTFT 1.5                                       missed TTFT only
  3  alice (acme)   13:20  ITL 30 ms                                      missed ITL only (held to chat)
  4  alice          13:30  ok; 200 + 20 tokens                            met
  5  bob            13:40  TTFT 0.5 > its own target x-slo-ttft-ms 300    missed (per-request target)
  6  bob            13:50  TTFT 1.5 <= its own target 2000; 100 + 10       met (per-request target)
  7  bob            14:10  upstream_5xx                                   held, failed
  8  bob            14:20  client went away                               not held
 12  carol          14:25  e2e 90 s                                       missed e2e (batch)
 10  bob            14:40                                                 after the window

chat:  held 7 (1-7), met 3 (1, 4, 6): attainment 3/7; failed 1, missed TTFT 2, ITL 1
       goodput 3 / 7200 s; good tokens 110 + 220 + 110 = 440
batch: held 2, met 1: attainment 0.5, missed e2e 1; good tokens 1100
burn (missed share / (1 - objective)), windows ending 14:30:
  5m  [14:25, 14:30): chat none held -> None; batch 1/1 / 0.2 = 5
  30m [14:00, 14:30): chat 7 (8 not held): 1/1 / 0.1 = 10; batch 5
  1h  [13:30, 14:30): chat 4, 5, 6, 7: 2/4 / 0.1 = 5; batch 5
  6h  [08:30, 14:30): chat 9, 1..7: 4/8 / 0.1 = 5; batch 11, 12: 1/2 / 0.2 = 2.5
budget over the day before 14:30 (as 6h): chat 1 - 4 / (0.1 x 8) = -4; batch 1 - 1 / (0.2 x 2) = -1.5
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from datetime import datetime, timedelta

import duckdb
import pandas as pd
import pytest

from moemeter.cli import main
from moemeter.contract.requests import RequestRecord
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.goodput import slo_report, slo_sums_ending, slo_window
from warehouse.read import run
from warehouse.requests import RequestIngestor, roll_requests_1h, roll_requests_slo_1m
from warehouse.slo import SloSheetError, parse_slo_sheet, store_slo_sheet

SHEET = """
name = "test"

[[class]]
name = "chat"
effective = "2026-11-01T00:00:00Z"
default = true
ttft_ms = 1000
itl_ms = 20
objective = 0.9
period_days = 1
own_targets = true

[[class]]
name = "batch"
effective = "2026-11-01T00:00:00Z"
e2e_ms = 60000
objective = 0.8
period_days = 1

[[assign]]
effective = "2026-11-01T00:00:00Z"
tenant = "acme"
class = "batch"

[[assign]]
effective = "2026-11-01T00:00:00Z"
user = "alice"
tenant = "acme"
class = "chat"
"""
DAY = datetime(2026, 11, 30)
START, END = DAY.replace(hour=12, minute=30), DAY.replace(hour=14, minute=30)
EPOCH = datetime(1970, 1, 1)


def at(hh_mm: str) -> datetime:
    h, m = hh_mm.split(":")
    return DAY.replace(hour=int(h), minute=int(m))


def record(n: int, user: str, finished: str, e2e: float = 2.0, **kw: object) -> dict[str, object]:
    tenant = "acme" if user in ("alice", "carol") else "other"
    base = dict(
        request_id=f"r{n}",
        started_at=(at(finished) - EPOCH).total_seconds() - e2e,
        user=user,
        tenant=tenant,
        model="m",
        endpoint="completions",
        stream=True,
        status=200,
        outcome="ok",
        prompt_tokens=100,
        cached_prompt_tokens=0,
        generated_tokens=10,
        ttft_seconds=0.5,
        itl_mean_seconds=0.01,
        e2e_seconds=e2e,
    )
    base.update(kw)
    return asdict(RequestRecord(**base))  # type: ignore[arg-type]


RECORDS = [
    record(9, "bob", "12:20"),
    record(1, "bob", "12:40"),
    record(11, "carol", "13:05", e2e=30.0, ttft_seconds=5.0, prompt_tokens=1000, generated_tokens=100),
    record(2, "bob", "13:10", ttft_seconds=1.5),
    record(3, "alice", "13:20", itl_mean_seconds=0.03),
    record(4, "alice", "13:30", prompt_tokens=200, generated_tokens=20),
    record(5, "bob", "13:40", slo_ttft_seconds=0.3),
    record(6, "bob", "13:50", ttft_seconds=1.5, slo_ttft_seconds=2.0),
    record(7, "bob", "14:10", status=502, outcome="upstream_5xx", ttft_seconds=None, itl_mean_seconds=None),
    record(8, "bob", "14:20", status=499, outcome="client_disconnect"),
    record(12, "carol", "14:25", e2e=90.0),
    record(10, "bob", "14:40"),
]


def warehouse(
    records: list[dict[str, object]] = RECORDS, path: str = ":memory:", sheet: str | None = SHEET
) -> duckdb.DuckDBPyConnection:
    """The records above behind the sheet above (None: the default sheet, stored with the records)."""
    con = duckdb.connect(path)
    apply_migrations(con)
    if sheet is not None:
        store_slo_sheet(con, parse_slo_sheet(sheet, "test.toml"), DAY)
    page = {
        "schema": "moemeter.requests/1",
        "log_id": "gw",
        "records": [r | {"seq": i + 1} for i, r in enumerate(records)],
    }
    RequestIngestor().write(con, "gw", page, DAY.replace(hour=15))
    return con


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    return warehouse()


def rows(con: duckdb.DuckDBPyConnection, start: datetime = START, end: datetime = END, by: str = "class") -> dict:
    report = slo_report(LocalQuery(con), start, end, pools={"prefill": [], "decode": []}, by=by)
    return {(r["class"], r["tenant"]) if by == "tenant" else r["class"]: r for r in report.as_json()["rows"]}


def test_attainment_goodput_and_misses_by_hand(con) -> None:
    r = rows(con)
    chat, batch = r["chat"], r["batch"]
    assert (chat["requests"], chat["met"], chat["failed"]) == (7, 3, 1)
    assert (chat["missed_ttft"], chat["missed_itl"], chat["missed_e2e"]) == (2, 1, 0)
    assert chat["attainment"] == pytest.approx(3 / 7)
    assert chat["goodput_rps"] == pytest.approx(3 / 7200)
    assert (chat["good_tokens"], chat["goodput_tps"]) == (440, pytest.approx(440 / 7200))
    assert (batch["requests"], batch["met"], batch["missed_e2e"], batch["attainment"]) == (2, 1, 1, 0.5)
    assert batch["good_tokens"] == 1100
    assert (chat["objective"], batch["objective"]) == (0.9, 0.8)


def test_burn_rates_and_budget_by_hand(con) -> None:
    r = rows(con)
    chat, batch = r["chat"], r["batch"]
    assert chat["burn_5m"] is None  # nothing held to chat in the last 5 minutes: no rate, not 0
    assert (chat["burn_30m"], chat["burn_1h"], chat["burn_6h"]) == (
        pytest.approx(10),
        pytest.approx(5),
        pytest.approx(5),
    )
    assert [batch[f"burn_{w}"] for w in ("5m", "30m", "1h", "6h")] == pytest.approx([5, 5, 5, 2.5])
    assert chat["budget_left"] == pytest.approx(-4)
    assert batch["budget_left"] == pytest.approx(-1.5)
    assert chat["burning"] == ""  # 5 < 14.4 (fast) and 10 > 6 over 30m but 5 < 6 over 6h (slow)


def test_per_tenant_rows_add_up_to_the_class(con) -> None:
    r = rows(con, by="tenant")
    assert set(r) == {("chat", "other"), ("chat", "acme"), ("batch", "acme")}
    assert (r["chat", "other"]["requests"], r["chat", "other"]["met"]) == (5, 2)  # 1, 2, 5, 6, 7 (8 not held)
    assert (r["chat", "acme"]["requests"], r["chat", "acme"]["met"]) == (2, 1)  # alice, held to chat by her own entry
    assert r["chat", "acme"]["burn_1h"] == pytest.approx(0.0)  # alice 13:30 met


def test_an_empty_window_is_null_never_zero_or_nan(con) -> None:
    later = rows(con, DAY.replace(hour=16), DAY.replace(hour=17))
    assert set(later) == {"chat", "batch"}  # every class in effect, with no request
    for row in later.values():
        assert row["requests"] == 0 and row["met"] == 0
        for k in ("attainment", "goodput_rps", "goodput_tps", "usd_per_mtok_good", "burn_5m", "burn_30m", "burn_1h"):
            assert row[k] is None, k
    assert later["batch"]["budget_left"] == pytest.approx(-1.5)  # the budget is the period's: the same day
    assert later["batch"]["burn_6h"] == pytest.approx(2.5)  # 11:00 .. 17:00 holds 11 and 12
    two_days_on = rows(con, DAY + timedelta(days=2), DAY + timedelta(days=2, hours=1))
    assert all(v is None for row in two_days_on.values() for k, v in row.items() if k in ("budget_left", "burn_6h"))


def test_the_hourly_sums_give_the_same_report_once_the_records_are_gone(con) -> None:
    whole = (DAY.replace(hour=13), DAY.replace(hour=14))
    before = rows(con, *whole)
    roll_requests_1h(con, DAY, DAY.replace(hour=16))
    con.execute(  # the roll-up's watermark: records stored before it are in the hourly sums
        "INSERT INTO rollup_state VALUES ('1h', ?) ON CONFLICT (name) DO UPDATE SET through = excluded.through",
        [DAY.replace(hour=16)],
    )
    assert rows(con, *whole) == before  # rolled up, not counted twice
    con.execute("DELETE FROM requests")  # retention: only the hourly sums are left
    after = rows(con, *whole)
    short = ("burn_5m", "burn_30m")  # windows within an hour need the records
    assert {c: {k: v for k, v in r.items() if k not in short} for c, r in after.items()} == {
        c: {k: v for k, v in r.items() if k not in short} for c, r in before.items()
    }
    assert before["chat"]["burn_30m"] is not None and after["chat"]["burn_30m"] is None
    assert (after["chat"]["requests"], after["chat"]["met"]) == (5, 2)  # 2, 3, 4, 5, 6 finished 13:00 .. 14:00


def rolled(con: duckdb.DuckDBPyConnection, until: datetime) -> None:
    """The writer's roll-ups of the records stored before `until`: hours and minutes, with their watermarks."""
    roll_requests_1h(con, DAY, until)
    roll_requests_slo_1m(con, DAY, until)
    for name in ("1h", "requests_slo_1m"):
        con.execute(
            "INSERT INTO rollup_state VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET through = excluded.through",
            [name, until],
        )


def test_the_minute_sums_serve_the_partial_hours_to_the_second(con) -> None:
    """Burn windows and edges within an hour come from the per-minute sums once the records are
    rolled up, and the seconds at a window's edges from the records: the same report either way."""
    half = timedelta(seconds=30)
    seconds = (at("12:40") + half, at("14:25") + half)
    by_minute = (START, END)  # whole minutes around a whole hour
    before = {w: (rows(con, *w), rows(con, *w, by="tenant")) for w in (seconds, by_minute)}
    chat, batch = before[seconds][0]["chat"], before[seconds][0]["batch"]
    # 1 finished at 12:40:00, before the window; 12 at 14:25:00, in its last half minute
    assert (chat["requests"], chat["met"], batch["requests"], batch["met"]) == (6, 2, 2, 1)
    rolled(con, DAY.replace(hour=16))
    assert {w: (rows(con, *w), rows(con, *w, by="tenant")) for w in before} == before  # not counted twice
    con.execute("DELETE FROM requests")  # retention: the sums are left
    assert rows(con, *by_minute) == before[by_minute][0]  # every burn window included
    lost = rows(con, *seconds)["batch"]  # 12's half minute was read from its record
    assert (lost["requests"], lost["met"], lost["burn_5m"]) == (1, 1, None)


def test_records_stored_after_the_minute_roll_up_are_read_once(con) -> None:
    rolled(con, DAY.replace(hour=16))
    late = record(13, "bob", "13:45", ttft_seconds=1.5)  # stored later, into a rolled-up minute
    page = {"schema": "moemeter.requests/1", "log_id": "gw", "records": [late | {"seq": len(RECORDS) + 1}]}
    RequestIngestor().write(con, "gw", page, DAY.replace(hour=17))
    # stored after both roll-ups: the window's hour 13 and the 1 h burn window's minutes add its record
    chat = rows(con, START + timedelta(seconds=30), END)["chat"]
    assert (chat["requests"], chat["met"]) == (8, 3)
    assert chat["burn_1h"] == pytest.approx(3 / 5 / 0.1)  # 4, 5, 6, 7 and 13: 5, 13 and 7 missed


def test_windows_read_together_give_each_windows_own_read(con) -> None:
    """slo_sums_ending reads up to eight windows that end together in one statement, each record
    judged once: each window's sums are what requests_slo.sql (the hourly roll-up's statement) gives
    for that window alone, before the roll-ups, after them, with a gateway's new log numbering its
    records from 1 again, with a record stored late, and with the records gone; more windows than one
    read takes are read in turns, duplicates once."""
    q = LocalQuery(con)
    ends = (END, at("14:25") + timedelta(seconds=30))
    gaps = [timedelta(minutes=m, seconds=s) for m, s in ((0, 20), (5, 0), (30, 0), (60, 0), (91, 7), (360, 0))]
    gaps += [timedelta(days=1), timedelta(hours=2, seconds=45), timedelta(minutes=125), timedelta(days=1)]

    asked: list[str] = []

    def counted(sql: str, params: dict | None = None) -> pd.DataFrame:
        asked.append(sql)
        return q(sql, params)

    def same() -> None:
        for end in ends:
            starts = [end - g for g in gaps]
            asked.clear()
            together = slo_sums_ending(counted, starts, end)
            assert len(asked) == 2 and len(together) == len(starts)  # nine distinct windows: eight, then one
            for start, got in zip(starts, together, strict=True):
                alone = run(q, "requests_slo", slo_window(start, end))
                pd.testing.assert_frame_equal(got, alone)

    same()
    assert int(slo_sums_ending(q, [START], END)[0]["requests"].sum()) == 10  # 1-8, 11 and 12: not all empty
    # the gateway starts a new log, numbered from 1 again: its seq 2 is 1's too, and both count
    again = record(14, "bob", "14:27")
    RequestIngestor().write(
        con,
        "gw",
        {"schema": "moemeter.requests/1", "log_id": "gw-2", "records": [again | {"seq": 2}]},
        DAY.replace(hour=15),
    )
    assert con.execute("SELECT count(*) FROM requests WHERE gateway = 'gw' AND seq = 2").fetchone() == (2,)
    same()
    assert int(slo_sums_ending(q, [START], END)[0]["requests"].sum()) == 11
    rolled(con, DAY.replace(hour=14))
    same()
    late = record(13, "bob", "13:45", ttft_seconds=1.5)
    page = {"schema": "moemeter.requests/1", "log_id": "gw", "records": [late | {"seq": len(RECORDS) + 1}]}
    RequestIngestor().write(con, "gw", page, DAY.replace(hour=17))
    same()
    rolled(con, DAY.replace(hour=18))
    con.execute("DELETE FROM requests WHERE finished_at < ?", [at("14:00")])
    same()


def test_entries_that_would_change_stored_attainment_are_refused(con) -> None:
    stored = con.execute("SELECT * FROM slo_classes ORDER BY ALL").fetchall()
    earlier = SHEET.replace(
        'name = "batch"\neffective = "2026-11-01T00:00:00Z"', 'name = "batch"\neffective = "2026-11-30T14:00:00Z"'
    )
    with pytest.raises(SloSheetError, match="would change the attainment of requests already stored"):
        store_slo_sheet(con, parse_slo_sheet(earlier, "late.toml"), DAY.replace(hour=16))
    assert con.execute("SELECT * FROM slo_classes ORDER BY ALL").fetchall() == stored
    later = earlier.replace("2026-11-30T14:00:00Z", "2026-11-30T15:00:00Z")
    assert store_slo_sheet(con, parse_slo_sheet(later, "later.toml"), DAY.replace(hour=16)) == 1


def test_the_default_sheet_is_stored_with_the_first_records() -> None:
    con = duckdb.connect()
    apply_migrations(con)
    page = {"schema": "moemeter.requests/1", "log_id": "gw", "records": [RECORDS[1] | {"seq": 1}]}
    RequestIngestor().write(con, "gw", page, DAY.replace(hour=15))
    assert con.execute("SELECT class, is_default FROM slo_classes ORDER BY class").fetchall() == [
        ("batch", False),
        ("interactive", True),
    ]
    r = rows(con)
    assert (r["interactive"]["requests"], r["interactive"]["met"]) == (1, 1)


def test_report_slo_cli_json_csv_and_errors(tmp_path, capsys) -> None:
    db = tmp_path / "w.duckdb"
    con = duckdb.connect(str(db))
    apply_migrations(con)
    store_slo_sheet(con, parse_slo_sheet(SHEET, "test.toml"), DAY)
    page = {
        "schema": "moemeter.requests/1",
        "log_id": "gw",
        "records": [r | {"seq": i + 1} for i, r in enumerate(RECORDS)],
    }
    RequestIngestor().write(con, "gw", page, DAY.replace(hour=15))
    con.close()
    args = ["report", "slo", "--from", "2026-11-30T12:30:00Z", "--to", "2026-11-30T14:30:00Z", "--db", str(db)]
    assert main([*args, "--csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("class,tenant,requests,met,attainment,objective,")
    assert [line.split(",")[:4] for line in lines[1:]] == [["batch", "", "2", "1"], ["chat", "", "7", "3"]]
    assert main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"usd_per_mtok_good": null' in out and "NaN" not in out
    assert main(args) == 0
    assert "chat" in capsys.readouterr().out
    assert (
        main(["report", "slo", "--from", "2026-11-30T14:30:00Z", "--to", "2026-11-30T12:30:00Z", "--db", str(db)]) == 2
    )
    assert "must end after it starts" in capsys.readouterr().err


def test_usd_per_good_mtok_by_hand(rack, tmp_path, capsys) -> None:
    """The cost test's rack (prefill $155.84, decode $311.68 over 10:00 .. 12:00; alice 300 prompt of
    which 100 cached + 50 generated, bob 100 + 150, both met), and two more requests: dave (held to
    batch) 200 + 100, met; erin 100 + 100, TTFT 3 s over the default class's 2.5 s, missed.
    Allocated by tokens (computed prompt 200 + 100 + 200 + 100 = 600, generated 400):
      interactive 155.84 x 400/600 + 311.68 x 300/400 = 337.653333, good tokens 350 + 250 = 600
        -> $562,755.56 / M good tokens
      batch 155.84 x 200/600 + 311.68 x 100/400 = 129.866667, good 300 -> $432,888.89
      rack $467.52 over 900 good tokens -> $519,466.67"""
    src, targets = rack
    db = tmp_path / "w.duckdb"
    shutil.copy(src, db)
    con = duckdb.connect(str(db))
    # dave's assignment as a sheet loaded before any record would have stored it
    con.execute(
        "INSERT INTO slo_assignments VALUES ('2026-11-01', 'user', 'acme', 'dave', 'batch', 'test', '2026-11-01')"
    )
    t = (datetime(2026, 11, 29, 11, 0) - EPOCH).total_seconds()
    more = [
        asdict(
            RequestRecord("r4", t, "dave", "acme", "m", "completions", False, 200, "ok", 200, 0, 100, e2e_seconds=10.0)
        ),
        asdict(
            RequestRecord(
                "r5",
                t,
                "erin",
                "acme",
                "m",
                "completions",
                True,
                200,
                "ok",
                100,
                0,
                100,
                ttft_seconds=3.0,
                e2e_seconds=4.0,
            )
        ),
    ]
    feed = {"schema": "moemeter.requests/1", "log_id": "B", "records": [r | {"seq": i + 1} for i, r in enumerate(more)]}
    RequestIngestor().write(con, "gateway-2", feed, datetime(2026, 11, 29, 12, 0))
    con.close()
    args = ["report", "slo", "--from", "2026-11-29T10:00:00Z", "--to", "2026-11-29T12:00:00Z", "--db", str(db)]
    assert main([*args, "--targets", str(targets), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by = {r["class"]: r for r in out["rows"]}
    assert (by["interactive"]["requests"], by["interactive"]["met"], by["interactive"]["missed_ttft"]) == (3, 2, 1)
    assert by["interactive"]["cost_usd"] == pytest.approx(337.653333, abs=1e-4)
    assert by["interactive"]["usd_per_mtok_good"] == pytest.approx(562755.56, abs=0.01)
    assert (by["batch"]["requests"], by["batch"]["met"]) == (1, 1)
    assert by["batch"]["usd_per_mtok_good"] == pytest.approx(432888.89, abs=0.01)
    assert (out["cost_usd"], out["good_tokens"]) == (467.52, 900)
    assert out["usd_per_mtok_good"] == pytest.approx(519466.67, abs=0.01)
    assert main(args + ["--json"]) == 0  # no targets file: the pools the warehouse saw, the same figures
    assert json.loads(capsys.readouterr().out)["usd_per_mtok_good"] == pytest.approx(519466.67, abs=0.01)
