"""Hostile racks on the fleet's DuckLake (issue #46): each rack publishes as a PostgreSQL role of its
own, and the lake's guard (warehouse/lake.py, GUARD_SQL) refuses in the catalog itself any write of
another rack's rows, sheets or watermark, whatever SQL the publisher sends. A refusal names the rack
and its role and changes nothing: the lake's rows, sheets and watermark of the rack stay as they were,
and its own publisher goes on."""

from __future__ import annotations

import json
import re
import shutil
import struct
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest

import warehouse.lake as lake_module
from moemeter.cli import main
from tests.postgres import running_postgres
from tests.warehouse.conftest import rack  # noqa: F401 (the fixture closed_rack builds on)
from tests.warehouse.test_lake import WINDOW, add_events, ingest, local_rows
from warehouse.lake import (
    PUBLISHERS,
    READERS,
    SERIES,
    SHEETS,
    STATE,
    TABLES,
    LakeError,
    Publisher,
    connect,
    open_reader,
    pinned,
)

pytestmark = pytest.mark.integration  # starts PostgreSQL

OWNER, ALPHA, BETA, READER = "lake_owner", "rack_alpha", "rack_beta", "fleet_reader"
ALL_TABLES = [t.name for t in TABLES] + [*SHEETS, SERIES, STATE]
DECODE = "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt"
PREFILL = "vllm-0.32.0-cpu-pd-prefill-nixl.metrics.txt"


def superuser(uri: str, sql: str) -> None:
    """SQL on the lake's database as PostgreSQL's superuser: the operator's part."""
    con = duckdb.connect()
    try:
        lake_module._load_extensions(con)
        con.execute(f"ATTACH {lake_module._quoted(uri.removeprefix('postgres:'))} AS pg (TYPE postgres)")
        con.execute(f"CALL postgres_execute('pg', {lake_module._quoted(sql)})")
    finally:
        con.close()


@pytest.fixture(scope="module")
def server():
    """A PostgreSQL with the roles an operator makes: the lake's owner, a login role per rack in the
    publishers' group, and a reader."""
    with running_postgres() as database:
        uri = database("roles")
        superuser(
            uri,
            f"CREATE ROLE {OWNER} LOGIN; CREATE ROLE {PUBLISHERS} NOLOGIN; CREATE ROLE {READERS} NOLOGIN; "
            f"CREATE ROLE {ALPHA} LOGIN IN ROLE {PUBLISHERS}; CREATE ROLE {BETA} LOGIN IN ROLE {PUBLISHERS}; "
            f"CREATE ROLE {READER} LOGIN IN ROLE {READERS}",
        )
        yield database


@dataclass(frozen=True)
class Lake:
    uri: str  # as PostgreSQL's superuser
    data: str

    def as_(self, role: str) -> str:
        return self.uri.replace("user=postgres", f"user={role}")


def new_lake(server, name: str, data: Path, setup: bool = True) -> Lake:
    """A new catalog database owned by the lake's owner (who owns its schema public, PostgreSQL 15)."""
    uri = server(name)
    superuser(uri, f"ALTER DATABASE {name} OWNER TO {OWNER}")
    lake = Lake(uri, str(data))
    if setup:
        assert main(["lake", "setup", "--lake", lake.as_(OWNER), "--lake-data", lake.data]) == 0
    return lake


@pytest.fixture
def lake(server, tmp_path) -> Lake:
    return new_lake(server, f"lake_{tmp_path.name.lower().replace('-', '_')[:40]}", tmp_path / "lake-files")


def closed(db: Path, tmp: Path) -> Path:
    """tests/warehouse/test_lake.py's closed rack: the cost rack, its 10:00-12:00 closed."""
    copy = tmp / f"closed-{db.stem}.duckdb"
    shutil.copy(db, copy)
    for at in (datetime(2026, 11, 29, 12, 0, 5), datetime(2026, 11, 29, 12, 1, 5)):
        more(copy, at, tmp)
    return copy


def more(db: Path, at: datetime, tmp: Path, decode: str = "decode-0") -> None:
    """A scrape of each instance at `at`, the counters as at 11:59:55."""
    pf: dict[str, float] = {
        "vllm:prompt_tokens_total": 1_500_000,
        "vllm:prompt_tokens_by_source_total|local_cache_hit": 300_000,
    }
    ingest(db, "prefill-0", "prefill", 2, PREFILL, pf, at, tmp)
    ingest(db, decode, "decode", 4, DECODE, {"vllm:generation_tokens_total": 1_000_000}, at, tmp)


@pytest.fixture
def alpha(rack, tmp_path) -> Path:  # noqa: F811
    return closed(rack[0], tmp_path)


@pytest.fixture
def other(alpha, tmp_path) -> Path:
    """Another rack's file: alpha's history and half an hour more, and a decode instance alpha has not
    (its watermark and its targets sheet differ from alpha's)."""
    copy = tmp_path / "other.duckdb"
    shutil.copy(alpha, copy)
    for minute in (29, 30):
        more(copy, datetime(2026, 11, 29, 12, minute, 5), tmp_path, decode="decode-9")
    return copy


