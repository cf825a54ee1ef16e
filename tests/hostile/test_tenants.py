"""Hostile inputs II (issue #46), users and tenants: a user is named within its tenant, so no tenant
bills another, and no user of one tenant takes another tenant's user's SLO class.

Requests go through the metering gateway (a keys file with tenants acme and globex, keyless requests
allowed), its feed into the cost test's rack (tests/warehouse/conftest.py: prefill $155.84 and
decode $311.68 over 10:00 .. 12:00 on 2026-11-29), and `report cost` reads them back. The attack:
globex's key with `"user": "acme"`, the name of acme's default user (a keyed request without a
user is its tenant's user of the tenant's name).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pandas as pd
import pytest

from moemeter.cli import main
from moemeter.contract.requests import RequestRecord
from stack.gateway.keys import Keys, KeysError, hash_key, load_keys
from tests.postgres import running_postgres
from tests.stack.gateway.conftest import start_rig
from tests.warehouse import conftest as cost_rack
from warehouse.api import LocalQuery
from warehouse.cost import user_tokens
from warehouse.db import apply_migrations, migrations
from warehouse.goodput import slo_sums
from warehouse.lake import open_reader
from warehouse.read import request_window
from warehouse.requests import RequestIngestor
from warehouse.rollup import Rollups
from warehouse.slo import parse_slo_sheet, slo_params, store_slo_sheet
from warehouse.sql import INCLUDES, text

EPOCH = datetime(1970, 1, 1)
WINDOW = ("2026-11-29T10:00:00Z", "2026-11-29T12:00:00Z")
rack = cost_rack.rack  # the cost test's rack, its fixture
KEYS = Keys(tenants={hash_key("sk-acme-0123456789"): "acme", hash_key("sk-globex-0123456789"): "globex"})
ACME = {"Authorization": "Bearer sk-acme-0123456789"}
GLOBEX = {"Authorization": "Bearer sk-globex-0123456789"}
ACMES_OWN = (ACME, {"model": "twin-moe", "prompt": "acme " * 20, "max_tokens": 8})
GLOBEX_AS_ACME = (GLOBEX, {"model": "twin-moe", "prompt": "globex " * 60, "max_tokens": 40, "user": "acme"})
GLOBEX_AS_ITSELF = (GLOBEX, {"model": "twin-moe", "prompt": "globex " * 60, "max_tokens": 40})
KEYLESS_AS_ACME = ({}, {"model": "twin-moe", "prompt": "nokey " * 30, "max_tokens": 16, "user": "acme"})


def through_the_gateway(tmp: Path, sends: list[tuple[dict[str, str], dict[str, Any]]]) -> list[dict[str, Any]]:
    """The gateway's records of these requests, in order."""
    tmp.mkdir(parents=True, exist_ok=True)
    rig = start_rig(tmp, keys=KEYS)
    try:
        for headers, body in sends:
            assert httpx.post(rig.url + "/v1/completions", json=body, headers=headers).status_code == 200
        rig.flush()
        return list(rig.records.page(0, 100)["records"])
    finally:
        rig.loop.close()


def with_records(rack: tuple[Path, Path], tmp: Path, records: list[dict[str, Any]]) -> Path:
    """A copy of the rack with these records added (finishing inside its window, a minute apart from
    10:20), stored when the rack's own were."""
    db = tmp / "w.duckdb"
    shutil.copy(rack[0], db)
    start = (datetime(2026, 11, 29, 10, 20) - EPOCH).total_seconds()
    page = {
        "schema": "moemeter.requests/1",
        "log_id": "hostile",
        "records": [r | {"seq": i + 1, "started_at": start + 60 * i} for i, r in enumerate(records)],
    }
    with duckdb.connect(str(db)) as con:
        RequestIngestor().write(con, "gateway-hostile", page, cost_rack.TIMES[-1])
    return db


def lines_of(report: dict[str, Any]) -> dict[tuple[str, str], dict]:
    """A cost report's user lines by (tenant, user)."""
    return {(u["tenant"], u["user"]): u for u in report["users"]}


