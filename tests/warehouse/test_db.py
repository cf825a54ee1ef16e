"""Migrations are numbered, recorded and idempotent; the writer survives a failed job."""

from __future__ import annotations

import duckdb
import pytest

from warehouse.db import Warehouse, apply_migrations, migrations


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


@pytest.mark.parametrize("bad", ["lots", "4", "-1GB", "1GB; DROP TABLE samples", "50%"])
def test_a_bad_memory_limit_is_refused_before_the_file_is_touched(tmp_path, bad):
    from warehouse.db import WarehouseError

    with pytest.raises(WarehouseError, match="give a size such as"):
        Warehouse(tmp_path / "m.duckdb", memory_limit=bad)
    assert not (tmp_path / "m.duckdb").exists()