def publish(lake: Lake, role: str, db: Path, name: str, capsys=None) -> str:
    if capsys is not None:
        capsys.readouterr()
    code = main(["publish", "--db", str(db), "--lake", lake.as_(role), "--rack", name])
    out = capsys.readouterr() if capsys is not None else None
    assert code == 0, out
    return out.out if out is not None else ""


def held(lake: Lake, name: str) -> dict[str, list[tuple]]:
    """Every row the lake holds for rack `name`, table by table (read as the superuser)."""
    with open_reader(lake.uri, data_path=lake.data) as con:
        return {
            t: con.execute(f"SELECT * EXCLUDE (rack) FROM lake.{t} WHERE rack = ? ORDER BY ALL", [name]).fetchall()
            for t in ALL_TABLES
        }


def cost(capsys, lake: Lake, role: str, name: str) -> dict:
    capsys.readouterr()
    assert main(["report", "cost", *WINDOW, "--json", "--lake", lake.as_(role), "--rack", name]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_rack_publishing_under_another_racks_name_is_refused_and_alphas_publisher_goes_on(
    lake, alpha, other, tmp_path, capsys
):
    """The issue's case: `moemeter publish --rack alpha` from rack B, with a later watermark and a
    target alpha has not, would have replaced alpha's sheets and watermark; it is refused, naming the
    rack and its role, and alpha publishes its next minute and costs its hours as before."""
    publish(lake, ALPHA, alpha, "alpha")
    before = held(lake, "alpha")
    assert before[STATE] and before["targets"] and before["increments_1m"]
    assert main(["publish", "--db", str(other), "--lake", lake.as_(BETA), "--rack", "alpha"]) == 2
    err = capsys.readouterr().err
    assert "rack 'alpha' belongs to role rack_alpha; role rack_beta may not write its rows" in err, err
    assert held(lake, "alpha") == before
    with open_reader(lake.uri, data_path=lake.data) as con:  # each commit's author is its role, whatever it says
        assert {r[0] for r in con.execute("SELECT author FROM ducklake_snapshots('lake')").fetchall()} >= {ALPHA}

    more(alpha, datetime(2026, 11, 29, 12, 2, 5), tmp_path)
    out = publish(lake, ALPHA, alpha, "alpha", capsys)
    assert "rack alpha: published through 2026-11-29 12:02 UTC" in out, out
    after = held(lake, "alpha")
    assert [r for r in after[STATE] if r[0] == "1m"][0][1] == datetime(2026, 11, 29, 12, 2)
    assert [t[0] for t in after["targets"]] == ["decode-0", "prefill-0"]  # alpha's own, not rack B's decode-9
    report = cost(capsys, lake, READER, "alpha")  # a reader's role reads every rack
    assert report["total"]["cost_usd"] == 467.52  # test_cost.py's hand-computed hours, as published
    assert report["pools"]["decode"]["generated_tokens"] == 1_000_000


def test_a_publisher_that_skips_moemeters_own_check_is_refused_by_the_catalog(lake, alpha, other, monkeypatch):
    """Rack B's publisher with the Python check taken out: its commit reaches the catalog, which
    refuses it whole (not a row of alpha's changes, nor B's own files in the same commit)."""
    publish(lake, ALPHA, alpha, "alpha")
    before = held(lake, "alpha")
    monkeypatch.setattr(lake_module, "check_publisher", lambda con, name: None)
    con = connect(lake.as_(BETA))
    try:
        hostile = Publisher(con, "alpha")
        with duckdb.connect(str(other), read_only=True) as local, pytest.raises(LakeError) as refused:
            hostile.catch_up(local)
    finally:
        con.close()
    assert "rack 'alpha' belongs to role rack_alpha; role rack_beta may not" in str(refused.value)
    assert held(lake, "alpha") == before


def inlined_table(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """The catalog's table of `table`'s inlined rows, at its latest schema."""
    sql = (
        "SELECT i.table_name FROM public.ducklake_inlined_data_tables i JOIN public.ducklake_table t USING (table_id) "
        f"WHERE t.table_name = '{table}' AND t.end_snapshot IS NULL ORDER BY i.schema_version DESC LIMIT 1"
    )
    [(name,)] = con.execute("SELECT * FROM postgres_query('lake_commits', ?)", [sql]).fetchall()
    return str(name)


ALPHAS = "rack 'alpha' belongs to role rack_alpha; role rack_beta may not"
THROUGH_DUCKLAKE = {  # SQL on the lake attached by rack B's role, as DuckLake writes it
    "move alpha's watermark": ("UPDATE lake.lake_state SET through = '2030-01-01' WHERE rack = 'alpha'", ALPHAS),
    "delete alpha's watermark": ("DELETE FROM lake.lake_state WHERE rack = 'alpha'", ALPHAS),
    "empty alpha's targets sheet": ("DELETE FROM lake.targets WHERE rack = 'alpha'", ALPHAS),
    "add to alpha's targets sheet": (
        "INSERT INTO lake.targets (rack, name, role, gpus) VALUES ('alpha', 'decode-9', 'decode', 4)",
        ALPHAS,
    ),
    "delete alpha's minutes, whole files": ("DELETE FROM lake.increments_1m WHERE rack = 'alpha'", ALPHAS),
    "delete some of alpha's minutes": (
        "DELETE FROM lake.increments_1m WHERE rack = 'alpha' AND ts < '2026-11-29 10:03'",
        ALPHAS,
    ),
    "write alpha's minutes twice, in a file": (
        "INSERT INTO lake.increments_1m SELECT * FROM lake.increments_1m WHERE rack = 'alpha'",
        ALPHAS,
    ),
    "write rows that name no rack": ("INSERT INTO lake.targets (rack, name) VALUES (NULL, 'x')", "name no rack"),
    "write its own watermarks in a data file, where the catalog cannot read them": (
        "INSERT INTO lake.lake_state SELECT 'beta', 'x' || range, now()::TIMESTAMP, now()::TIMESTAMP FROM range(20)",
        "may not write lake_state in a data file",
    ),
    "drop a table every rack publishes": ("DROP TABLE lake.targets", "follows the last one and changes no schema"),
    "drop a column": ("ALTER TABLE lake.targets DROP COLUMN gpus", "follows the last one and changes no schema"),
    "expire every rack's snapshots": (
        "CALL ducklake_expire_snapshots('lake', older_than => now())",
        "only the lake's owner, role lake_owner, may",
    ),
}
IN_THE_CATALOG = {  # SQL on the catalog's PostgreSQL tables, by rack B's role
    "give itself alpha": (
        "UPDATE moemeter.rack_owners SET owner = 'rack_beta' WHERE rack = 'alpha'",
        "permission denied for table rack_owners",
    ),
    "switch the guard off": (
        "ALTER TABLE public.ducklake_data_file DISABLE TRIGGER moemeter_guard",
        "must be owner of table ducklake_data_file",
    ),
    "end alpha's data files": (
        "UPDATE public.ducklake_data_file SET end_snapshot = (SELECT max(snapshot_id) FROM public.ducklake_snapshot) "
        "WHERE end_snapshot IS NULL AND path LIKE 'rack=alpha/%'",
        ALPHAS,
    ),
    "narrow the statistics so readers skip alpha's rows": (
        "UPDATE public.ducklake_table_column_stats SET min_value = 'zzz', max_value = 'zzz'",
        "may not narrow the statistics",
    ),
    "move row ids back": (
        "UPDATE public.ducklake_table_stats SET next_row_id = 0",
        "may not move table",
    ),
    "schedule a file outside the data path for deletion": (
        "INSERT INTO public.ducklake_files_scheduled_for_deletion VALUES (999999, '../../../etc/passwd', true, now())",
        "a path outside the data path",
    ),
    "schedule alpha's live data file for deletion": (
        "INSERT INTO public.ducklake_files_scheduled_for_deletion SELECT 999999, 'main/increments_1m/' || path, true, "
        "now() FROM public.ducklake_data_file WHERE path LIKE 'rack=alpha/%' AND end_snapshot IS NULL LIMIT 1",
        "the catalog still names it",
    ),
    "remove the last snapshot": (
        "DELETE FROM public.ducklake_snapshot WHERE snapshot_id = (SELECT max(snapshot_id) FROM public.ducklake_snapshot)",
        "only the lake's owner, role lake_owner, may",
    ),
    "write alpha's watermark row by hand": (
        "DO $$ BEGIN EXECUTE format('INSERT INTO public.%I (row_id, begin_snapshot, rack) VALUES (999999, 1, %L)', "
        "'{lake_state}', convert_to('alpha', 'UTF8')); END $$",
        ALPHAS,
    ),
}


@pytest.fixture(scope="module")
def published(server, rack, tmp_path_factory):  # noqa: F811
    """One lake for the attacks below, alpha published there by its role (each attack is refused and
    changes nothing, so they share it)."""
    tmp = tmp_path_factory.mktemp("attacks")
    lake = new_lake(server, "lake_attacks", tmp / "lake-files")
    db = closed(rack[0], tmp)
    assert (
        main(["publish", "--db", str(db), "--lake", lake.as_(ALPHA), "--rack", "alpha", "--chunk-minutes", "30"]) == 0
    )
    assert main(["publish", "--db", str(db), "--lake", lake.as_(BETA), "--rack", "beta"]) == 0
    return lake, held(lake, "alpha")


@pytest.mark.parametrize("case", THROUGH_DUCKLAKE, ids=list(THROUGH_DUCKLAKE))
def test_sql_through_ducklake_cannot_touch_another_racks_rows(published, case):
    lake, before = published
    sql, refused = THROUGH_DUCKLAKE[case]
    con = connect(lake.as_(BETA))
    try:
        with pytest.raises(duckdb.Error, match="lake guard") as caught:
            con.execute(sql)
    finally:
        con.close()
    assert refused in str(caught.value), str(caught.value)[-600:]
    assert held(lake, "alpha") == before


@pytest.mark.parametrize("case", IN_THE_CATALOG, ids=list(IN_THE_CATALOG))
def test_sql_on_the_catalogs_own_tables_cannot_touch_another_racks_rows(published, case):
    lake, before = published
    sql, refused = IN_THE_CATALOG[case]
    con = connect(lake.as_(BETA))
    try:
        sql = sql.replace("{lake_state}", inlined_table(con, STATE))
        with pytest.raises(duckdb.Error) as caught:
            con.execute(f"CALL postgres_execute('lake_commits', {lake_module._quoted(sql)})")
    finally:
        con.close()
    assert refused in str(caught.value), str(caught.value)[-600:]
    assert held(lake, "alpha") == before


NEW_FILE = "(SELECT next_file_id - 1 FROM public.ducklake_snapshot ORDER BY snapshot_id DESC LIMIT 1)"
"""The id of the file the latest snapshot added (a snapshot's next_file_id counts its files)."""


def snapshot(files: int, change: str) -> str:
    """SQL of a new snapshot after the last one, adding `files` files, and what it changed."""
    return f"""
        INSERT INTO public.ducklake_snapshot
            SELECT snapshot_id + 1, now(), schema_version, next_catalog_id, next_file_id + {files}
            FROM public.ducklake_snapshot ORDER BY snapshot_id DESC LIMIT 1;
        INSERT INTO public.ducklake_snapshot_changes
            SELECT max(snapshot_id), '{change}', NULL, NULL, NULL FROM public.ducklake_snapshot;"""


def table_id(table: str) -> str:
    return f"(SELECT table_id FROM public.ducklake_table WHERE table_name = '{table}' AND end_snapshot IS NULL)"


def parquet_facts(parquet: Path) -> tuple[int, int, int]:
    """A Parquet file's rows, bytes and footer bytes, as the catalog records them."""
    with parquet.open("rb") as f:
        f.seek(-8, 2)
        footer = struct.unpack("<i", f.read(4))[0]
    [(rows,)] = duckdb.sql(f"SELECT count(*) FROM read_parquet('{parquet}')").fetchall()
    return int(rows), parquet.stat().st_size, footer


def data_file_by_hand(parquet: Path, table: str, name: str, path: str, relative: bool = True) -> str:
    """SQL that adds to `table`, in a snapshot of its own, a data file at `path` in rack `name`'s
    partition, with `parquet`'s rows, size and footer and statistics that say it holds rack `name`."""
    rows, size, footer = parquet_facts(parquet)
    return (
        snapshot(1, f"inserted_into_table:' || {table_id(table)} || '")
        + f"""
        INSERT INTO public.ducklake_data_file
            SELECT {NEW_FILE}, t.table_id, (SELECT max(snapshot_id) FROM public.ducklake_snapshot), NULL, NULL,
                   '{path}', {relative}, 'parquet', {rows}, {size}, {footer}, st.next_row_id, p.partition_id, NULL,
                   NULL, NULL
            FROM public.ducklake_table t
            JOIN public.ducklake_partition_info p ON p.table_id = t.table_id AND p.end_snapshot IS NULL
            JOIN public.ducklake_table_stats st ON st.table_id = t.table_id
            WHERE t.table_id = {table_id(table)};
        INSERT INTO public.ducklake_file_partition_value VALUES ({NEW_FILE}, {table_id(table)}, 0, '{name}');
        INSERT INTO public.ducklake_file_column_stats
            SELECT {NEW_FILE}, c.table_id, c.column_id, NULL, {rows}, 0, '{name}', '{name}', NULL, NULL
            FROM public.ducklake_column c
            WHERE c.table_id = {table_id(table)} AND c.column_name = 'rack' AND c.end_snapshot IS NULL;
        UPDATE public.ducklake_table_stats SET next_row_id = next_row_id + {rows}, record_count = record_count + {rows}
            WHERE table_id = {table_id(table)};"""
    )


def delete_file_by_hand(parquet: Path, table: str, name: str, path: str, relative: bool = True) -> str:
    """SQL that adds to `table`, in a snapshot of its own, a delete file at `path` of one row of a live
    data file of rack `name` (with `parquet`'s size and footer)."""
    _, size, footer = parquet_facts(parquet)
    return (
        snapshot(1, f"deleted_from_table:' || {table_id(table)} || '")
        + f"""
        INSERT INTO public.ducklake_delete_file
            SELECT {NEW_FILE}, f.table_id, (SELECT max(snapshot_id) FROM public.ducklake_snapshot), NULL,
                   f.data_file_id, '{path}', {relative}, 'parquet', 1, {size}, {footer}, NULL, NULL
            FROM public.ducklake_data_file f
            WHERE f.table_id = {table_id(table)} AND f.end_snapshot IS NULL AND f.path LIKE 'rack={name}/%' LIMIT 1;"""
    )


def ended_by_hand(kind: str, table: str) -> str:
    """SQL that ends, in a snapshot of its own, the data or delete file the last snapshot added (a
    rack's writer may end a file of its rack)."""
    return (
        snapshot(0, f"deleted_from_table:' || {table_id(table)} || '")
        + f"""
        UPDATE public.ducklake_{kind}_file SET end_snapshot = (SELECT max(snapshot_id) FROM public.ducklake_snapshot)
            WHERE {kind}_file_id = (SELECT next_file_id - 1 FROM public.ducklake_snapshot
                                    ORDER BY snapshot_id DESC LIMIT 1);"""
    )


def register_by_hand(con: duckdb.DuckDBPyConnection, lake: Lake, parquet: Path, table: str, name: str) -> None:
    """A Parquet file written outside DuckLake, added to `table` by rack B's role with plain SQL on
    the catalog (one commit: a snapshot, the file, its partition value and its rack's statistics)."""
    sql = data_file_by_hand(parquet, table, name, f"rack={name}/{parquet.name}")
    con.execute(f"CALL postgres_execute('lake_commits', {lake_module._quoted(sql)})")


def test_a_file_made_by_hand_is_refused_under_another_racks_name_and_not_read_as_its_rows(
    lake, alpha, tmp_path, capsys
):
    """Rack B writes a Parquet file of alpha's minutes, each a thousand times over, and adds it to the
    catalog by hand. Under alpha's partition it is refused. Under its own (the guard cannot read a
    Parquet file), alpha's reports read by rack and do not see it; a query across racks of
    `lake.<table>` by its `rack` column does: docs/operations.md says so."""
    publish(lake, ALPHA, alpha, "alpha")
    publish(lake, BETA, alpha, "beta")
    before, report = held(lake, "alpha"), cost(capsys, lake, READER, "alpha")
    con = connect(lake.as_(BETA))
    try:
        for name in ("alpha", "beta"):
            folder = Path(lake.data) / "main" / "increments_1m" / f"rack={name}"
            forged = folder / f"forged-by-rack-b-{name}.parquet"
            con.execute(
                f"COPY (SELECT * REPLACE (delta * 1000 AS delta) FROM lake.increments_1m WHERE rack = 'alpha') "
                f"TO '{forged}' (FORMAT parquet)"
            )
            if name == "alpha":
                with pytest.raises(duckdb.Error, match=ALPHAS):
                    register_by_hand(con, lake, forged, "increments_1m", name)
            else:
                register_by_hand(con, lake, forged, "increments_1m", name)
    finally:
        con.close()
    assert held(lake, "alpha") == before
    assert cost(capsys, lake, READER, "alpha") == report
    with open_reader(lake.uri, data_path=lake.data) as con:  # a filter in the aggregate is not pushed to the files
        across = con.execute("SELECT count(*) FILTER (WHERE rack = 'alpha') FROM lake.increments_1m").fetchone()[0]
    assert across == 2 * len(before["increments_1m"])  # the limit: read by the column, the forged rows count


def test_the_first_publisher_claims_a_rack_and_the_lakes_owner_alone_reassigns_it(lake, alpha, capsys):
    publish(lake, BETA, alpha, "gamma")
    assert main(["publish", "--db", str(alpha), "--lake", lake.as_(ALPHA), "--rack", "gamma"]) == 2
    assert "rack 'gamma' belongs to role rack_beta; role rack_alpha may not write its rows" in capsys.readouterr().err
    assert main(["lake", "assign", "gamma", ALPHA, "--lake", lake.as_(ALPHA)]) == 2
    assert "only the lake's owner, role lake_owner, assigns racks: this connection is role rack_alpha" in (
        capsys.readouterr().err
    )
    assert main(["lake", "assign", "gamma", ALPHA, "--lake", lake.as_(OWNER)]) == 0
    publish(lake, ALPHA, alpha, "gamma")  # its rows, files and watermark are alpha's role's to replace now
    assert main(["publish", "--db", str(alpha), "--lake", lake.as_(BETA), "--rack", "gamma"]) == 2
    capsys.readouterr()
    assert main(["lake", "owners", "--lake", lake.as_(READER)]) == 0
    assert [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]] == [["gamma", ALPHA]]


def test_a_racks_role_publishes_every_kind_of_step_and_the_lakes_owner_tidies_every_racks_files(
    lake, alpha, tmp_path, capsys
):
    """Alpha's role publishes what the guard's rules must let a rack write: a backlog in steps, the
    owner's tidy of every rack's files between (refused to a rack: it rewrites other racks' files), a
    price sheet loaded, a rebalance event that arrives late, minutes a late interval reaches back into
    (held in the merged files), an hour the writer compacted; the lake then holds alpha's file row
    for row."""
    add_events(alpha, datetime(2026, 11, 29, 11, 30), datetime(2026, 11, 29, 11, 59, 30))
    for role, name in ((ALPHA, "alpha"), (BETA, "beta")):
        argv = ["publish", "--db", str(alpha), "--lake", lake.as_(role), "--rack", name, "--chunk-minutes", "30"]
        assert main(argv) == 0
    assert main(["lake", "tidy", "--lake", lake.as_(ALPHA)]) == 2
    assert "tidying rewrites every rack's files: only the lake's owner, role lake_owner, may" in capsys.readouterr().err
    con = connect(lake.as_(OWNER))
    try:
        untidy = {name: f.data for name, f in lake_module.table_files(con).items()}
    finally:
        con.close()
    assert untidy["increments_1m"] >= 4, untidy  # five steps of each rack, left as they were
    assert main(["lake", "tidy", "--lake", lake.as_(OWNER)]) == 0
    merged = re.search(r"(\d+) merged", capsys.readouterr().out)
    assert merged and int(merged.group(1)) >= 2, merged

    with duckdb.connect(str(alpha)) as local:
        local.execute(
            "INSERT INTO gpu_prices VALUES ('2026-11-29 12:00', 'decode', 9.5, 'prices.csv', 'test', now()::TIMESTAMP)"
        )
    more(alpha, datetime(2026, 11, 29, 12, 2, 5), tmp_path)
    add_events(alpha, datetime(2026, 11, 29, 11, 45))
    publish(lake, ALPHA, alpha, "alpha")
    for at in (datetime(2026, 11, 29, 12, 11, 5), datetime(2026, 11, 29, 12, 12, 5)):  # 10 minutes down, then back
        ingest(alpha, "decode-0", "decode", 4, DECODE, {"vllm:generation_tokens_total": 1_600_000}, at, tmp_path)
    publish(lake, ALPHA, alpha, "alpha")
    for at in (datetime(2026, 11, 29, 13, 0, 5), datetime(2026, 11, 29, 13, 1, 5)):  # 13:00 closes: 11:00 compacted
        more(alpha, at, tmp_path)
    publish(lake, ALPHA, alpha, "alpha")
    now = held(lake, "alpha")
    for table in [t.name for t in TABLES] + [*SHEETS, SERIES]:
        assert now[table] == local_rows(alpha, table), table
    assert len(now["eplb_rebalances"]) == 3 and len(now["gpu_prices"]) == 1


def test_a_lake_of_one_role_keeps_working_and_moves_to_a_role_per_rack(server, alpha, tmp_path, monkeypatch, capsys):
    """A lake made before the guard, every rack publishing as the one role that owns it: the first
    publisher of this version installs the guard, which gives the racks already there to that role,
    and they publish on. The owner then gives each rack its role (docs/operations.md, upgrading)."""
    lake = new_lake(server, "lake_one_role", tmp_path / "lake-files", setup=False)

    def before_the_guard(con):  # type: ignore[no-untyped-def]
        raise LakeError("this version had no guard")

    with monkeypatch.context() as m:
        m.setattr(lake_module, "install_guard", before_the_guard)
        for name in ("alpha", "beta"):
            argv = ["publish", "--db", str(alpha), "--lake", lake.as_(OWNER), "--lake-data", lake.data, "--rack", name]
            assert main(argv) == 0
    before = held(lake, "alpha")
    more(alpha, datetime(2026, 11, 29, 12, 2, 5), tmp_path)
    publish(lake, OWNER, alpha, "beta")  # upgraded: the guard goes in, beta publishes on
    capsys.readouterr()
    assert main(["lake", "owners", "--lake", lake.as_(OWNER)]) == 0
    assert [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]] == [
        ["alpha", OWNER],
        ["beta", OWNER],
    ]
    assert held(lake, "alpha") == before
    assert main(["publish", "--db", str(alpha), "--lake", lake.as_(ALPHA), "--rack", "alpha"]) == 2
    assert "rack 'alpha' belongs to role lake_owner; role rack_alpha may not write its rows" in capsys.readouterr().err
    for name, role in (("alpha", ALPHA), ("beta", BETA)):
        assert main(["lake", "assign", name, role, "--lake", lake.as_(OWNER)]) == 0
    assert main(["lake", "setup", "--lake", lake.as_(OWNER)]) == 0  # grants the publishers' group
    out = publish(lake, ALPHA, alpha, "alpha", capsys)  # replaces rows the one role wrote
    assert "published through 2026-11-29 12:02 UTC" in out, out
    assert main(["publish", "--db", str(alpha), "--lake", lake.as_(BETA), "--rack", "alpha"]) == 2
    assert held(lake, "alpha")["increments_1m"] != before["increments_1m"]  # 12:01 added by alpha's role


