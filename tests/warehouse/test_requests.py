"""Request records from a gateway's own log into the warehouse: once each, bad ones refused, hourly sums exact."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moemeter.contract.columns import clean_text
from moemeter.contract.requests import RECORD_KEYS, ColumnPage, RequestRecord
from stack.gateway.records import RecordLog
from tests.schema import fresh_schema, migrate_through
from warehouse import requests as requests_module
from warehouse.api import LocalQuery
from warehouse.cost import user_tokens
from warehouse.db import apply_migrations
from warehouse.goodput import slo_sums
from warehouse.read import micros
from warehouse.requests import FeedError, RequestIngestor, roll_requests_1h
from warehouse.rollup import Retention, Rollups
from warehouse.slo import ensure_slo_sheet

T0 = datetime(2026, 11, 30, 12, 0, 0)
EPOCH0 = (T0 - datetime(1970, 1, 1)).total_seconds()


@pytest.fixture
def con():
    c = duckdb.connect()
    apply_migrations(c)
    return c


def rec(i: int, user: str = "alice", **kw: object) -> RequestRecord:
    base = dict(
        request_id=f"r{i}",
        started_at=EPOCH0 + i,
        user=user,
        tenant="acme",
        model="m",
        endpoint="completions",
        stream=True,
        status=200,
        outcome="ok",
        prompt_tokens=100 + i,
        cached_prompt_tokens=64,
        generated_tokens=10,
        ttft_seconds=0.2,
        itl_mean_seconds=0.01,
        itl_max_seconds=0.02,
        decode_tokens_per_second=100.0,
        e2e_seconds=0.5,
        usage_reported=True,
    )
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def real_log(tmp_path: Path, records: list[RequestRecord]) -> RecordLog:
    """The gateway's own log of these records, kept whatever their age: they start at T0, and a
    log keeping a week would drop them from a week after it."""
    log = RecordLog(tmp_path / "gw.sqlite", keep_seconds=math.inf, batch_seconds=0.0)
    for r in records:
        log.append(r)
    log.close()
    return RecordLog(tmp_path / "gw.sqlite", keep_seconds=math.inf)


def test_pages_are_stored_once_with_their_cursor(con, tmp_path: Path) -> None:
    log = real_log(tmp_path, [rec(i) for i in range(7)])
    ing = RequestIngestor()
    first = log.page(0, 4)
    assert ing.write(con, "gw", first, T0) == 4
    assert ing.write(con, "gw", first, T0) == 0  # read twice: stored once
    assert ing.write(con, "gw", log.page(first["next"], 100), T0) == 3
    # a restarted collector starts from the stored cursor
    fresh = RequestIngestor()
    assert fresh.cursor(con, "gw").seq == 7
    rows = con.execute(
        "SELECT request_id, user_id, prompt_tokens, cached_prompt_tokens, finished_at FROM requests ORDER BY seq"
    ).fetchall()
    assert [r[0] for r in rows] == [f"r{i}" for i in range(7)]
    assert rows[2][1:] == ("alice", 102, 64, T0 + timedelta(seconds=2.5))
    log.close()


def test_a_new_log_is_read_from_its_start_and_a_gap_is_counted(con) -> None:
    ing = RequestIngestor()
    page = {
        "schema": "moemeter.requests/1",
        "log_id": "A",
        "oldest": 1,
        "next": 2,
        "more": False,
        "records": [{"seq": 1, **rec(1).to_json()}, {"seq": 2, **rec(2).to_json()}],
    }
    ing.write(con, "gw", page, T0)
    ing.write(con, "gw", {**page, "log_id": "B", "records": [{"seq": 1, **rec(3).to_json()}]}, T0)
    ing.write(con, "gw", {**page, "log_id": "B", "oldest": 5, "records": [{"seq": 5, **rec(4).to_json()}]}, T0)
    assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 4
    assert con.execute("SELECT log_id, seq, records, lost FROM request_feeds").fetchall() == [("B", 5, 4, 3)]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"prompt_tokens": -1}, "prompt_tokens"),
        ({"user": None}, "user must be a string"),
        ({"e2e_seconds": float("nan")}, "e2e_seconds"),
        ({"cached_prompt_tokens": 10**6}, "cached_prompt_tokens"),
        ({"status": "200"}, "status"),
        ({"user": "x" * 5000}, "over 1024 characters long"),
        ({"slo_ttft_seconds": "fast"}, "slo_ttft_seconds"),
        ({"e2e_seconds": 10**400}, "e2e_seconds"),  # past a double: math.isfinite raised OverflowError
        ({"ttft_seconds": 1e10}, "ttft_seconds is over 9,223,372,037 seconds"),  # nanoseconds past a BIGINT
        ({"itl_mean_seconds": 9.3e9}, "itl_mean_seconds is over 9,223,372,037 seconds"),
    ],
)
def test_a_malformed_record_is_refused_and_the_rest_kept(con, caplog: pytest.LogCaptureFixture, change, why) -> None:
    good, bad = rec(1).to_json(), {**rec(2).to_json(), **change}
    page = {
        "schema": "moemeter.requests/1",
        "log_id": "A",
        "records": [{"seq": 1, **good}, {"seq": 2, **bad}, {"seq": 3, **rec(3).to_json()}],
    }
    assert RequestIngestor().write(con, "gw", page, T0) == 2
    assert why in caplog.text and "record 2 refused" in caplog.text
    assert con.execute("SELECT seq, rejected FROM request_feeds").fetchall() == [(3, 1)]
    assert con.execute("SELECT seq, request_id FROM requests ORDER BY seq").fetchall() == [(1, "r1"), (3, "r3")]


def test_durations_are_stored_in_whole_units_and_read_back_in_seconds(con) -> None:
    """Microseconds, and nanoseconds for the mean ITL, the nearest (halves up); the start and the
    decode speed are the finish less e2e and 1 / the mean ITL (migration 024)."""
    odd = rec(1, ttft_seconds=0.1234564, itl_mean_seconds=0.0012345675, itl_max_seconds=2.0000005, e2e_seconds=1.5)
    page = {"schema": "moemeter.requests/1", "log_id": "A", "records": [{"seq": 1, **odd.to_json()}]}
    RequestIngestor().write(con, "gw", page, T0 + timedelta(hours=1))
    stored = con.execute("SELECT ttft_us, itl_mean_ns, itl_max_us, e2e_us FROM requests").fetchall()
    assert stored == [(123_456, 1_234_568, 2_000_001, 1_500_000)]
    read = con.execute(
        "SELECT ttft_seconds, itl_mean_seconds, itl_max_seconds, e2e_seconds, decode_tokens_per_second, "
        "finished_at, started_at FROM requests"
    ).fetchall()
    start = T0 + timedelta(seconds=1)
    assert read == [(0.123456, 0.001234568, 2.000001, 1.5, 1e9 / 1_234_568, start + timedelta(seconds=1.5), start)]


@pytest.mark.parametrize(
    ("ttft", "itl", "generated"),
    [(0.2, 0.01, 10), (None, None, 10), (0.2, 0.01, 0), (9.2e9, 9.2e9, 2**31 - 1), (0.0, 9.2e9, 2), (9.2e9, None, 1)],
)
def test_e2e_reads_back_whatever_the_ttft_and_decode_time(con, ttft, itl, generated) -> None:
    """Stored as its remainder after the TTFT and the decode time (migration 025), e2e and the start
    read back to the microsecond, the decode time past any BIGINT too."""
    r = rec(
        1, ttft_seconds=ttft, itl_mean_seconds=itl, itl_max_seconds=itl, generated_tokens=generated, e2e_seconds=2.5
    )
    page = {"schema": "moemeter.requests/1", "log_id": "A", "records": [{"seq": 1, **r.to_json()}]}
    assert RequestIngestor().write(con, "gw", page, T0 + timedelta(hours=1)) == 1
    got = con.execute("SELECT e2e_us, e2e_seconds, finished_at - started_at FROM requests").fetchall()
    assert got == [(2_500_000, 2.5, timedelta(seconds=2.5))]
    if itl is None:  # no decode time: what is left is e2e less the TTFT
        [(rest,)] = con.execute("SELECT e2e_rest_us FROM requests").fetchall()
        assert rest == 2_500_000 - round((ttft or 0) * 1e6)


def test_a_session_that_attaches_the_warehouse_reads_e2e_and_the_start(tmp_path) -> None:
    """The computed columns name no function of the warehouse's own (a macro would be looked up in
    the reading session's catalog, not the file's)."""
    db = tmp_path / "rack.duckdb"
    with duckdb.connect(str(db)) as c:
        apply_migrations(c)
        page = {"schema": "moemeter.requests/1", "log_id": "A", "records": [{"seq": 1, **rec(1).to_json()}]}
        RequestIngestor().write(c, "gw", page, T0 + timedelta(hours=1))
    reader = duckdb.connect()
    reader.execute(f"ATTACH '{db}' AS rack (READ_ONLY)")
    got = reader.execute("SELECT e2e_us, e2e_seconds, started_at FROM rack.requests").fetchall()
    assert got == [(500_000, 0.5, T0 + timedelta(seconds=1))]
    assert reader.execute("SELECT e2e_seconds FROM rack.request_records").fetchall() == [(0.5,)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.text(max_size=12)
        | st.tuples(st.text(max_size=4), st.integers(0, 10**25)).map(lambda p: f"{p[0]}{p[1]}")
        | st.tuples(st.text(max_size=4), st.integers(1, 99)).map(lambda p: f"{p[0]}0{p[1]}"),
        min_size=1,
        max_size=4,
    )
)
def test_a_request_id_reads_back_as_given_whatever_number_it_ends_in(ids: list[str]) -> None:
    """Stored as its text and the number it ends in (migration 024), each id reads back as it came,
    one that is not valid UTF-8 with U+FFFD in place; a number too long for a BIGINT or with a
    leading zero stays in the text."""
    records = [{"seq": i, **rec(i, request_id=r).to_json()} for i, r in enumerate(ids, 1)]
    with fresh_schema() as c:
        RequestIngestor().write(c, "gw", {"schema": "moemeter.requests/1", "log_id": "A", "records": records}, T0)
        read = [r for (r,) in c.execute("SELECT request_id FROM requests ORDER BY seq").fetchall()]
    assert read == [clean_text(r) for r in ids]


def nearest(seconds: float, units: float) -> float:
    """Seconds to the nearest of `units` a second, halves up."""
    return math.floor(seconds * units + 0.5) / units


def test_records_stored_before_migration_024_keep_every_column_a_report_reads() -> None:
    """Records stored as doubles of seconds (migration 006) become whole units: every column reads
    back as before, rounded to its unit, and one of more units than a BIGINT holds (which the feed
    now refuses) as 9e18 of them. Their per-user tokens and SLO verdicts are the same."""
    con = duckdb.connect()
    migrate_through(con, 23)
    ensure_slo_sheet(con, T0)
    rows = []
    for i in range(1, 41):
        ttft: float | None = 0.25 + i / 7
        itl: float | None = 0.01 + i / 7e5
        e2e = 0.5 + i / 3
        if i == 40:
            ttft = 1e300  # as a feed before 024 stored it
        elif i == 39:
            ttft = itl = None  # not measured
        start = T0 + timedelta(seconds=7 * i + i / 9)
        rows.append(
            ("gw", i, f"r{i}", start, start + timedelta(seconds=e2e), T0 + timedelta(minutes=5), f"u{i % 3}", "acme",
             "m", "completions", True, 200, "ok", 100 + i, 64, 10, ttft, itl, itl and 2 * itl, itl and 1 / itl, e2e,
             True, None,
             0.02 if i % 2 else None)
        )  # fmt: skip
    con.executemany(f"INSERT INTO requests VALUES ({', '.join('?' * 24)})", rows)
    q, end = LocalQuery(con), T0 + timedelta(minutes=10)
    before = (slo_sums(q, T0, end), user_tokens(q, T0, end))
    kept = "gateway, seq, request_id, user_id, finished_at, prompt_tokens, cached_prompt_tokens, slo_itl_seconds"
    measured = "ttft_seconds, itl_mean_seconds, itl_max_seconds, e2e_seconds"
    read = f"SELECT {kept}, {measured}, decode_tokens_per_second, started_at FROM requests ORDER BY seq"
    old = con.execute(read).fetchall()

    assert apply_migrations(con) == ["024_compact_request_records.sql", "025_e2e_as_its_remainder.sql"]
    new = con.execute(read).fetchall()
    assert [r[:8] for r in new] == [r[:8] for r in old]  # every other column as it was
    for o, n in zip(old, new, strict=True):
        ttft, itl, itl_max, e2e = o[8:12]
        if ttft is None:
            assert n[8:13] == (None, None, None, nearest(e2e, 1e6), None)
            continue
        assert n[8:12] == (nearest(ttft, 1e6) if ttft < 1e12 else 9e12, nearest(itl, 1e9), nearest(itl_max, 1e6),
                           nearest(e2e, 1e6))  # fmt: skip
        assert n[12] == 1e9 / round(n[9] * 1e9)  # decode tokens/s
        assert n[13] == o[4] - timedelta(microseconds=round(n[11] * 1e6))  # the start: the finish less e2e
    pd.testing.assert_frame_equal(slo_sums(q, T0, end), before[0])
    pd.testing.assert_frame_equal(user_tokens(q, T0, end), before[1])


def test_records_stored_before_migration_025_read_the_same_e2e_and_start() -> None:
    """Migration 025 stores e2e as its remainder after the TTFT and the decode time: every column,
    e2e and the start included, reads back identical, for records whose durations are as large as
    024 kept (a TTFT of 9e18 us), whose counts would overflow the decode time, or that were not
    measured; per-user tokens and SLO sums are the same."""
    con = duckdb.connect()
    migrate_through(con, 24)
    ensure_slo_sheet(con, T0)
    big = 2**63 - 1
    cases = [  # (ttft_us, itl_mean_ns, generated_tokens, e2e_us)
        *(
            (250_000 + 7 * i, 11_000_000 + i, 1 + i * 37, 250_000 + 7 * i + (11_000_000 + i) * i * 37 // 1000 + i % 3)
            for i in range(30)
        ),  # e2e: the TTFT, the decode time and a tail of 0-2 us
        (None, None, 10, 1_500_000),  # not measured
        (None, 12_345_678, 0, 9),  # nothing generated: no decode time
        (9 * 10**18, 10_000_000, 10, 3_000_000),  # a TTFT 024 kept as 9e18 units
        (100, 9 * 10**18, big, 5_000_000),  # a decode time past any BIGINT
        (100, big, 2, 7_000_000),
        (0, 0, 5, 0),
    ]
    rows = []
    for i, (ttft, itl, generated, e2e) in enumerate(cases, 1):
        end = T0 + timedelta(seconds=11 * i, microseconds=i, hours=i > 30)  # counts past any sum: an hour on
        rows.append(("gw", i, "r", i, end, T0 + timedelta(minutes=5), f"u{i % 3}", "acme", "m", "completions",
                     True, 200, "ok", 100 + i, 64, generated, ttft, itl, itl and 2 * itl // 1000, e2e, True,
                     None, 0.02 if i % 2 else None))  # fmt: skip
    con.executemany(f"INSERT INTO requests BY POSITION VALUES ({', '.join('?' * 23)})", rows)
    q, end = LocalQuery(con), T0 + timedelta(minutes=10)
    before = (slo_sums(q, T0, end), user_tokens(q, T0, end))
    columns = [c for (c, *_) in con.execute("DESCRIBE requests").fetchall()]
    read = f"SELECT {', '.join(columns)} FROM requests ORDER BY seq"
    old = con.execute(read).fetchall()
    assert [r[columns.index("e2e_us")] for r in old] == [c[3] for c in cases]

    assert apply_migrations(con) == ["025_e2e_as_its_remainder.sql"]
    assert con.execute(read).fetchall() == old
    rest = [r for (r,) in con.execute("SELECT e2e_rest_us FROM requests ORDER BY seq").fetchall()]
    assert rest[:30] == [i % 3 - ((11_000_000 + i) * i * 37 % 1000 >= 500) for i in range(30)]
    assert rest[30:32] == [1_500_000, 9]  # no mean ITL: the whole e2e less the TTFT (none)
    pd.testing.assert_frame_equal(slo_sums(q, T0, end), before[0])
    pd.testing.assert_frame_equal(user_tokens(q, T0, end), before[1])


def test_per_request_targets_are_stored_and_older_records_have_none(con) -> None:
    old = rec(1).to_json()
    del old["slo_ttft_seconds"], old["slo_itl_seconds"]  # a gateway from before per-request targets
    page = {
        "schema": "moemeter.requests/1",
        "log_id": "A",
        "records": [{"seq": 1, **old}, {"seq": 2, **rec(2, slo_ttft_seconds=0.25, slo_itl_seconds=0.0125).to_json()}],
    }
    assert RequestIngestor().write(con, "gw", page, T0) == 2
    assert con.execute("SELECT seq, slo_ttft_seconds, slo_itl_seconds FROM requests ORDER BY seq").fetchall() == [
        (1, None, None),
        (2, 0.25, 0.0125),
    ]


def test_pages_that_are_not_feeds_are_refused(con) -> None:
    ing = RequestIngestor()
    with pytest.raises(FeedError, match="not a moemeter.requests/1"):
        ing.write(con, "gw", {"records": []}, T0)
    with pytest.raises(FeedError, match="go back"):
        ing.write(
            con,
            "gw",
            {
                "schema": "moemeter.requests/1",
                "log_id": "A",
                "records": [{"seq": 5, **rec(1).to_json()}, {"seq": 4, **rec(2).to_json()}],
            },
            T0,
        )


def test_hourly_sums_are_exact_and_late_records_are_added(con) -> None:
    ing = RequestIngestor()
    recs = [rec(i, user=f"u{i % 2}", started_at=EPOCH0 + 3500 + 20 * i) for i in range(10)]  # straddle 13:00
    recs[3].outcome, recs[3].itl_mean_seconds = "upstream_dropped", None

    def page(rs, s0):
        return {
            "schema": "moemeter.requests/1",
            "log_id": "A",
            "records": [{"seq": s0 + k, **r.to_json()} for k, r in enumerate(rs)],
        }

    ing.write(con, "gw", page(recs[:6], 1), T0 + timedelta(minutes=59))
    roll_requests_1h(con, T0, T0 + timedelta(hours=1))
    ing.write(con, "gw", page(recs[6:], 7), T0 + timedelta(minutes=70))  # ingested in the next hour
    roll_requests_1h(con, T0 + timedelta(hours=1), T0 + timedelta(hours=2))
    raw = con.execute("""SELECT time_bucket(INTERVAL 1 HOUR, finished_at) h, user_id, count(*), sum(prompt_tokens),
                                sum(generated_tokens), count(*) FILTER (WHERE outcome <> 'ok'), count(itl_mean_seconds)
                         FROM requests GROUP BY ALL ORDER BY ALL""").fetchall()
    rolled = con.execute("""SELECT ts, user_id, requests, prompt_tokens, generated_tokens, errors, timed
                            FROM requests_1h ORDER BY ALL""").fetchall()
    assert rolled == raw and len(rolled) == 4


def test_retention_drops_raw_requests_only_once_rolled(con) -> None:
    ing = RequestIngestor()
    ing.write(
        con, "gw", {"schema": "moemeter.requests/1", "log_id": "A", "records": [{"seq": 1, **rec(1).to_json()}]}, T0
    )
    rollups = Rollups(Retention(raw_days=1, minute_days=1, hour_days=10))
    con.execute("INSERT INTO samples VALUES (?, 1, 1.0)", [T0])  # rollups start at the oldest sample
    rollups.advance(con, T0 + timedelta(days=3))
    assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 0
    assert con.execute("SELECT sum(requests), sum(prompt_tokens) FROM requests_1h").fetchall() == [(1, 101)]


ODD_VALUES = st.sampled_from(
    [
        0,
        1,
        2**53 + 1,
        10**400,
        -1,
        0.5,
        1e-7,
        2.5e-6,
        9.3e9,  # a duration over 2^63 nanoseconds
        1733000000.0000005,
        float("nan"),
        float("inf"),
        True,
        None,
        "7",
        "\ud800",
        "é",
    ]
)
FIELDS = ["seq", *rec(0).to_json()]


@st.composite
def feed_pages(draw) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """Records as a gateway writes them, some with a field set to something odd or left out."""
    records = []
    for i in range(1, draw(st.integers(0, 6)) + 1):
        r = {
            "seq": i,
            **rec(i, started_at=EPOCH0 + draw(st.floats(0, 1e4)), e2e_seconds=draw(st.floats(0, 100))).to_json(),
        }
        if draw(st.booleans()):
            r[draw(st.sampled_from(FIELDS))] = draw(ODD_VALUES | st.text(max_size=3))
        if draw(st.integers(0, 4)) == 0:
            del r[draw(st.sampled_from(FIELDS))]  # a record without one of its fields
        records.append(r)
    return records


def stored(records: list[dict[str, object]], plain: bool, in_columns: bool = False) -> object:
    """What writing one page of these records leaves: the requests, the cursor and the refusals.
    `in_columns`: the page made in process, its records as columns (a record without a field has
    None there)."""
    with fresh_schema() as c:
        return _stored(c, records, plain, in_columns)


def _stored(c: duckdb.DuckDBPyConnection, records: list[dict[str, object]], plain: bool, in_columns: bool) -> object:
    page: dict[str, object] = {"schema": "moemeter.requests/1", "log_id": "A", "records": records}
    if in_columns:
        page = ColumnPage(page, fields={k: [r.get(k) for r in records] for k in RECORD_KEYS})
        del page["records"]
    with pytest.MonkeyPatch.context() as m:
        if not plain:
            m.setattr(requests_module, "_plain_columns", lambda *a: None)  # record by record
        try:
            RequestIngestor().write(c, "gw", page, T0)
        except FeedError as exc:
            return str(exc)
    return [c.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("requests", "request_feeds", "rejected")]


@settings(max_examples=200, deadline=None)
@given(feed_pages())
def test_a_page_read_column_by_column_stores_what_reading_it_record_by_record_stores(records) -> None:
    by_record = stored(records, plain=False)
    assert stored(records, plain=True) == by_record
    # a page made in this process, given as columns: the same, whichever way it is read
    assert stored(records, plain=True, in_columns=True) == by_record
    assert stored(records, plain=False, in_columns=True) == by_record


def test_columns_are_read_only_from_a_page_made_in_this_process() -> None:
    """A page from the network is JSON: plain dicts. Its "fields" are not read, whatever they hold."""
    good = [{"seq": 1, **rec(1).to_json()}]
    fields = {k: [r.get(k) for r in good] for k in RECORD_KEYS}
    c = duckdb.connect()
    apply_migrations(c)
    page = {"schema": "moemeter.requests/1", "log_id": "A", "records": [], "fields": fields}
    assert RequestIngestor().write(c, "gw", page, T0) == 0
    with pytest.raises(FeedError, match="not a moemeter.requests/1 feed page"):
        RequestIngestor().write(c, "gw", {k: v for k, v in page.items() if k != "records"}, T0)
    assert c.execute("SELECT count(*) FROM requests").fetchone() == (0,)


def test_a_gateways_page_is_read_column_by_column() -> None:
    records = [{"seq": i, **rec(i, started_at=EPOCH0 + i / 3).to_json()} for i in range(1, 50)]
    fields = requests_module._fields(records)
    columns = requests_module._plain_columns(fields, 0, T0 + timedelta(hours=1))
    assert columns is not None and list(columns["seq"]) == list(range(1, 50))
    assert (
        requests_module._plain_columns(fields, 1, T0 + timedelta(hours=1)) is None
    )  # a record stored already: one by one


@settings(max_examples=2000, deadline=None)
@given(st.floats(0, requests_module.LATEST_SECOND - 1) | st.integers(0, 10**10).map(lambda i: i / 1e6))
def test_times_read_column_by_column_round_as_python_reads_a_timestamp(seconds: float) -> None:
    python = datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)
    assert requests_module._micros(np.array([seconds]))[0] == micros(python)