def priced(rack: tuple[Path, Path], tmp: Path, records: list[dict[str, Any]]) -> dict[tuple[str, str], dict]:
    """Each (tenant, user) line of `report cost` over the rack's window, with these records added."""
    return lines_of(report(with_records(rack, tmp, records), rack[1], "--json"))


def report(db: Path | None, targets: Path | None, *form: str) -> Any:
    """`moemeter report cost` over the rack's window, of a file (db, targets) or of a lake (in
    `form`): parsed with --json, else as printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        args = ["report", "cost", "--from", WINDOW[0], "--to", WINDOW[1]]
        if db is not None and targets is not None:
            args += ["--db", str(db), "--targets", str(targets)]
        assert main([*args, *form]) == 0
    return json.loads(out.getvalue()) if "--json" in form else out.getvalue()


def test_a_keyed_tenant_names_only_its_own_users(tmp_path: Path) -> None:
    recs = through_the_gateway(tmp_path, [ACMES_OWN, GLOBEX_AS_ACME, KEYLESS_AS_ACME])
    assert [(r["tenant"], r["user"]) for r in recs] == [("acme", "acme"), ("globex", "acme"), ("anonymous", "acme")]


def test_globex_naming_acmes_user_is_billed_to_globex(rack, tmp_path: Path) -> None:
    """acme's cost line is the same whether globex sends its requests as "acme" or as itself, and
    holds acme's tokens alone; globex's tokens and cost are on globex's line either way."""
    attack = through_the_gateway(tmp_path / "attack", [ACMES_OWN, GLOBEX_AS_ACME, KEYLESS_AS_ACME])
    honest = through_the_gateway(tmp_path / "honest", [ACMES_OWN, GLOBEX_AS_ITSELF, KEYLESS_AS_ACME])
    acme_rec, globex_rec = attack[0], attack[1]
    assert globex_rec["generated_tokens"] > acme_rec["generated_tokens"] > 0  # the attack is worth making
    attacked = priced(rack, tmp_path / "attack", attack)
    control = priced(rack, tmp_path / "honest", honest)

    acme = attacked[("acme", "acme")]
    assert acme == control[("acme", "acme")]  # tokens and dollars alike
    assert (acme["requests"], acme["prompt_tokens"], acme["generated_tokens"]) == (
        1,
        acme_rec["prompt_tokens"],
        acme_rec["generated_tokens"],
    )
    globex_line = attacked[("globex", "acme")]
    assert globex_line == {**control[("globex", "globex")], "user": "acme"}  # globex pays what it would as itself
    assert (globex_line["prompt_tokens"], globex_line["generated_tokens"]) == (
        globex_rec["prompt_tokens"],
        globex_rec["generated_tokens"],
    )
    assert attacked[("anonymous", "acme")]["generated_tokens"] == attack[2]["generated_tokens"]
    assert ("acme", "acme") in attacked and ("acme", "alice") in attacked  # the rack's own users are there

    text = report(tmp_path / "attack" / "w.duckdb", rack[1])
    assert re.search(r"^  acme of acme +\$", text, re.M) and re.search(r"^  acme of globex +\$", text, re.M)
    rows = [line.split(",") for line in report(tmp_path / "attack" / "w.duckdb", rack[1], "--csv").splitlines()]
    assert rows[0][-1] == "tenant" and {(r[-1], r[1]) for r in rows if r[0] == "user"} >= {
        ("acme", "acme"),
        ("globex", "acme"),
        ("anonymous", "acme"),
    }


def scrape(db: Path, name: str, role: str, gpus: int, capture: str, values: dict[str, float], at: datetime) -> None:
    """One more page of an instance of the rack, its counters set (tests/warehouse/conftest.py)."""
    f = db.parent / f"{name}-{at:%H%M%S}.txt"
    f.write_text(cost_rack.page(capture, values))
    argv = ["ingest", "--file", str(f), "--target", name, "--at", at.isoformat(), "--db", str(db)]
    assert main([*argv, "--role", role, "--gpus", str(gpus)]) == 0