def on_catalog(lake: Lake, role: str, sql: str) -> None:
    """Plain SQL on the catalog's database, as `role`."""
    con = connect(lake.as_(role))
    try:
        con.execute(f"CALL postgres_execute('lake_commits', {lake_module._quoted(sql)})")
    finally:
        con.close()


def test_a_table_a_publisher_makes_among_the_catalogs_stops_every_racks_commit_until_dropped(
    lake, alpha, tmp_path, capsys
):
    """Publishers may create tables (DuckLake asks CREATE for its inlined deletions), so one could make
    a table DuckLake would then use, unguarded: no rack commits while the catalog holds a table the
    lake's owner does not own, and the refusal names it and its role."""
    publish(lake, ALPHA, alpha, "alpha")
    before = held(lake, "alpha")
    squat = "public.ducklake_inlined_delete_9999"
    on_catalog(lake, BETA, f"CREATE TABLE {squat} (file_id BIGINT, row_id BIGINT, begin_snapshot BIGINT)")
    more(alpha, datetime(2026, 11, 29, 12, 2, 5), tmp_path)
    capsys.readouterr()
    assert main(["publish", "--db", str(alpha), "--lake", lake.as_(ALPHA), "--rack", "alpha"]) == 2
    err = capsys.readouterr().err
    assert "table ducklake_inlined_delete_9999 of the catalog belongs to role rack_beta" in err, err
    assert held(lake, "alpha") == before
    assert main(["lake", "setup", "--lake", lake.as_(OWNER)]) == 2
    assert f"does not own: {squat} (role rack_beta)" in capsys.readouterr().err
    on_catalog(lake, BETA, f"DROP TABLE {squat}")
    assert "published through 2026-11-29 12:02 UTC" in publish(lake, ALPHA, alpha, "alpha", capsys)


