"""Migrations are numbered, recorded and idempotent; the writer survives a failed job."""

from __future__ import annotations

import struct
from datetime import timedelta

import duckdb
import pandas as pd
import pytest

from moemeter.cli import main
from warehouse import rollup
from warehouse.api import LocalQuery
from warehouse.db import Warehouse, WarehouseError, apply_migrations, computed_columns, migrations
from warehouse.export import BY_SERIES
from warehouse.read import Holdings

from .layouts import COMPACT_MINUTES, COUNTERS_ONCE, POOL_HISTOGRAMS, SIX_MINUTES, T0, write_rounds, written_before


def test_migrations_apply_once_and_are_recorded():
    con = duckdb.connect()
    first = apply_migrations(con)
    assert first == [name for _, name, _ in migrations()]
    assert apply_migrations(con) == []
    rows = con.execute("SELECT version, name FROM schema_migrations ORDER BY version").fetchall()
    assert [r[1] for r in rows] == first
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert {"targets", "series", "samples", "increments", "scrapes"} <= tables


def test_reopening_a_file_keeps_data_and_applies_nothing_new(tmp_path):
    path = tmp_path / "w.duckdb"
    wh = Warehouse(path)
    wh.write(
        lambda con: con.execute("INSERT INTO scrapes VALUES (TIMESTAMP '2026-01-01', 't', true, 0.1, 3, 10, NULL)")
    )
    wh.close()
    wh = Warehouse(path)
    assert wh.query_df("SELECT count(*) AS n FROM scrapes")["n"][0] == 1
    assert wh.query_df("SELECT count(*) AS n FROM schema_migrations")["n"][0] == len(migrations())
    wh.close()


