"""Hostile inputs II (issue #46), SLO headers and abandoned requests: a client cannot make its own
attainment, and a stalled upstream cannot hide behind the clients it makes give up.

A request's own targets (the gateway's x-slo-ttft-ms and x-slo-tpot-ms) only tighten its class's,
unless the class says `own_targets = true`; a request the client abandoned (client_disconnect,
before the answer was delivered) after it had waited past a target is held and missed, one that
hung up before any target had passed is the client's choice and not held; a non-streamed
request's time to first token is its end-to-end time, answered or abandoned (docs/definitions.md,
"SLOs").
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest

from tests.hostile.test_tenants import EPOCH, ingest, record, records_as_stored_now
from tests.schema import migrate_through
from tests.stack.gateway.conftest import start_rig
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations, migrations
from warehouse.goodput import slo_report, slo_sums
from warehouse.requests import RequestIngestor
from warehouse.rollup import Rollups
from warehouse.slo import SloSheetError, parse_slo_sheet, store_slo_sheet

SHEET = """
name = "headers"

[[class]]
name = "chat"
effective = "2026-11-01T00:00:00Z"
default = true
ttft_ms = 1000
itl_ms = 20
objective = 0.9

[[class]]
name = "batch"
effective = "2026-11-01T00:00:00Z"
e2e_ms = 60000
objective = 0.8

[[class]]
name = "lab"
effective = "2026-11-01T00:00:00Z"
ttft_ms = 1000
itl_ms = 20
objective = 0.9
own_targets = true  # its requests may set looser targets of their own

[[assign]]
effective = "2026-11-01T00:00:00Z"
tenant = "nightly"
class = "batch"

[[assign]]
effective = "2026-11-01T00:00:00Z"
tenant = "research"
class = "lab"
"""
DAY = datetime(2026, 11, 30)
TENANT = {"chat": "acme", "batch": "nightly", "lab": "research"}


def judged(records: list[dict[str, Any]], sheet: str = SHEET) -> dict[str, dict[str, Any]]:
    """The SLO report's row per class over the day, the records stored at 23:00."""
    con = duckdb.connect()
    apply_migrations(con)
    store_slo_sheet(con, parse_slo_sheet(sheet, "headers.toml"), DAY)
    ingest(con, records, DAY.replace(hour=23))
    report = slo_report(LocalQuery(con), DAY, DAY + timedelta(days=1), pools={"prefill": [], "decode": []})
    return {r["class"]: r for r in report.as_json()["rows"]}


def one(slo_class: str, **kw: Any) -> dict[str, Any]:
    """The report's row of `slo_class` for one request of it, finished at 10:00."""
    tenant = TENANT[slo_class]
    return judged([record(1, tenant, "u", DAY.replace(hour=10), **kw)])[slo_class]