def live_files(lake: Lake, name: str) -> dict[str, list[Path]]:
    """The data and delete files the catalog names for rack `name`'s rows, by table, on disk or not."""
    con = connect(lake.as_(OWNER))
    try:
        return {
            table: [
                Path(p)
                for row in con.execute(
                    "SELECT data_file, delete_file FROM ducklake_list_files('lake', ?) "
                    "WHERE data_file LIKE '%/rack=' || ? || '/%'",
                    [table, name],
                ).fetchall()
                for p in row
                if p is not None
            ]
            for table in ALL_TABLES
        }
    finally:
        con.close()


def test_a_file_at_another_racks_path_is_refused_and_the_owners_tidy_deletes_none_of_alphas(
    lake, alpha, tmp_path, capsys, monkeypatch
):
    """The owner's tidy deletes from the data path the path of each file that was ended and whose
    snapshots expired. Rack B adds a file of its own rack whose path is one of alpha's (a data file
    named relatively or by its absolute path, a delete file of B's rows, a delete file named as
    alpha's delete file beside it) and ends it: each is refused, so the tidy removes none of alpha's
    files, and alpha's rows and cost read as before."""
    argv = ["publish", "--db", str(alpha), "--lake", lake.as_(ALPHA), "--rack", "alpha", "--chunk-minutes", "180"]
    assert main(argv) == 0  # one step: one file of each table
    more(alpha, datetime(2026, 11, 29, 12, 2, 5), tmp_path)
    publish(lake, ALPHA, alpha, "alpha", capsys)  # replaces the minutes 12:01 reaches into: a delete file
    publish(lake, BETA, alpha, "beta", capsys)
    files = live_files(lake, "alpha")
    [hours] = files["samples_1h"]  # published once, whole: no tidy rewrites or merges it
    deletes = [f for f in files["increments_1m"] if f.name.endswith("-delete.parquet")]
    assert deletes, files["increments_1m"]
    before, report = held(lake, "alpha"), cost(capsys, lake, READER, "alpha")
    in_table = Path(lake.data) / "main" / "samples_1h"
    relative = hours.relative_to(in_table).as_posix()
    assert relative.startswith("rack=alpha/"), relative
    attacks = {
        "a data file at the path of alpha's": data_file_by_hand(hours, "samples_1h", "beta", relative)
        + ended_by_hand("data", "samples_1h"),
        "a data file at the absolute path of alpha's": data_file_by_hand(hours, "samples_1h", "beta", str(hours), False)
        + ended_by_hand("data", "samples_1h"),
        "a delete file of its rows at the path of alpha's data file": delete_file_by_hand(
            hours, "samples_1h", "beta", relative
        )
        + ended_by_hand("delete", "samples_1h"),
        "a delete file at the path of alpha's delete file": delete_file_by_hand(
            deletes[0], "increments_1m", "beta", deletes[0].name
        )
        + ended_by_hand("delete", "increments_1m"),
    }
    refused = {}
    for case, sql in attacks.items():
        try:
            on_catalog(lake, BETA, sql)
        except duckdb.Error as exc:
            refused[case] = str(exc)
    monkeypatch.setattr(lake_module, "KEEP_SNAPSHOTS", timedelta(0))  # every replaced snapshot expires now
    assert main(["lake", "tidy", "--lake", lake.as_(OWNER)]) == 0, capsys.readouterr()
    gone = [p for paths in live_files(lake, "alpha").values() for p in paths if not p.exists()]
    assert not gone, gone
    assert held(lake, "alpha") == before
    assert cost(capsys, lake, READER, "alpha") == report
    where = "a file of rack 'beta' is a Parquet file in"
    for case, says in {
        "a data file at the path of alpha's": f"data file of table samples_1h at '{relative}': {where}",
        "a data file at the absolute path of alpha's": f"at the absolute path '{hours}': {where}",
        "a delete file of its rows at the path of alpha's data file": f"delete file of table samples_1h at "
        f"'{relative}': {where} its table's folder or in rack=beta/ under it",
        "a delete file at the path of alpha's delete file": f"the catalog names a file '{deletes[0].name}' already",
    }.items():
        assert case in refused and says in refused[case], (case, refused.get(case, "not refused")[-600:])