@pytest.mark.integration  # starts PostgreSQL
def test_the_lake_keeps_each_tenants_users_apart(rack, tmp_path: Path) -> None:
    """The attacked rack, its hours closed by two more scrapes, published: a lake reader's cost
    lines are the rack's own, globex's "acme" apart from acme's; its SLO assignments name tenants."""
    db = with_records(rack, tmp_path, through_the_gateway(tmp_path, [ACMES_OWN, GLOBEX_AS_ACME, KEYLESS_AS_ACME]))
    for at in (datetime(2026, 11, 29, 12, 0, 5), datetime(2026, 11, 29, 12, 1, 5)):
        pf = {"vllm:prompt_tokens_total": 1_500_000, "vllm:prompt_tokens_by_source_total|local_cache_hit": 300_000}
        scrape(db, "prefill-0", "prefill", 2, "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt", pf, at)
        dc = {"vllm:generation_tokens_total": 1_000_000}
        scrape(db, "decode-0", "decode", 4, "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt", dc, at)
    sheet = tmp_path / "tenants.toml"
    sheet.write_text(SHEET.replace("2026-11-01T00:00:00Z", "2026-11-30T00:00:00Z"))  # after the stored requests
    assert main(["slo", "load", str(sheet), "--db", str(db)]) == 0
    with running_postgres() as database:
        uri = database("lake_tenants")
        argv = ["publish", "--db", str(db), "--lake", uri, "--lake-data", str(tmp_path / "lake-files")]
        assert main([*argv, "--rack", "rack-a"]) == 0
        from_lake = lines_of(report(None, None, "--lake", uri, "--rack", "rack-a", "--json"))
        with open_reader(uri, "rack-a", str(tmp_path / "lake-files")) as con:
            assigned = con.execute("SELECT kind, tenant, name, class FROM slo_assignments ORDER BY ALL").fetchall()
    assert from_lake == lines_of(report(db, rack[1], "--json"))
    assert {("acme", "acme"), ("globex", "acme"), ("anonymous", "acme")} <= set(from_lake)
    assert assigned == [("user", "acme", "alice", "premium"), ("user", "anonymous", "bob", "premium")]


def test_no_key_can_be_the_keyless_tenant(tmp_path: Path) -> None:
    p = tmp_path / "keys.json"
    p.write_text(json.dumps({"keys": [{"sha256": hash_key("sk-x"), "tenant": "anonymous"}]}))
    with pytest.raises(KeysError, match="'anonymous' is the tenant of requests without a key"):
        load_keys(p)


# ------------------------------------------------------------------------------- SLO assignments
SHEET = """
name = "tenants"

[[class]]
name = "chat"
effective = "2026-11-01T00:00:00Z"
default = true
ttft_ms = 1000
objective = 0.9

[[class]]
name = "premium"
effective = "2026-11-01T00:00:00Z"
ttft_ms = 500
objective = 0.99

[[assign]]
effective = "2026-11-01T00:00:00Z"
user = "alice"
tenant = "acme"
class = "premium"

[[assign]]
effective = "2026-11-01T00:00:00Z"
user = "bob"          # a sheet from before tenants: the user bob of the requests without a key
class = "premium"
"""
DAY = datetime(2026, 11, 30)


def record(n: int, tenant: str, user: str, finished: datetime, **kw: Any) -> dict[str, Any]:
    e2e = kw.pop("e2e_seconds", 2.0)
    base: dict[str, Any] = dict(
        request_id=f"r{n}",
        started_at=(finished - EPOCH).total_seconds() - e2e,
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
        ttft_seconds=0.3,
        itl_mean_seconds=0.01,
        e2e_seconds=e2e,
    )
    return asdict(RequestRecord(**(base | kw)))


def ingest(con: duckdb.DuckDBPyConnection, records: list[dict[str, Any]], at: datetime, log_id: str = "gw") -> None:
    page = {
        "schema": "moemeter.requests/1",
        "log_id": log_id,
        "records": [r | {"seq": i + 1} for i, r in enumerate(records)],
    }
    RequestIngestor().write(con, "gw-" + log_id, page, at)