def verdict(row: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    return row["requests"], row["met"], row["failed"], row["missed_ttft"], row["missed_itl"], row["missed_e2e"]


def test_a_header_looser_than_its_class_is_judged_on_the_class_target() -> None:
    # TTFT 3 s: the class's 1 s is missed, whatever the day-long target the request asked for
    assert verdict(one("chat", ttft_seconds=3.0, slo_ttft_seconds=86_400.0)) == (1, 0, 0, 1, 0, 0)
    assert verdict(one("chat", itl_mean_seconds=0.5, slo_itl_seconds=86_400.0)) == (1, 0, 0, 0, 1, 0)
    # a class that allows its requests their own targets: the looser one holds
    assert verdict(one("lab", ttft_seconds=3.0, slo_ttft_seconds=86_400.0)) == (1, 1, 0, 0, 0, 0)


def test_a_header_may_tighten_its_class_or_add_a_target_it_lacks() -> None:
    assert verdict(one("chat", ttft_seconds=0.5, slo_ttft_seconds=0.3)) == (1, 0, 0, 1, 0, 0)
    assert verdict(one("chat", ttft_seconds=0.2, slo_ttft_seconds=0.3)) == (1, 1, 0, 0, 0, 0)
    # batch sets no TTFT target: the request's own holds it to one
    assert verdict(one("batch", ttft_seconds=2.0, slo_ttft_seconds=1.0)) == (1, 0, 0, 1, 0, 0)
    assert verdict(one("batch", ttft_seconds=2.0)) == (1, 1, 0, 0, 0, 0)


def test_a_day_long_header_sent_through_the_gateway_cannot_buy_attainment(tmp_path: Path) -> None:
    """x-slo-ttft-ms: 86400000 on a stream through the gateway, under a class whose TTFT target no
    real first token meets (1 microsecond): missed, as the same stream without the header."""
    strict = SHEET.replace(
        "ttft_ms = 1000\nitl_ms = 20\nobjective = 0.9\n\n", "ttft_ms = 0.001\nobjective = 0.9\n\n", 1
    )
    rig = start_rig(tmp_path)
    body = {"model": "twin-moe", "prompt": "a b c", "max_tokens": 4, "stream": True}
    try:
        for headers in ({}, {"x-slo-ttft-ms": "86400000"}):
            assert httpx.post(rig.url + "/v1/completions", json=body, headers=headers).status_code == 200
        rig.flush()
        page = rig.records.page(0, 10)
    finally:
        rig.loop.close()
    recs = page["records"]
    assert [r["slo_ttft_seconds"] for r in recs] == [None, 86_400.0] and all(r["ttft_seconds"] for r in recs)
    con = duckdb.connect()
    apply_migrations(con)
    store_slo_sheet(con, parse_slo_sheet(strict, "strict.toml"), DAY)
    last = max(EPOCH + timedelta(seconds=r["started_at"] + r["e2e_seconds"]) for r in recs)
    RequestIngestor().write(con, "rig", page, last + timedelta(minutes=1))
    start = last.replace(minute=0, second=0, microsecond=0)
    report = slo_report(LocalQuery(con), start, start + timedelta(hours=2), pools={"prefill": [], "decode": []})
    chat = {r["class"]: r for r in report.as_json()["rows"]}["chat"]
    assert (chat["requests"], chat["met"], chat["missed_ttft"]) == (2, 0, 2)


# ------------------------------------------------------------------------------ abandoned requests
ABANDONED = {"outcome": "client_disconnect", "status": 499}


@pytest.mark.parametrize(
    ("slo_class", "measures", "expected"),
    [
        # (requests held, met, failed, missed TTFT, ITL, e2e)
        ("chat", dict(ttft_seconds=None, e2e_seconds=5.0), (1, 0, 0, 1, 0, 0)),  # waited 5 s, no token
        ("chat", dict(ttft_seconds=None, e2e_seconds=0.4), (0, 0, 0, 0, 0, 0)),  # hung up at once
        ("chat", dict(ttft_seconds=2.5, e2e_seconds=3.0), (1, 0, 0, 1, 0, 0)),  # its first token came late
        ("chat", dict(ttft_seconds=0.3, itl_mean_seconds=0.08, e2e_seconds=4.0), (1, 0, 0, 0, 1, 0)),  # slow stream
        ("chat", dict(ttft_seconds=0.3, itl_mean_seconds=0.01, e2e_seconds=30.0), (0, 0, 0, 0, 0, 0)),  # in time
        ("batch", dict(ttft_seconds=None, e2e_seconds=90.0), (1, 0, 0, 0, 0, 1)),  # past the whole answer's
        ("batch", dict(ttft_seconds=None, e2e_seconds=30.0), (0, 0, 0, 0, 0, 0)),
        ("chat", dict(ttft_seconds=None, e2e_seconds=0.5, slo_ttft_seconds=0.2), (1, 0, 0, 1, 0, 0)),  # its own
    ],
)
def test_an_abandoned_request_counts_once_it_had_missed_a_target(slo_class, measures, expected) -> None:
    row = one(slo_class, **ABANDONED, itl_mean_seconds=measures.pop("itl_mean_seconds", None), **measures)
    assert (row["requests"], *verdict(row)[1:]) == expected
    assert row["attainment"] == (0.0 if expected[0] else None)  # held and missed, or not held at all


def test_a_stalled_upstreams_hang_ups_spend_the_error_budget_in_the_rollups_too() -> None:
    """Clients that give up on a stalled upstream after 5 s each, one that got its answer, one that
    timed out upstream: rolled up by the hour and read from the records alike."""
    at = DAY.replace(hour=10)
    records = [
        record(1, "acme", "u", at + timedelta(minutes=5)),
        *(
            record(n, "acme", "u", at + timedelta(minutes=5 * n), **ABANDONED, ttft_seconds=None, e2e_seconds=5.0)
            for n in range(2, 6)
        ),
        record(6, "acme", "u", at + timedelta(minutes=40), outcome="upstream_timeout", status=504, ttft_seconds=None),
    ]
    con = duckdb.connect()
    apply_migrations(con)
    store_slo_sheet(con, parse_slo_sheet(SHEET, "headers.toml"), DAY)
    ingest(con, records, at + timedelta(minutes=50))
    q = LocalQuery(con)
    none = {"prefill": [], "decode": []}
    edges = slo_report(q, at + timedelta(seconds=1), at + timedelta(minutes=59), pools=none).as_json()["rows"]
    Rollups().advance(con, at + timedelta(hours=2))
    assert con.execute("SELECT sum(held), sum(met) FROM requests_slo_1h").fetchall() == [(6, 1)]
    hour = slo_report(q, at, at + timedelta(hours=1), pools=none).as_json()["rows"]
    for rows in (edges, hour):
        chat = {r["class"]: r for r in rows}["chat"]
        assert (chat["requests"], chat["met"], chat["failed"], chat["missed_ttft"]) == (6, 1, 1, 4)
        assert chat["attainment"] == pytest.approx(1 / 6)


def test_own_targets_must_be_true_or_false() -> None:
    with pytest.raises(SloSheetError, match="line 18 .*own_targets must be true or false, got 'yes'"):
        parse_slo_sheet(SHEET.replace("own_targets = true", 'own_targets = "yes"'), "headers.toml")


# ------------------------------------------------------------------------------- non-streamed requests
NOT_STREAMED = {"stream": False, "ttft_seconds": None, "itl_mean_seconds": None}  # as the gateway records one


@pytest.mark.parametrize(
    ("slo_class", "e2e_seconds", "answered", "abandoned"),
    [
        # (requests held, met, failed, missed TTFT, ITL, e2e): answered after e2e_seconds, and hung up then
        ("chat", 60.0, (1, 0, 0, 1, 0, 0), (1, 0, 0, 1, 0, 0)),  # its first token a minute late either way
        ("chat", 3.0, (1, 0, 0, 1, 0, 0), (1, 0, 0, 1, 0, 0)),
        ("chat", 0.8, (1, 1, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0)),  # within 1 s: met, or the client's choice
        ("batch", 90.0, (1, 0, 0, 0, 0, 1), (1, 0, 0, 0, 0, 1)),  # no TTFT target: the whole answer's
        ("batch", 30.0, (1, 1, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0)),
    ],
)
def test_a_non_streamed_request_is_judged_alike_answered_or_abandoned(
    slo_class, e2e_seconds, answered, abandoned
) -> None:
    """A non-streamed answer's first token reaches the client with the whole answer: a TTFT target
    holds it at its end-to-end time, so finishing slowly misses as hanging up after as long does."""
    assert verdict(one(slo_class, **NOT_STREAMED, e2e_seconds=e2e_seconds)) == answered
    assert verdict(one(slo_class, **NOT_STREAMED, **ABANDONED, e2e_seconds=e2e_seconds)) == abandoned


def test_a_non_streamed_requests_own_ttft_target_holds_its_whole_answer() -> None:
    assert verdict(one("chat", **NOT_STREAMED, e2e_seconds=0.8, slo_ttft_seconds=0.5)) == (1, 0, 0, 1, 0, 0)
    assert verdict(one("batch", **NOT_STREAMED, e2e_seconds=2.0, slo_ttft_seconds=1.0)) == (1, 0, 0, 1, 0, 0)
    assert verdict(one("lab", **NOT_STREAMED, e2e_seconds=60.0, slo_ttft_seconds=86_400.0)) == (1, 1, 0, 0, 0, 0)


def test_non_streamed_requests_stored_before_migration_021_keep_their_verdicts() -> None:
    """Requests rolled up under migration 020's rules (a non-streamed one that finished has no TTFT,
    one abandoned past the target misses it) keep their verdicts after migration 021, read from the
    records and from the hourly sums alike; those that finish after it are held to TTFT either way."""
    con = duckdb.connect()
    migrate_through(con, 20)
    # the per-minute sums in the shape today's roll-up writes (migration 023 makes it again later):
    # this is about the hourly sums and the records
    con.execute(next(text for version, _, text in migrations() if version == 23))
    records_as_stored_now(con)
    store_slo_sheet(con, parse_slo_sheet(SHEET, "headers.toml"), DAY)
    slow, hung_up = dict(NOT_STREAMED, e2e_seconds=60.0), dict(NOT_STREAMED, **ABANDONED, e2e_seconds=3.0)
    h = DAY.replace
    q = LocalQuery(con)

    def held_met_missed(start: datetime, end: datetime) -> dict[datetime, tuple[int, int, int]]:
        """Per hour of [start, end): the requests held, met and that missed TTFT."""
        sums = slo_sums(q, start, end)
        return {ts: (r.held, r.met, r.missed_ttft) for ts, r in sums.set_index("ts").iterrows()}

    def rolled() -> dict[datetime, tuple[int, int, int]]:
        rows = con.execute("SELECT ts, held, met, missed_ttft FROM requests_slo_1h ORDER BY ts").fetchall()
        return {ts: tuple(v) for ts, *v in rows}

    ingest(
        con,
        [
            record(1, "acme", "u", h(hour=10, minute=5), **slow),
            record(2, "acme", "u", h(hour=10, minute=10), **hung_up),
        ],
        h(hour=10, minute=20),
    )
    Rollups().advance(con, h(hour=12))
    assert rolled() == {h(hour=10): (2, 1, 1)}  # the slow answer met, the hang-up at 3 s missed

    assert apply_migrations(con)[0] == "021_non_streamed_ttft.sql"
    assert rolled() == {h(hour=10): (2, 1, 1)}
    assert held_met_missed(h(hour=10, minute=1), h(hour=10, minute=59)) == rolled()  # from the records
    ingest(
        con,
        [
            record(3, "acme", "u", h(hour=12, minute=5), **slow),
            record(4, "acme", "u", h(hour=12, minute=10), **hung_up),
        ],
        h(hour=12, minute=20),
        "after",
    )
    from_records = held_met_missed(h(hour=12, minute=1), h(hour=12, minute=59))
    assert from_records == {h(hour=12): (2, 0, 2)}  # the slow answer missed as the hang-up did
    Rollups().advance(con, h(hour=14))
    assert rolled() == {h(hour=10): (2, 1, 1)} | from_records
    assert held_met_missed(DAY, DAY + timedelta(days=1)) == rolled()