def test_a_reader_may_not_claim_a_rack_that_has_not_published_yet(lake, alpha, capsys):
    """The guard's functions run as the lake's owner; any role that logs in to the catalog (a reader,
    a dashboard's) could call them. Claiming a rack is its publishers' alone: a reader's claim of a rack
    nobody has published is refused, and the rack's own publisher claims it when it first publishes."""
    for sql in ("SELECT moemeter.claim_rack('delta')", "SELECT moemeter.check_rack('delta', 'write')"):
        with pytest.raises(duckdb.Error, match="permission denied for function"):
            on_catalog(lake, READER, sql)
    publish(lake, ALPHA, alpha, "delta")
    capsys.readouterr()
    assert main(["lake", "owners", "--lake", lake.as_(READER)]) == 0
    assert [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]] == [["delta", ALPHA]]


TROJAN = """
CREATE FUNCTION public.moemeter_trojan(a varchar, b varchar) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    BEGIN  -- refused to rack B itself; done by any session of the lake's owner that compares two strings
        UPDATE moemeter.rack_owners SET owner = 'rack_beta' WHERE rack::text = 'alpha'::text;
    EXCEPTION WHEN others THEN NULL;
    END;
    RETURN a::text = b::text;
END $$;
CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = varchar, FUNCTION = public.moemeter_trojan);
"""