def classes_of(con: duckdb.DuckDBPyConnection, start: datetime, end: datetime) -> dict[tuple[str, str], int]:
    """(class, tenant): requests, as the SLO report counts them."""
    sums = slo_sums(LocalQuery(con), start, end)
    return {(c, t): int(n) for (c, t), n in sums.groupby(["class", "tenant"])["requests"].sum().items()}


def test_a_users_slo_class_is_assigned_within_its_tenant() -> None:
    sheet = parse_slo_sheet(SHEET, "tenants.toml")
    bare = [a for a in sheet.assignments if a.name == "bob"]
    assert [(a.kind, a.tenant) for a in bare] == [("user", "anonymous")]
    assert sheet.class_of("alice", "globex", DAY).name == "chat"  # type: ignore[union-attr]
    assert sheet.class_of("alice", "acme", DAY).name == "premium"  # type: ignore[union-attr]
    con = duckdb.connect()
    apply_migrations(con)
    store_slo_sheet(con, sheet, DAY)
    at = DAY.replace(hour=10)
    ingest(
        con,
        [
            record(1, "acme", "alice", at),
            record(2, "globex", "alice", at),  # globex's own user alice, not acme's
            record(3, "anonymous", "bob", at),
            record(4, "globex", "bob", at),
        ],
        DAY.replace(hour=11),
    )
    assert classes_of(con, DAY, DAY + timedelta(days=1)) == {
        ("premium", "acme"): 1,
        ("premium", "anonymous"): 1,
        ("chat", "globex"): 2,
    }


# ----------------------------------------------------------------------- migration 020, numbers kept
PREVIOUS = Path(__file__).parent / "schema_019"
"""The statements migration 020 changed, as they were before it (warehouse/sql at dddc0ae): what the
previous schema's warehouse rolled up and reported with."""


def previous_sql(name: str) -> str:
    """warehouse/sql/<name>.sql with its includes, as the previous schema's warehouse ran it."""

    def read(n: str) -> str:
        return (PREVIOUS / f"{n}.sql").read_text() if (PREVIOUS / f"{n}.sql").exists() else text(n)

    out = read(name)
    while True:
        expanded = out
        for include in INCLUDES:
            expanded = expanded.replace(f"/*{include}*/", read(include))
        if expanded == out:
            return out
        out = expanded


def previous_schema() -> duckdb.DuckDBPyConnection:
    """An in-memory warehouse at migration 019, as the previous schema's warehouse made it, but for
    its records' table (records_as_stored_now)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
    for version, name, statements in migrations():
        if version < 20:
            con.execute(statements)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, now()::TIMESTAMP)", [version, name])
    records_as_stored_now(con)
    return con


RECORD_LAYOUTS = (24, 25)
"""The migrations that laid out the request records' table as today's feed writes it."""


def records_as_stored_now(con: duckdb.DuckDBPyConnection) -> None:
    """Give a warehouse of a previous schema the request records' table today's feed writes
    (RECORD_LAYOUTS, not recorded: they run again, as on a file the previous schema wrote, and keep
    every record)."""
    for version, _, statements in migrations():
        if version in RECORD_LAYOUTS:
            con.execute(statements)


OLD_SHEET = """
name = "before-tenants"

[[class]]
name = "chat"
effective = "2026-11-01T00:00:00Z"
default = true
ttft_ms = 1000
itl_ms = 20
objective = 0.9

[[class]]
name = "premium"
effective = "2026-11-01T00:00:00Z"
ttft_ms = 500
objective = 0.99

[[assign]]
effective = "2026-11-01T00:00:00Z"
user = "alice"
class = "premium"

