"""Parquet export by day reconciles exactly with the warehouse, and reads back in DuckDB."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pytest

from collectors.parse import parse_page
from moemeter.cli import main
from moemeter.contract import TargetInfo
from moemeter.contract.requests import RequestRecord
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.export import ExportError, export_parquet
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.requests import RequestIngestor

T0 = datetime(2026, 11, 30, 23, 58, 0)  # two minutes before midnight: the export spans two days
TARGET = TargetInfo("decode-0", "http://x/metrics", "decode", 1)


def seed(path: str) -> None:
    con = duckdb.connect(path)
    apply_migrations(con)
    ing = Ingestor()
    for k in range(60):  # every 5 s for 5 minutes
        text = f'# TYPE a_total counter\na_total{{engine="0"}} {10 * k}\n# TYPE g gauge\ng {k % 3}\n'
        ing.write(con, ScrapeBatch(TARGET, T0 + timedelta(seconds=5 * k), True, 0.01, parse_page(text.encode())))
    epoch = (T0 - datetime(1970, 1, 1)).total_seconds()
    records = [
        {
            "seq": k + 1,
            **RequestRecord(
                f"r{k}", epoch + 30 * k, "u", "t", "m", "completions", False, 200, "ok", 10, 0, 5, e2e_seconds=1.0
            ).to_json(),
        }
        for k in range(8)
    ]
    RequestIngestor().write(
        con, "gateway", {"schema": "moemeter.requests/1", "log_id": "A", "records": records}, T0 + timedelta(minutes=5)
    )
    con.close()


def test_export_by_day_reads_back_exactly(tmp_path):
    db = str(tmp_path / "w.duckdb")
    seed(db)
    out = tmp_path / "parquet"
    with duckdb.connect(db, read_only=True) as con:
        done = export_parquet(LocalQuery(con), out, T0, T0 + timedelta(minutes=10), chunk=timedelta(minutes=1))
        want_samples = con.execute("SELECT count(*), sum(value) FROM samples").fetchall()[0]
        want_delta = con.execute("SELECT sum(delta) FROM increments").fetchall()[0][0]
    days = sorted({e.day.isoformat() for e in done if e.table == "samples"})
    assert days == ["2026-11-30", "2026-12-01"]
    reader = duckdb.connect()
    got = reader.execute(
        f"SELECT count(*), sum(value) FROM read_parquet('{out}/samples/*/*.parquet', hive_partitioning = true)"
    ).fetchall()[0]
    assert got == want_samples
    delta = reader.execute(f"SELECT sum(delta) FROM read_parquet('{out}/increments/*/*.parquet')").fetchall()[0][0]
    assert delta == want_delta == 590.0
    joined = reader.execute(f"""SELECT s.metric, count(*) FROM read_parquet('{out}/samples/*/*.parquet') x
                                JOIN read_parquet('{out}/series/all.parquet') s USING (series_id) GROUP BY 1 ORDER BY 1""").fetchall()
    assert joined == [("a_total", 2), ("g", 60)]  # a counter's stored readings: its first, and 00:00's
    # series go out named by their key, as the lake names them: what the file exported before its
    # series were renumbered (migration 015) joins what it exports after
    with duckdb.connect(db, read_only=True) as con:
        keys = con.execute("SELECT series_key, metric FROM series ORDER BY 1").fetchall()
    exported = reader.execute(f"SELECT series_id, metric FROM read_parquet('{out}/series/all.parquet') ORDER BY 1")
    assert exported.fetchall() == keys
    ids = reader.execute(f"SELECT DISTINCT series_id FROM read_parquet('{out}/increments/*/*.parquet')").fetchall()
    assert {i for (i,) in ids} <= {k for k, _ in keys}
    requests = reader.execute(f"""SELECT day, count(*) FROM read_parquet('{out}/requests/*/*.parquet',
                                  hive_partitioning = true) GROUP BY day ORDER BY day""").fetchall()
    assert [(str(d), n) for d, n in requests] == [("2026-11-30", 4), ("2026-12-01", 4)]  # by when they finished
    columns = reader.execute(
        f"DESCRIBE SELECT * FROM read_parquet('{out}/requests/*/*.parquet', hive_partitioning = false)"
    ).fetchall()
    assert [c[0] for c in columns] == RECORD_COLUMNS  # a record's own columns, as before migration 024
    assert {c[0]: c[1] for c in columns}["request_id"] == "VARCHAR"


RECORD_COLUMNS = [
    *("gateway", "seq", "request_id", "started_at", "finished_at", "ingested_at", "user_id", "tenant", "model"),
    *("endpoint", "stream", "status", "outcome", "prompt_tokens", "cached_prompt_tokens", "generated_tokens"),
    *("ttft_seconds", "itl_mean_seconds", "itl_max_seconds", "decode_tokens_per_second", "e2e_seconds"),
    *("usage_reported", "slo_ttft_seconds", "slo_itl_seconds"),
]


def test_export_errors(tmp_path, capsys):
    with pytest.raises(ExportError, match="unknown tables"):
        export_parquet(lambda s, p: None, tmp_path, T0, T0 + timedelta(hours=1), ("secrets",))  # type: ignore[arg-type,return-value]
    with pytest.raises(ExportError, match="empty window"):
        export_parquet(lambda s, p: None, tmp_path, T0, T0)  # type: ignore[arg-type,return-value]
    db = str(tmp_path / "w.duckdb")
    seed(db)
    assert (
        main(
            [
                "export",
                "--db",
                db,
                "--out",
                str(tmp_path / "o"),
                "--from",
                "2026-11-30T23:58:00",
                "--to",
                "2026-12-01T00:10:00",
                "--tables",
                "samples,series",
            ]
        )
        == 0
    )
    assert "2026-12-01" in capsys.readouterr().out
    assert (
        main(
            [
                "export",
                "--db",
                db,
                "--out",
                str(tmp_path / "o"),
                "--from",
                "2026-11-30T10:00",
                "--to",
                "2026-11-30T09:00",
            ]
        )
        == 2
    )


def test_racks_export_into_one_dataset(tmp_path, capsys):
    out = tmp_path / "fleet"
    for rack in ("nvl72-a", "nvl72-b"):
        db = str(tmp_path / f"{rack}.duckdb")
        seed(db)
        assert (
            main(
                [
                    "export",
                    "--db",
                    db,
                    "--out",
                    str(out),
                    "--rack",
                    rack,
                    "--from",
                    "2026-11-30T23:58:00",
                    "--to",
                    "2026-12-01T00:10:00",
                    "--tables",
                    "increments,series",
                ]
            )
            == 0
        )
    capsys.readouterr()
    reader = duckdb.connect()
    per_rack = reader.execute(f"""SELECT i.rack, s.metric, sum(i.delta)
        FROM read_parquet('{out}/increments/*/*/*.parquet', hive_partitioning = true) i
        JOIN read_parquet('{out}/series/*/all.parquet', hive_partitioning = true) s USING (rack, series_id)
        GROUP BY ALL ORDER BY ALL""").fetchall()
    assert per_rack == [("nvl72-a", "a_total", 590.0), ("nvl72-b", "a_total", 590.0)]
    assert (
        main(
            [
                "export",
                "--db",
                str(tmp_path / "nvl72-a.duckdb"),
                "--out",
                str(out),
                "--rack",
                "../etc",
                "--from",
                "2026-11-30T23:58:00",
                "--to",
                "2026-12-01T00:10:00",
            ]
        )
        == 2
    )
    assert "rack name" in capsys.readouterr().err