def test_an_operator_a_publisher_makes_in_schema_public_never_runs_in_the_owners_sessions(
    lake, alpha, tmp_path, capsys
):
    """Publishers may create objects in schema public (DuckLake asks CREATE there), and PostgreSQL
    takes an operator `=(varchar, varchar)` there over pg_catalog's for every `varchar = 'text'` of a
    session whose search path holds public. Rack B makes one that gives itself alpha when a session
    of the lake's owner runs it; the owner's setup, tidy and publishing never do (each session on the
    catalog searches pg_catalog alone), and alpha stays alpha's role's."""
    publish(lake, ALPHA, alpha, "alpha")
    on_catalog(lake, BETA, TROJAN)
    assert main(["lake", "setup", "--lake", lake.as_(OWNER)]) == 0
    assert main(["publish", "--db", str(alpha), "--lake", lake.as_(OWNER), "--rack", "gamma"]) == 0
    assert main(["lake", "tidy", "--lake", lake.as_(OWNER)]) == 0
    capsys.readouterr()
    assert main(["lake", "owners", "--lake", lake.as_(OWNER)]) == 0
    owners = [line.split()[:2] for line in capsys.readouterr().out.splitlines()[1:]]
    assert owners == [["alpha", ALPHA], ["gamma", OWNER]], owners
    assert main(["publish", "--db", str(alpha), "--lake", lake.as_(BETA), "--rack", "alpha"]) == 2
    assert "rack 'alpha' belongs to role rack_alpha; role rack_beta may not write its rows" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "pinned_to"),
    [
        (
            "dbname=lake host=/run/postgresql",
            "dbname=lake host=/run/postgresql options='-c search_path=pg_catalog,pg_temp'",
        ),
        (
            "dbname=lake options='-c statement_timeout=5s -c search_path=public' user=x ",
            "dbname=lake options='-c statement_timeout=5s -c search_path=public' user=x "
            "options='-c statement_timeout=5s -c search_path=public -c search_path=pg_catalog,pg_temp'",
        ),
        (
            "postgresql://x@pg/lake?sslmode=require&options=-c%20statement_timeout%3D5s",
            "postgresql://x@pg/lake?sslmode=require&options=-c%20statement_timeout%3D5s%20-c%20search_path%3D"
            "pg_catalog%2Cpg_temp",
        ),
    ],
)
def test_every_session_on_the_catalog_searches_pg_catalog_alone(given, pinned_to, monkeypatch):
    """The pin comes after any options the operator's connection string gives (the last wins)."""
    monkeypatch.delenv("PGOPTIONS", raising=False)
    assert pinned(given) == pinned_to