[[assign]]
effective = "2026-11-01T00:00:00Z"
tenant = "initech"
class = "premium"
"""


def store_old_sheet(con: duckdb.DuckDBPyConnection, at: datetime) -> None:
    """OLD_SHEET as `moemeter slo load` stored it before migration 020 (a user by name alone)."""
    sheet = parse_slo_sheet(OLD_SHEET, "before-tenants.toml")
    for c in sheet.classes:
        values = [c.ttft_seconds, c.itl_seconds, c.e2e_seconds, c.objective, c.period_days, c.default]
        con.execute(
            "INSERT INTO slo_classes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [c.effective, c.name, *values, sheet.name, c.source, at],
        )
    for a in sheet.assignments:
        con.execute(
            "INSERT INTO slo_assignments VALUES (?, ?, ?, ?, ?, ?)",
            [a.effective, a.kind, a.name, a.slo_class, sheet.name, at],
        )


def at(hh_mm: str) -> datetime:
    h, m = hh_mm.split(":")
    return DAY.replace(hour=int(h), minute=int(m))


BEFORE = [  # finished 10:05 .. 12:50 on 2026-11-30; rolled up through 12:00, the 12:xx ones not
    record(1, "acme", "alice", at("10:05"), ttft_seconds=0.4),  # premium, met
    record(2, "globex", "alice", at("10:20"), ttft_seconds=0.6),  # premium by name alone: missed
    record(3, "anonymous", "alice", at("10:35")),
    record(4, "globex", "bob", at("10:50"), ttft_seconds=3.0, slo_ttft_seconds=5.0),  # its own looser target: met
    record(
        5, "acme", "carol", at("11:05"), outcome="client_disconnect", status=499, ttft_seconds=None, e2e_seconds=9.0
    ),
    record(6, "acme", "acme", at("11:20"), prompt_tokens=300, generated_tokens=30),
    record(7, "globex", "acme", at("11:35"), prompt_tokens=700, generated_tokens=70),  # billed with acme's before
    record(8, "initech", "dave", at("11:50"), ttft_seconds=0.7),
    record(9, "globex", "alice", at("12:10"), itl_mean_seconds=0.05),
    record(10, "acme", "acme", at("12:25"), outcome="upstream_5xx", status=502, ttft_seconds=None),
    record(11, "anonymous", "erin", at("12:40"), outcome="client_disconnect", status=499, ttft_seconds=None),
]
WINDOWS = [(at("10:10"), at("12:45")), (at("10:00"), at("13:00")), (at("11:30"), at("12:20"))]


def test_migration_020_keeps_every_number_of_a_warehouse_built_by_the_previous_schema(monkeypatch) -> None:
    con = previous_schema()
    store_old_sheet(con, DAY)
    ingest(con, BEFORE[:8], at("11:59"))
    with monkeypatch.context() as m:  # the previous schema's roll-ups
        m.setattr("warehouse.requests.sql", previous_sql)
        Rollups().advance(con, at("12:00"))
    ingest(con, BEFORE[8:], at("12:55"), "late")
    stored = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ROLLED}

    def previous(name: str, start: datetime, end: datetime) -> pd.DataFrame:
        params = {"start": start, "end": end, **request_window(start, end), **slo_params(start, end)}
        statement = previous_sql(name)
        return con.execute(statement, {k: v for k, v in params.items() if f"${k}" in statement}).df()

    before = {w: (previous("cost_users", *w), previous("requests_slo", *w)) for w in WINDOWS}
    day = before[WINDOWS[1]][1].groupby(["class", "tenant"])[["requests", "held", "met"]].sum()
    assert {k: tuple(v) for k, v in day.iterrows()} == {  # as the previous rules judged them
        ("chat", "acme"): (3, 2, 1),  # carol hung up after 9 s without a token: not held
        ("chat", "anonymous"): (1, 0, 0),
        ("chat", "globex"): (2, 2, 2),  # bob's TTFT 3 s met its own looser 5 s target
        ("premium", "acme"): (1, 1, 1),
        ("premium", "anonymous"): (1, 1, 1),
        ("premium", "globex"): (2, 2, 1),  # globex's alice held to acme's alice's class by her name
        ("premium", "initech"): (1, 1, 0),
    }
    assert apply_migrations(con) == [
        "020_users_within_tenants.sql",
        "021_non_streamed_ttft.sql",
        "022_undo_the_future.sql",
        "023_slo_minutes_by_tenant.sql",
        "024_compact_request_records.sql",
        "025_e2e_as_its_remainder.sql",
    ]
    kept = {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ROLLED}
    assert kept == {**stored, "requests_slo_1m": []}  # 023 dropped the minutes: they had no tenant
    Rollups().advance(con, at("12:00"))  # and the roll-up adds every record it had taken to them again
    assert con.execute(MINUTES).fetchall() == stored["requests_slo_1m"]
    q = LocalQuery(con)
    for w, (old_users, old_slo) in before.items():
        new_users = user_tokens(q, *w)
        # every user line the same, a line of two tenants' users of one name split between them
        merged = new_users.drop(columns="tenant").groupby("user", as_index=False).sum()
        assert merged.to_dict("records") == old_users.to_dict("records"), w
        if w == WINDOWS[1]:  # the whole day: acme's and globex's acme, and three tenants' alice
            assert (len(old_users), len(new_users)) == (6, 9)
        new_slo = slo_sums(q, *w)
        pd.testing.assert_frame_equal(new_slo, old_slo, check_dtype=False, obj=str(w))
    assert con.execute(
        "SELECT tenant, name, class FROM slo_assignments WHERE kind = 'user' ORDER BY tenant, effective"
    ).fetchall() == [
        ("acme", "alice", "premium"),
        ("acme", "alice", None),  # from the new rules on the entry names anonymous's alice only
        ("anonymous", "alice", "premium"),
        ("globex", "alice", "premium"),
        ("globex", "alice", None),
    ]


ROLLED = ("requests", "requests_1h", "requests_itl_1h", "requests_slo_1h", "requests_slo_1m")
MINUTES = "SELECT ts, class, sum(held), sum(met) FROM requests_slo_1m GROUP BY ALL ORDER BY ALL"  # as before 023


def test_migration_020_stores_its_entries_loaded_at_in_utc_whatever_the_sessions_time_zone() -> None:
    """Every stored time is naive UTC: the entries migration 020 adds say when they were loaded in
    UTC, on a session whose TimeZone is 14 hours ahead of it too."""
    con = previous_schema()
    store_old_sheet(con, DAY)
    ingest(con, BEFORE[:2], at("11:59"))  # acme's and globex's alice: each gets an entry from 020
    con.execute("SET TimeZone = 'Pacific/Kiritimati'")  # UTC+14
    before = datetime.now(UTC).replace(tzinfo=None)
    apply_migrations(con)
    after = datetime.now(UTC).replace(tzinfo=None)
    loaded = con.execute("SELECT loaded_at FROM slo_assignments WHERE sheet = 'migration 020'").fetchall()
    assert len(loaded) == 2 and all(before <= t <= after for (t,) in loaded)


def test_after_migration_020_the_new_rules_judge_new_requests_and_old_sheets_load(tmp_path, monkeypatch) -> None:
    con = previous_schema()
    store_old_sheet(con, DAY)
    ingest(con, BEFORE[:8], at("11:59"))
    apply_migrations(con)
    ingest(
        con,
        [
            record(21, "acme", "alice", at("13:05"), ttft_seconds=0.4),
            record(22, "globex", "alice", at("13:10"), ttft_seconds=0.4),
            record(23, "anonymous", "alice", at("13:15"), ttft_seconds=0.4),
            record(24, "umbrella", "alice", at("13:20"), ttft_seconds=0.4),  # a tenant first seen now
            record(25, "initech", "alice", at("13:25"), ttft_seconds=0.4),
        ],
        at("13:30"),
        "after",
    )
    assert classes_of(con, at("13:00"), at("14:00")) == {
        ("chat", "acme"): 1,
        ("chat", "globex"): 1,
        ("premium", "anonymous"): 1,
        ("chat", "umbrella"): 1,
        ("premium", "initech"): 1,  # its tenant's class
    }
    # the same sheet loads again (its user without a tenant is anonymous's alice, stored already)
    db = tmp_path / "w.duckdb"
    con.execute(f"ATTACH '{db}' AS copy")
    con.execute("COPY FROM DATABASE memory TO copy")
    con.execute("DETACH copy")
    sheet = tmp_path / "before-tenants.toml"
    sheet.write_text(OLD_SHEET)
    assert main(["slo", "load", str(sheet), "--db", str(db)]) == 0