def test_a_failed_write_rolls_back_and_the_writer_keeps_going(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")

    def bad(con):
        con.execute("INSERT INTO scrapes VALUES (TIMESTAMP '2026-01-01', 'a', true, 0.1, 3, 10, NULL)")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        wh.write(bad)
    wh.write(
        lambda con: con.execute("INSERT INTO scrapes VALUES (TIMESTAMP '2026-01-01', 'b', true, 0.1, 3, 10, NULL)")
    )
    assert wh.query_df("SELECT target FROM scrapes")["target"].tolist() == ["b"]
    wh.close()


def test_readers_cannot_reach_files_through_sql(tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    wh = Warehouse(tmp_path / "w.duckdb")
    with pytest.raises(duckdb.Error):
        wh.query_df(f"SELECT * FROM read_csv('{secret}')")
    wh.close()


def test_an_unopenable_path_is_a_clear_error(tmp_path):
    from warehouse.db import WarehouseError

    with pytest.raises(WarehouseError, match="cannot open"):
        Warehouse(tmp_path / "no-such-dir" / "w.duckdb")


def test_a_memory_limit_holds_for_writer_and_readers_and_cannot_be_lifted_by_sql(tmp_path):
    wh = Warehouse(tmp_path / "m.duckdb", memory_limit="256MB")
    assert wh.query_df("SELECT current_setting('memory_limit') AS m")["m"][0] == "244.1 MiB"
    with pytest.raises(duckdb.Error, match="locked"):
        wh.query_df("SET memory_limit = '20GB'")
    wh.close()


def test_a_checkpoint_threshold_and_threads_are_the_writers_and_the_readers(tmp_path):
    wh = Warehouse(tmp_path / "m.duckdb", checkpoint_threshold="256MB", threads=1)
    settings = "SELECT current_setting('checkpoint_threshold') AS c, current_setting('threads') AS t"
    assert wh.write(lambda con: con.sql(settings).fetchone()) == ("244.1 MiB", 1)
    assert wh.query_df(settings).to_dict("records") == [{"c": "244.1 MiB", "t": 1}]
    wh.close()
    with pytest.raises(WarehouseError, match="threads 0: give at least 1"):
        Warehouse(tmp_path / "t.duckdb", threads=0)


def test_writer_and_readers_hand_a_joins_keys_to_the_scan_and_sql_cannot_lower_it(tmp_path):
    from warehouse.db import JOIN_FILTER_KEYS

    wh = Warehouse(tmp_path / "j.duckdb")
    setting = "SELECT current_setting('dynamic_or_filter_threshold') AS n"
    assert wh.write(lambda con: con.sql(setting).fetchone()) == (JOIN_FILTER_KEYS,)
    assert wh.query_df(setting)["n"][0] == JOIN_FILTER_KEYS > 50  # DuckDB's own default: 50
    with pytest.raises(duckdb.Error, match="locked"):
        wh.query_df("SET dynamic_or_filter_threshold = 0")
    wh.close()


@pytest.mark.parametrize("setting", ["memory_limit", "checkpoint_threshold"])
@pytest.mark.parametrize("bad", ["lots", "4", "-1GB", "1GB; DROP TABLE samples", "50%"])
def test_a_bad_size_is_refused_before_the_file_is_touched(tmp_path, setting, bad):
    from warehouse.db import WarehouseError

    with pytest.raises(WarehouseError, match="give a size such as"):
        Warehouse(tmp_path / "m.duckdb", **{setting: bad})
    assert not (tmp_path / "m.duckdb").exists()


def test_a_file_a_newer_duckdb_wrote_says_how_to_bring_it_over(tmp_path, capsys):
    """DuckDB reads no newer storage version: a file DuckDB 2.x wrote (its header says 999) is refused
    with what to do, by the writer and by `moemeter query` alike, and left as it was."""
    path = tmp_path / "w.duckdb"
    Warehouse(path).close()
    data = bytearray(path.read_bytes())
    before = struct.unpack("<2Q", data[8:24])
    data[12:20] = struct.pack("<Q", 999)  # the main header's storage version, after the magic "DUCK"
    # the header's checksum (its first 8 bytes) XORs each 8-byte word times a constant (DuckDB's
    # common/checksum.cpp): swap the two words' terms
    checksum = struct.unpack("<Q", data[0:8])[0]
    for old, new in zip(before, struct.unpack("<2Q", data[8:24])):
        checksum ^= (old * 0xBF58476D1CE4E5B9) % 2**64 ^ (new * 0xBF58476D1CE4E5B9) % 2**64
    data[0:8] = struct.pack("<Q", checksum)
    path.write_bytes(bytes(data))
    with pytest.raises(WarehouseError, match="written by a newer DuckDB .* EXPORT DATABASE"):
        Warehouse(path)
    assert main(["query", "--db", str(path), "SELECT 1"]) == 2
    assert "written by a newer DuckDB" in capsys.readouterr().err
    assert path.read_bytes() == bytes(data)


def by_key(con: duckdb.DuckDBPyConnection) -> dict[str, list[tuple]]:
    """Every table that holds series ids, each row with its series' key in place of the id."""
    out = {"series": con.execute("SELECT * EXCLUDE (series_id) FROM series ORDER BY ALL").fetchall()}
    for t in BY_SERIES:
        out[t] = con.execute(
            f"SELECT s.series_key, x.* EXCLUDE (series_id) FROM {t} x JOIN series s USING (series_id) ORDER BY ALL"
        ).fetchall()
    return out


def test_series_are_numbered_counters_odd_others_even_by_metric_then_page_order():
    """A round's rows go in id order: like series side by side, and the ids of its increases
    (counters only) rising by two."""
    con = duckdb.connect()
    apply_migrations(con)
    write_rounds(con, range(3))
    first = [r[0] for r in con.execute("SELECT series_id FROM samples WHERE ts = ? ORDER BY rowid", [T0]).fetchall()]
    counters = [i for i in first if i % 2]
    others = [i for i in first if not i % 2]
    assert first == sorted(first)
    assert counters == list(range(1, 2 * len(counters), 2)) and others == list(range(2, 2 * len(others) + 1, 2))
    by_id = con.execute("SELECT series_id % 2 = 1, metric, le FROM series ORDER BY series_id").fetchall()
    monotonic = {r[0] for r in con.execute("SELECT DISTINCT series_id % 2 = 1 FROM increments").fetchall()}
    assert monotonic == {True}
    for parity in (True, False):
        metrics = [m for odd, m, _ in by_id if odd == parity]
        assert metrics == sorted(metrics)
    buckets = [le for _, m, le in by_id if m == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets == sorted(buckets) and len(buckets) > 10  # one histogram's buckets in page order
    later = [
        [r[0] for r in con.execute(f"SELECT series_id FROM {table} WHERE ts = ? ORDER BY rowid", [ts]).fetchall()]
        for ts in (T0 + timedelta(minutes=1), T0 + timedelta(minutes=2))
        for table in ("samples", "increments")
    ]
    assert all(ids == sorted(ids) for ids in later)
    assert later[1] == later[3] == counters  # every counter's increase, ids rising by two
    assert len(later[0]) < len(first)  # counters stored once: by their increases
    keys = con.execute("SELECT count(DISTINCT series_key), count(*) FROM series").fetchall()
    assert keys == [(len(first), len(first))]


COMPACTED = (
    f"ts < (SELECT time_bucket(INTERVAL 1 HOUR, through - INTERVAL {rollup.MINUTE_REACH.seconds} SECOND) "
    "FROM rollup_state WHERE name = '1m')"
)
"""The minute rows rollup.compact_minutes has compacted: those of the hours closed MINUTE_REACH ago."""


def out_of_order(con: duckdb.DuckDBPyConnection, table: str, key: str = "(ts, series_id)", where: str = "TRUE") -> int:
    """Rows of `table` (those `where` picks) stored out of `key`'s order."""
    return con.execute(
        f"SELECT count(*) FROM (SELECT {key} AS k, lag({key}) OVER (ORDER BY rowid) AS before FROM {table} "
        f"WHERE {where}) WHERE before > k"
    ).fetchall()[0][0]


def out_of_series_order(con: duckdb.DuckDBPyConnection) -> int:
    """Compacted minute rows stored out of hour, series and time order."""
    return out_of_order(con, "increments_1m", "(time_bucket(INTERVAL 1 HOUR, ts), series_id, ts)", COMPACTED)


@pytest.mark.slow("writes hours of real pages in the old layout and migrates them")
def test_a_file_with_hashed_series_ids_is_renumbered_in_place_by_its_migration():
    """A warehouse written when series ids were hashes (migrations up to 014) keeps every row of
    every table through migration 015, with ids 1..n in the order of each target's last page, rows
    in time and id order; the writer then carries on from it as from a file it wrote itself."""
    new = duckdb.connect()
    apply_migrations(new)
    write_rounds(new, range(130))  # 10:00 .. 12:09, two hours rolled up
    old = written_before(new, 15)
    assert old.execute("SELECT max(abs(series_id)) > 2^32 FROM series").fetchall() == [(True,)]  # hashes
    kept = by_key(new)
    assert all(kept[t] for t in BY_SERIES)

    assert apply_migrations(old) == [
        "015_dense_series_ids.sql",
        "016_counters_stored_once.sql",
        "017_pool_histograms.sql",
        "018_compact_minute_rows.sql",
        "019_six_minute_rollups.sql",
        "020_users_within_tenants.sql",
        "021_non_streamed_ttft.sql",
        "022_undo_the_future.sql",
        "023_slo_minutes_by_tenant.sql",
        "024_compact_request_records.sql",
        "025_e2e_as_its_remainder.sql",
    ]
    assert by_key(old) == kept
    n = len(kept["series"])
    assert old.execute("SELECT min(series_id), max(series_id), count(*) FROM series").fetchall() == [(1, n, n)]
    for t in BY_SERIES:
        where = f"NOT ({COMPACTED})" if t == "increments_1m" else "TRUE"
        assert out_of_order(old, t, where=where) == 0, t
    assert out_of_series_order(old) == 0
    last = old.execute("SELECT series_id FROM readings WHERE ts = (SELECT max(ts) FROM readings) ORDER BY series_id")
    placed = [r[0] for r in last.fetchall()]
    assert placed == list(range(1, len(placed) + 1))  # the last round's pages, in page order
    gone = old.execute(
        "SELECT min(series_id) FROM series WHERE series_id NOT IN (SELECT series_id FROM readings WHERE ts = ?)",
        [T0 + timedelta(minutes=129)],
    ).fetchall()
    assert gone == [(len(placed) + 1,)]  # series no longer scraped come after them

    write_rounds(new, range(130, 135))
    write_rounds(old, range(130, 135))  # a new writer on the migrated file
    assert by_key(old) == by_key(new)


def stored_readings(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    """(ts, series key, value) of every row of `samples` or `readings`, NaN as a string (NaN != NaN)."""
    rows = con.execute(
        f"SELECT x.ts, s.series_key, CASE WHEN isnan(x.value) THEN 'NaN' ELSE x.value::VARCHAR END "
        f"FROM {table} x JOIN series s USING (series_id) ORDER BY ALL"
    )
    return rows.fetchall()


def used_blocks(con: duckdb.DuckDBPyConnection, table: str) -> int:
    con.execute("CHECKPOINT")
    return con.execute(f"SELECT count(DISTINCT block_id) FROM pragma_storage_info('{table}')").fetchall()[0][0]


@pytest.mark.slow("writes hours of real pages in the old layout and migrates them")
def test_a_file_that_stored_every_counter_reading_keeps_one_copy_after_its_migration(tmp_path):
    """A warehouse written when `samples` held every reading, counters too (migrations up to 015):
    migration 016 drops the readings that increments give back exactly, keeping what the writer
    now keeps; `readings` gives back every row the file held, and the writer carries on as on a
    file it wrote itself."""
    new = duckdb.connect()
    apply_migrations(new)
    write_rounds(new, range(130))  # 10:00 .. 12:09: three clock hours
    old = written_before(new, COUNTERS_ONCE, str(tmp_path / "old.duckdb"))
    every = stored_readings(old, "samples")
    assert len(every) == new.execute("SELECT count(*) FROM readings").fetchall()[0][0]
    before = used_blocks(old, "samples")

    assert apply_migrations(old) == [
        "016_counters_stored_once.sql",
        "017_pool_histograms.sql",
        "018_compact_minute_rows.sql",
        "019_six_minute_rollups.sql",
        "020_users_within_tenants.sql",
        "021_non_streamed_ttft.sql",
        "022_undo_the_future.sql",
        "023_slo_minutes_by_tenant.sql",
        "024_compact_request_records.sql",
        "025_e2e_as_its_remainder.sql",
    ]
    assert by_key(old) == by_key(new)  # `samples` as the writer now stores it, nothing else touched
    assert stored_readings(old, "readings") == every
    stored = old.execute("SELECT count(*) FROM samples").fetchall()[0][0]
    assert stored < len(every) / 2
    assert used_blocks(old, "samples") < before

    write_rounds(new, range(130, 135))
    write_rounds(old, range(130, 135))
    assert by_key(old) == by_key(new)


def pool_rows(con: duckdb.DuckDBPyConnection) -> dict[str, pd.DataFrame]:
    """The pool rollups, one row per period, pool, sample name and bound (the writer may add a
    minute's sums in two rolls: readers sum them)."""
    return {
        t: con.execute(
            f"SELECT ts, role, metric, le, sum(delta) AS delta, sum(seconds) AS seconds, "
            f"sum(idle_seconds) AS idle_seconds FROM {t} GROUP BY ALL ORDER BY ALL"
        ).df()
        for t in ("pool_histograms_1m", "pool_histograms_1h")
    }


@pytest.mark.slow("writes hours of real pages in the layout before the pool roll-ups and now")
def test_a_file_from_before_the_pool_rollups_gets_those_the_writer_keeps(tmp_path):
    """A warehouse written before migration 017 (two real pages, 130 minutes): the migration fills
    the pool rollups from the per-series ones, and they hold what the writer's own hold, per minute
    (hour), pool, sample name and bound; the writer carries on over them."""
    new = duckdb.connect()
    apply_migrations(new)
    write_rounds(new, range(130))
    old = written_before(new, POOL_HISTOGRAMS, str(tmp_path / "old.duckdb"))
    assert apply_migrations(old) == [
        "017_pool_histograms.sql",
        "018_compact_minute_rows.sql",
        "019_six_minute_rollups.sql",
        "020_users_within_tenants.sql",
        "021_non_streamed_ttft.sql",
        "022_undo_the_future.sql",
        "023_slo_minutes_by_tenant.sql",
        "024_compact_request_records.sql",
        "025_e2e_as_its_remainder.sql",
    ]
    write_rounds(new, range(130, 135))
    write_rounds(old, range(130, 135))
    want, got = pool_rows(new), pool_rows(old)
    assert len(want["pool_histograms_1m"]) > 130 * 20 and len(want["pool_histograms_1h"]) > 3 * 20
    assert set(want["pool_histograms_1m"].role) == {"decode", "router"}
    for table, rows in want.items():
        assert got[table][["ts", "role", "metric", "le"]].equals(rows[["ts", "role", "metric", "le"]])
        for column in ("delta", "seconds", "idle_seconds"):
            assert got[table][column].to_numpy() == pytest.approx(rows[column].to_numpy(), rel=1e-12)
    assert by_key(old) == by_key(new)
    for con in (new, old):  # 10:00 compacted when 12:00 closed: a row per pool, sample name and bound
        n, distinct = con.execute(
            "SELECT count(*), count(DISTINCT (ts, role, metric, le)) FROM pool_histograms_1h WHERE ts < ?",
            [T0 + timedelta(hours=1)],
        ).fetchall()[0]
        assert n == distinct > 0


def minute_sums(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    """Per minute and series key, the minute rows' sums (what readers take of them)."""
    return con.execute(
        "SELECT x.ts, s.series_key, sum(delta), sum(seconds), sum(idle_seconds), sum(resets) "
        "FROM increments_1m x JOIN series s USING (series_id) GROUP BY ALL ORDER BY ALL"
    ).fetchall()


@pytest.mark.slow("writes 131 minutes of two real pages twice, then migrates one file")
def test_a_file_of_uncompacted_minutes_is_compacted_in_place_by_its_migration(monkeypatch, tmp_path):
    """A warehouse written before minute rows were compacted (migrations up to 017; two real pages,
    131 minutes scraped half a minute off the minute, so each minute's rows come in two rolls):
    migration 018 leaves what the writer now leaves, a row per series and minute of each closed
    hour, stored hour by hour and series by series, with every minute's sums; the writer carries
    on over it."""
    want = duckdb.connect()
    apply_migrations(want)
    write_rounds(want, range(131), offset=30)
    with monkeypatch.context() as m:
        m.setattr(rollup, "compact_minutes", lambda *a: None)  # the writer before minute compaction
        was = duckdb.connect()
        apply_migrations(was)
        write_rounds(was, range(131), offset=30)
    old = written_before(was, COMPACT_MINUTES, str(tmp_path / "old.duckdb"))
    count = "SELECT count(*), count(DISTINCT (ts, series_id)) FROM increments_1m WHERE ts < ?"
    closed = T0 + timedelta(hours=2)  # 12:10 closed 11:00 ten minutes ago; 12:00 still open
    rows, distinct = old.execute(count, [closed]).fetchall()[0]
    assert rows > 1.9 * distinct  # about two rows a minute
    sums, pools = minute_sums(old), pool_rows(old)

    assert apply_migrations(old) == [
        "018_compact_minute_rows.sql",
        "019_six_minute_rollups.sql",
        "020_users_within_tenants.sql",
        "021_non_streamed_ttft.sql",
        "022_undo_the_future.sql",
        "023_slo_minutes_by_tenant.sql",
        "024_compact_request_records.sql",
        "025_e2e_as_its_remainder.sql",
    ]
    assert old.execute(count, [closed]).fetchall() == [(distinct, distinct)]
    assert out_of_series_order(old) == 0
    got = minute_sums(old)
    assert [r[:2] for r in got] == [r[:2] for r in sums]
    assert [r[2:] for r in got] == [pytest.approx(r[2:], rel=1e-12) for r in sums]
    assert by_key(old) == by_key(want)  # as the writer now leaves them, row for row
    n, distinct = old.execute(
        "SELECT count(*), count(DISTINCT (ts, role, metric, le)) FROM pool_histograms_1m WHERE ts < ?", [closed]
    ).fetchall()[0]
    assert n == distinct > 0
    for table, rows in pool_rows(old).items():  # the pools' minutes, compacted, with the same sums
        assert rows[["ts", "role", "metric", "le"]].equals(pools[table][["ts", "role", "metric", "le"]])
        for column in ("delta", "seconds", "idle_seconds"):
            assert rows[column].to_numpy() == pytest.approx(pools[table][column].to_numpy(), rel=1e-12)

    write_rounds(want, range(131, 195), offset=30)
    write_rounds(old, range(131, 195), offset=30)  # 13:10 closes 12:00: the writer compacts its minutes
    assert by_key(old) == by_key(want)
    assert out_of_series_order(old) == 0


def six_minute_sums(con: duckdb.DuckDBPyConnection) -> dict[str, pd.DataFrame]:
    """Per six minutes and series key (pool, sample name and bound), the six-minute rows' sums."""
    return {
        "increments_6m": con.execute(
            "SELECT x.ts, s.series_key AS key, sum(delta) AS delta, sum(seconds) AS seconds, "
            "sum(idle_seconds) AS idle_seconds, sum(resets) AS resets "
            "FROM increments_6m x JOIN series s USING (series_id) GROUP BY ALL ORDER BY ALL"
        ).df(),
        "pool_histograms_6m": con.execute(
            "SELECT ts, (role, metric, le)::VARCHAR AS key, sum(delta) AS delta, sum(seconds) AS seconds, "
            "sum(idle_seconds) AS idle_seconds FROM pool_histograms_6m GROUP BY ALL ORDER BY ALL"
        ).df(),
    }


@pytest.mark.slow("writes hours of real pages in the layout before migration 019 and now")
def test_a_file_from_before_the_six_minute_rollups_gets_those_the_writer_keeps(tmp_path):
    """A warehouse written before migration 019 (two real pages, 131 minutes scraped half a minute
    off the minute): the migration fills the six-minute rollups from the minute rows, with the sums
    the writer's own hold per period and series (pool, sample name and bound), each closed hour's
    rows series by series; the read layer reads them, and the writer carries on over them."""
    new = duckdb.connect()
    apply_migrations(new)
    write_rounds(new, range(131), offset=30)
    old = written_before(new, SIX_MINUTES, str(tmp_path / "old.duckdb"))
    assert not Holdings.of(LocalQuery(old)).sixes

    assert apply_migrations(old) == [
        "019_six_minute_rollups.sql",
        "020_users_within_tenants.sql",
        "021_non_streamed_ttft.sql",
        "022_undo_the_future.sql",
        "023_slo_minutes_by_tenant.sql",
        "024_compact_request_records.sql",
        "025_e2e_as_its_remainder.sql",
    ]
    assert Holdings.of(LocalQuery(old)).sixes
    for rounds in (range(0), range(131, 195)):  # 13:10 closes 12:00: the writer compacts its six minutes
        write_rounds(new, rounds, offset=30)
        write_rounds(old, rounds, offset=30)
        want, got = six_minute_sums(new), six_minute_sums(old)
        assert len(want["increments_6m"]) > 20 * 100 and len(want["pool_histograms_6m"]) > 20 * 20
        for table, rows in want.items():
            assert got[table][["ts", "key"]].equals(rows[["ts", "key"]]), table
            for column in rows.columns[2:]:
                assert got[table][column].to_numpy() == pytest.approx(rows[column].to_numpy(), rel=1e-12), column
        closed = old.execute("SELECT max(ts) FROM increments_6m").fetchall()[0][0].replace(minute=0) - timedelta(
            hours=1
        )
        assert (
            out_of_order(old, "increments_6m", "(time_bucket(INTERVAL 1 HOUR, ts), series_id, ts)", f"ts < '{closed}'")
            == 0
        )
    assert by_key(old) == by_key(new)


def test_computed_columns_are_named_from_the_tables_own_create_statement() -> None:
    con = duckdb.connect()
    apply_migrations(con)
    assert computed_columns(con, "requests") == [
        *("e2e_us", "request_id", "started_at", "ttft_seconds", "itl_mean_seconds", "itl_max_seconds"),
        *("decode_tokens_per_second", "e2e_seconds"),
    ]
    assert computed_columns(con, "samples") == [] and computed_columns(con, "no_such_table") == []
    con.execute("""CREATE TABLE t (a INTEGER, "b c" TIMESTAMP WITH TIME ZONE GENERATED ALWAYS AS (now()), d INTEGER)""")
    assert computed_columns(con, "t") == ["b c"]
