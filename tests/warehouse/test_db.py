"""Migrations are numbered, recorded and idempotent; the writer survives a failed job."""

from __future__ import annotations

import struct

import duckdb
import pytest

from moemeter.cli import main
from warehouse.db import Warehouse, WarehouseError, apply_migrations, migrations


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
