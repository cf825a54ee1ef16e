"""The query API over HTTP: results, keep-alive, tokens. Hostile input: test_readonly.py."""

from __future__ import annotations

import logging
import os
import time

import httpx
import pytest

from warehouse.api import QueryClient, QueryRefused, QueryServer
from warehouse.db import Warehouse
from warehouse.readonly import QueryTooLarge


@pytest.fixture
def server(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.write(
        lambda con: con.execute(
            "INSERT INTO scrapes VALUES (TIMESTAMP '2026-11-30 10:00', 'a', true, 0.5, 7, 99, NULL)"
        )
    )
    srv = QueryServer(wh)
    srv.start()
    yield srv
    srv.shutdown()
    wh.close()


def test_over_http_select_returns_a_dataframe_and_params_bind(server):
    q = QueryClient(server.url)
    df = q("SELECT target, samples FROM scrapes WHERE ts >= ?::TIMESTAMP", ["2026-11-30T09:00:00"])
    assert df.to_dict("records") == [{"target": "a", "samples": 7}]


def test_over_http_writes_are_refused_and_nothing_changes(server):
    q = QueryClient(server.url)
    with pytest.raises(QueryRefused, match="only SELECT"):
        q("DELETE FROM scrapes")
    assert q("SELECT count(*) AS n FROM scrapes")["n"][0] == 1


def test_a_clients_queries_share_one_connection_and_a_refused_one_does_not_spoil_it(tmp_path):
    accepted = []

    class Counting(QueryServer):
        def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
            accepted.append(client_address)
            super().process_request(request, client_address)

    wh = Warehouse(tmp_path / "k.duckdb")
    srv = Counting(wh)
    srv.start()
    try:
        q = QueryClient(srv.url)
        assert [q("SELECT ? AS x", [i])["x"][0] for i in range(5)] == list(range(5))
        assert len(accepted) == 1  # keep-alive: one TCP connection for all five
        with pytest.raises(QueryRefused, match="only SELECT"):
            q("DELETE FROM scrapes")
        with pytest.raises(QueryTooLarge, match="the limit is 1,048,576"):  # refused before its body is read
            q("SELECT '" + "x" * 2_000_000 + "'")
        assert q("SELECT 7 AS x")["x"][0] == 7  # on a fresh connection: the refused ones were closed
        assert len(accepted) == 3
    finally:
        srv.shutdown()
        wh.close()


def test_a_connection_the_server_closed_when_idle_is_replaced(server, monkeypatch):
    from warehouse import api

    monkeypatch.setattr(api._Handler, "timeout", 0.2)  # the server drops idle connections after 0.2 s
    q = QueryClient(server.url)
    assert q("SELECT 1 AS x")["x"][0] == 1
    time.sleep(0.5)
    assert q("SELECT 2 AS x")["x"][0] == 2


def test_json_format_and_bad_requests(server):
    r = httpx.post(f"{server.url}/query", json={"sql": "SELECT 1.5 AS x, 'inf'::DOUBLE AS y", "format": "json"})
    assert r.json() == {"columns": ["x", "y"], "types": ["decimal128(2, 1)", "double"], "rows": [[1.5, "Infinity"]]}
    r = httpx.post(f"{server.url}/query", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "bad request" in r.json()["error"]
    r = httpx.post(f"{server.url}/query", json={"sql": "SELECT * FROM no_such_table"})
    assert r.status_code == 400 and "query failed" in r.json()["error"]
    health = httpx.get(f"{server.url}/health").json()
    assert health["ok"] and health["writer"]["ok"] and health["writer"]["failed_writes"] == 0


def test_health_says_what_the_process_holds_and_duckdbs_part_under_its_cap(tmp_path):
    """An SRE asks /health whether the monitor is the process near the OOM killer: its resident
    memory, DuckDB's part of it (which a statement's working memory raises) and DuckDB's cap."""
    wh = Warehouse(tmp_path / "m.duckdb", memory_limit="300MB")
    srv = QueryServer(wh)
    srv.start()
    try:
        before = httpx.get(f"{srv.url}/health").json()["memory"]
        with wh.cursor() as cur:  # a reader's temporary table of a million rows, held in DuckDB's blocks
            cur.execute(
                "CREATE TEMP TABLE held AS SELECT i % 1000000 AS k, count(*) AS n FROM range(3000000) r(i) GROUP BY k"
            )
            during = httpx.get(f"{srv.url}/health").json()["memory"]
        with open("/proc/self/statm") as statm:
            resident_mb = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
        wh._con.close()  # a database that cannot answer (as a full disk leaves it until reopened)
        unanswered = httpx.get(f"{srv.url}/health").json()["memory"]
    finally:
        srv.shutdown()
        wh.close()
    assert before["duckdb_cap_mb"] == 300 and before["duckdb_spilled_mb"] == 0
    assert during["duckdb_mb"] > before["duckdb_mb"] + 8  # the temporary table: 16 MB of keys and counts
    assert 0 < during["duckdb_mb"] < during["resident_mb"] <= resident_mb * 1.5
    assert unanswered["duckdb_mb"] is None and unanswered["resident_mb"] > 0


def test_beyond_loopback_the_api_needs_a_token_and_checks_it(tmp_path, monkeypatch, caplog):
    from warehouse.api import QueryServer

    wh = Warehouse(tmp_path / "t.duckdb")
    with pytest.raises(QueryRefused, match="needs a token"):
        QueryServer(wh, "0.0.0.0")
    secret = "s3cret-token-0123456789"
    srv = QueryServer(wh, "127.0.0.1", token=secret)
    srv.start()
    try:
        caplog.set_level(logging.DEBUG)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": secret}):
            assert httpx.get(f"{srv.url}/health", headers=headers).status_code == 401
            r = httpx.post(f"{srv.url}/query", json={"sql": "SELECT 1"}, headers=headers)
            assert r.status_code == 401 and "token" in r.json()["error"]
        monkeypatch.delenv("MOEMETER_API_TOKEN", raising=False)
        with pytest.raises(RuntimeError, match="missing or wrong token"):
            QueryClient(srv.url)("SELECT 1 AS x")
        monkeypatch.setenv("MOEMETER_API_TOKEN", secret)  # what the dashboard and the CLI send
        assert QueryClient(srv.url)("SELECT 1 AS x")["x"].tolist() == [1]
        assert secret not in repr(QueryClient(srv.url))
        assert all(secret not in r.getMessage() for r in caplog.records)
    finally:
        srv.shutdown()
        wh.close()


def test_serve_refuses_to_listen_beyond_loopback_without_a_token(tmp_path, monkeypatch, capsys):
    from moemeter.cli import main

    monkeypatch.delenv("MOEMETER_API_TOKEN", raising=False)
    targets = tmp_path / "t.json"
    targets.write_text("[]")
    args = ["serve", "--targets", str(targets), "--db", str(tmp_path / "w.duckdb"), "--api-host", "0.0.0.0"]
    assert main(args) != 0
    assert "needs a token" in capsys.readouterr().err
    (tmp_path / "short").write_text("abc\n")
    assert main([*args, "--api-token-file", str(tmp_path / "short")]) != 0
    assert "fewer than 16 characters" in capsys.readouterr().err
    monkeypatch.setenv("MOEMETER_API_TOKEN", "short-token")  # the environment follows the same minimum
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "MOEMETER_API_TOKEN holds fewer than 16 characters" in err and "short-token" not in err
    assert not (tmp_path / "w.duckdb").exists()  # refused before anything was opened
