"""The read layer and the query API under hostile input: no probe changes a stored row, every
probe gets a clear 4xx, runaway queries stop at their limit, and the writer keeps its rounds.

Every probe is checked for its effect: a checksum of every table, the catalog, the settings and
the sequences before and after, not only the status code.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from datetime import datetime, timedelta

import duckdb
import httpx
import pytest

from collectors.parse import parse_page
from moemeter.contract import TargetInfo
from warehouse import api as api_module
from warehouse import limits as limits_module
from warehouse.api import QueryClient, QueryServer, table_to_json
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch
from warehouse.limits import Limits
from warehouse.prices import default_sheet, store_sheet
from warehouse.readonly import (
    QueryRefused,
    QueryTimeout,
    QueryTooLarge,
    _run_guarded,
    check_read_only,
    run_read,
)

T0 = datetime(2026, 11, 30, 12, 0, 0)
TARGET = TargetInfo("decode-0", "http://127.0.0.1:1/metrics", "decode", 64, "test")


def snapshot(wh: Warehouse) -> dict[str, object]:
    """Every table's row count and content hash, the catalog, the settings and the sequences."""
    with wh.cursor() as cur:
        tables = [r[0] for r in cur.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        out: dict[str, object] = {
            t: cur.execute(f"SELECT count(*), sum(hash(x)::HUGEINT) FROM {t} x").fetchone() for t in tables
        }
        out["catalog"] = cur.execute("""SELECT database_name, schema_name, table_name FROM duckdb_tables()
                                        UNION ALL SELECT database_name, schema_name, view_name FROM duckdb_views()
                                        WHERE NOT internal ORDER BY ALL""").fetchall()
        out["macros"] = cur.execute(
            "SELECT function_name FROM duckdb_functions() WHERE NOT internal ORDER BY 1"
        ).fetchall()
        out["databases"] = cur.execute("SELECT database_name FROM duckdb_databases() ORDER BY 1").fetchall()
        out["settings"] = cur.execute("""SELECT name, value FROM duckdb_settings()
                                         WHERE name NOT IN ('profiling_output') ORDER BY 1""").fetchall()
        out["sequences"] = cur.execute("SELECT sequence_name, last_value FROM duckdb_sequences()").fetchall()
    return out


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, capture):
    """A warehouse file holding two recorded vLLM scrapes, the default price sheet and a sequence."""
    wh = Warehouse(tmp_path_factory.mktemp("ro") / "w.duckdb")
    ing = Ingestor()
    text = capture("vllm-0.32.0-cpu-tiny-deepseek.metrics.txt").encode()
    for i in range(2):
        batch = ScrapeBatch(TARGET, T0 + timedelta(seconds=5 * i), True, 0.01, parse_page(text))
        wh.write(lambda con, b=batch: ing.write(con, b))
    wh.write(lambda con: store_sheet(con, default_sheet(), T0))
    wh.write(lambda con: con.execute("CREATE SEQUENCE IF NOT EXISTS probe_seq"))
    yield wh
    wh.close()


@pytest.fixture(scope="module")
def server(warehouse):
    srv = QueryServer(warehouse, limits=Limits(timeout_seconds=2.0))
    srv.start()
    yield srv
    srv.shutdown()


# DuckDB 1.5's parser refuses a write inside a CTE itself, before either guard sees it (2.0 parses it)
PARSER_REFUSES = "A CTE needs a SELECT"
WRITES_IN_READS = [
    ("WITH x AS (DELETE FROM series RETURNING *) SELECT count(*) FROM x", "DELETE is not allowed"),
    ("WITH x AS (UPDATE targets SET gpus = 9999 RETURNING *) SELECT * FROM x", "UPDATE is not allowed"),
    ("WITH x AS (UPDATE increments SET delta = 0 RETURNING 1) SELECT count(*) FROM x", "UPDATE is not allowed"),
    (
        "WITH x AS (INSERT INTO scrapes SELECT * FROM scrapes RETURNING 1) SELECT count(*) FROM x",
        "INSERT is not allowed",
    ),
    ("WITH x AS (UPDATE gpu_prices SET usd_per_gpu_hour = 0 RETURNING 1) SELECT * FROM x", "UPDATE"),
    ("WITH x AS (DELETE FROM schema_migrations RETURNING 1) SELECT * FROM x", "DELETE"),
    ("SELECT * FROM (WITH x AS (DELETE FROM scrapes RETURNING *) SELECT * FROM x) s", "DELETE"),
    (
        "SELECT * FROM series JOIN (WITH d AS (DELETE FROM series RETURNING series_id) SELECT * FROM d) "
        "USING (series_id)",
        "DELETE",
    ),
    ("SELECT (WITH d AS (DELETE FROM scrapes RETURNING 1) SELECT count(*) FROM d) AS n", "DELETE"),
    ("SELECT 1 UNION ALL (WITH d AS (DELETE FROM scrapes RETURNING 1) SELECT 1 FROM d)", "DELETE"),
    (
        "SELECT * FROM series WHERE series_id IN (WITH d AS (DELETE FROM series RETURNING series_id) SELECT * FROM d)",
        "DELETE",
    ),
    (
        "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3), "
        "d AS (DELETE FROM scrapes RETURNING 1) SELECT * FROM r, d",
        "DELETE|DML",
    ),
    ("SELECT nextval('probe_seq')", "function nextval"),
    ("SELECT setseed(0.5)", "function setseed"),
    ("SELECT sleep_ms(60000)", "function sleep_ms"),
    ("SELECT write_log('x')", "function write_log"),
]
if duckdb.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = 'setval'").fetchone()[0]:
    WRITES_IN_READS.append(("SELECT setval('probe_seq', 100)", "function setval"))  # DuckDB 2.0's

TABLE_FUNCTIONS = [
    "SELECT * FROM query('DELETE FROM series')",
    "SELECT * FROM query('SELECT 1')",
    "SELECT * FROM query_table('series')",
    "SELECT * FROM read_blob('w.duckdb')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_parquet('/tmp/x.parquet')",
    "SELECT * FROM parquet_scan('/tmp/x.parquet')",
    "SELECT * FROM parquet_metadata('/tmp/x.parquet')",
    "SELECT * FROM read_json('/tmp/x.json')",
    "SELECT * FROM read_json_auto('/tmp/x.json')",
    "SELECT * FROM read_ndjson('/tmp/x.json')",
    "SELECT * FROM read_duckdb('/tmp/x.duckdb')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM sniff_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('https://127.0.0.1:9/x.parquet')",
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "SELECT * FROM truncate_duckdb_logs()",
    "SELECT * FROM enable_logging()",
    "SELECT * FROM enable_profiling()",
    "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM json_execute_serialized_sql('{}')",
    "SELECT * FROM pragma_storage_info('series')",
    "SELECT * FROM series, (SELECT * FROM query('SELECT 1')) q",
]

STATEMENTS = [
    "DELETE FROM series",
    "UPDATE targets SET gpus = 1",
    "INSERT INTO scrapes SELECT * FROM scrapes",
    "DROP TABLE series",
    "ALTER TABLE series ADD COLUMN x INT",
    "TRUNCATE series",
    "CREATE TABLE x (a INT)",
    "CREATE TEMP TABLE x AS SELECT 1",
    "CREATE TEMP VIEW v AS SELECT 1",
    "CREATE MACRO m(a) AS a",
    "CREATE TEMP MACRO m(a) AS a",
    "CREATE SEQUENCE s2",
    "CREATE SECRET (TYPE s3)",
    "EXPLAIN ANALYZE DELETE FROM series",
    "EXPLAIN ANALYZE WITH x AS (DELETE FROM series RETURNING 1) SELECT * FROM x",
    "EXPLAIN SELECT 1",
    "PRAGMA database_list",
    "PRAGMA threads = 1",
    "PRAGMA enable_profiling",
    "PRAGMA memory_limit = '10GB'",
    "SET threads = 1",
    "SET GLOBAL memory_limit = '100GB'",
    "SET SESSION threads TO 1",
    "RESET memory_limit",
    "SET VARIABLE x = 1",
    "RESET VARIABLE x",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "INSTALL httpfs",
    "FORCE INSTALL httpfs",
    "LOAD httpfs",
    "ATTACH ':memory:' AS m",
    "DETACH main",
    "USE memory",
    "COPY series TO '/tmp/moemeter-probe.csv'",
    "COPY series FROM '/etc/passwd'",
    "COPY (SELECT 1) TO '/tmp/moemeter-probe.csv'",
    "EXPORT DATABASE '/tmp/moemeter-probe'",
    "IMPORT DATABASE '/tmp/moemeter-probe'",
    "CHECKPOINT",
    "FORCE CHECKPOINT",
    "VACUUM",
    "ANALYZE",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "ABORT",
    "CALL checkpoint()",
    "CALL enable_logging()",
    "PIVOT series ON metric",
    "SELECT 1; DELETE FROM series",
    "SELECT 1 /* ; */; DELETE FROM series",
    "SELECT ';'; DELETE FROM series",
    "SELECT 1 -- x\n; DELETE FROM series",
    "SELECT $$;$$; DELETE FROM series",
    "SELECT 1;;DELETE FROM series",
    "/* SELECT */ DELETE FROM series",
    "-- SELECT\nDELETE FROM series",
    "SELEC 1",
    "",
]


def refused_over_http(server, sql: str, fmt: str = "arrow") -> httpx.Response:
    r = httpx.post(f"{server.url}/query", json={"sql": sql, "format": fmt}, timeout=30)
    assert 400 <= r.status_code < 500, (sql, r.status_code, r.text[:300])
    assert r.json()["error"], sql
    return r


@pytest.mark.parametrize("sql,match", WRITES_IN_READS, ids=range(len(WRITES_IN_READS)))
def test_a_write_inside_a_select_is_refused_and_changes_nothing(server, warehouse, sql, match):
    before = snapshot(warehouse)
    r = refused_over_http(server, sql)
    assert r.status_code == 400 and re.search(f"{match}|{PARSER_REFUSES}", r.json()["error"]), r.json()["error"]
    assert snapshot(warehouse) == before


@pytest.mark.parametrize("sql", TABLE_FUNCTIONS)
def test_table_functions_that_read_files_run_sql_or_change_state_are_refused(server, warehouse, sql):
    before = snapshot(warehouse)
    r = refused_over_http(server, sql)
    assert r.status_code == 400 and "is not allowed" in r.json()["error"]
    assert snapshot(warehouse) == before


@pytest.mark.parametrize("sql", STATEMENTS, ids=range(len(STATEMENTS)))
def test_every_other_statement_is_refused_and_changes_nothing(server, warehouse, sql):
    before = snapshot(warehouse)
    assert refused_over_http(server, sql).status_code == 400
    assert snapshot(warehouse) == before


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM body",
        "SELECT * FROM sql",
        "SELECT * FROM self",  # Python variables of the server's frames
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM 'w.duckdb'",
        "SELECT * FROM 'https://127.0.0.1:9/x.csv'",
    ],
)
def test_replacement_scans_of_files_and_python_objects_fail(server, warehouse, sql):
    before = snapshot(warehouse)
    assert refused_over_http(server, sql).status_code == 400
    assert snapshot(warehouse) == before


@pytest.mark.parametrize(
    "sql",
    [s for s, _ in WRITES_IN_READS if not re.search("sleep_ms|setseed|write_log", s)]
    + [
        "DELETE FROM series",
        "UPDATE targets SET gpus = 1",
        "INSERT INTO scrapes SELECT * FROM scrapes",
        "SELECT * FROM query('DELETE FROM series')",
    ],
)
def test_guard_one_alone_the_read_only_transaction_refuses_writes(warehouse, sql):
    """Without the parse-tree check, the read-only, rolled-back transaction stops every write."""
    before = snapshot(warehouse)
    # DuckDB itself refuses some shapes (DML nested below the top level) before the transaction does
    with (
        warehouse.cursor() as cur,
        pytest.raises(QueryRefused, match=f"read-only|data-modifying|DML|single SELECT|{PARSER_REFUSES}"),
    ):
        _run_guarded(cur, sql, None, Limits(), None)
    assert snapshot(warehouse) == before


@pytest.mark.parametrize("sql", [s for s, _ in WRITES_IN_READS] + TABLE_FUNCTIONS + [s for s in STATEMENTS if s])
def test_guard_two_alone_the_parse_tree_check_refuses_without_running(sql):
    with pytest.raises(QueryRefused):
        check_read_only(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "FROM series LIMIT 2",
        "SELECT metric, count(*) FROM series GROUP BY ALL",
        "WITH x AS (SELECT * FROM series) SELECT count(*) FROM x",
        "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT sum(n) FROM r",
        "SELECT * FROM range(3)",
        "SELECT * FROM generate_series(1, 3)",
        "SELECT unnest([1, 2])",
        "SELECT random() < 2, uuid() IS NOT NULL, now() IS NOT NULL",
        "SELECT * FROM duckdb_tables()",
        "SELECT * FROM information_schema.columns",
        "DESCRIBE series",
        "SHOW TABLES",
        "VALUES (1), (2)",
        "SELECT ? AS p",
    ],
)
def test_reads_pass(server, sql):
    params = [1] if "?" in sql else []
    r = httpx.post(f"{server.url}/query", json={"sql": sql, "params": params, "format": "json"}, timeout=30)
    assert r.status_code == 200, r.text


def test_runaway_queries_stop_at_the_limit_while_health_answers(server, warehouse):
    before = snapshot(warehouse)
    answers: dict[str, httpx.Response] = {}

    def runaway(name: str, sql: str) -> None:
        answers[name] = httpx.post(f"{server.url}/query", json={"sql": sql}, timeout=60)

    threads = [
        threading.Thread(target=runaway, args=(n, s))
        for n, s in [
            ("range", "SELECT sum(range) FROM range(10000000000)"),
            ("cross", "SELECT count(*) FROM range(100000000) a, range(100000000) b"),
            ("recursive", "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"),
        ]
    ]
    for t in threads:
        t.start()
    healths = []
    while any(t.is_alive() for t in threads):
        healths.append(httpx.get(f"{server.url}/health", timeout=10).json()["ok"])
    for t in threads:
        t.join()
    assert healths and all(healths)  # /health answered throughout
    for name, r in answers.items():
        assert r.status_code == 504, (name, r.text)
        assert "past the 2 s limit and was stopped" in r.json()["error"]
    assert snapshot(warehouse) == before


def test_a_query_whose_client_left_is_stopped(warehouse):
    srv = QueryServer(warehouse, limits=Limits(timeout_seconds=120))
    srv.start()
    try:
        body = json.dumps({"sql": "SELECT sum(range) FROM range(100000000000)"}).encode()
        host, port = srv.server_address[:2]
        sock = socket.create_connection((str(host), port))
        sock.sendall(
            b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        deadline = time.monotonic() + 30
        while srv.running == 0:
            assert time.monotonic() < deadline, "the query never started"
            time.sleep(0.05)
        sock.close()
        deadline = time.monotonic() + 30  # well inside the 120 s limit: only the departure can stop it
        while srv.running:
            assert time.monotonic() < deadline, "the query kept running after its client left"
            time.sleep(0.05)
    finally:
        srv.shutdown()


@pytest.mark.parametrize(
    "sql,match",
    [
        ("SELECT '" + "x" * 70_000 + "'", "the limit is 64,000"),
        (" UNION ALL ".join(["SELECT 1"] * 8000), "the limit is 64,000"),
        (" UNION ALL ".join(["SELECT 1"] * 300), "over 256 SELECTs"),
        ("SELECT count(*) FROM " + ", ".join(f"series s{i}" for i in range(200)), "over 64 tables"),
        ("SELECT * FROM " + "(SELECT * FROM " * 300 + "series" + ") x" * 300, "over 64 tables"),
        # DuckDB's parser gives up on these ("memory exhausted" in 1.5, "nested too deeply" or
        # "depth" in 2.0, which also refuses 400 nested calls and 3,000 parentheses)
        ("SELECT " + "abs(" * 12000 + "1" + ")" * 12000, "nested too deeply|memory exhausted"),
        ("SELECT " + "(" * 31000 + "1" + ")" * 31000, "depth|memory exhausted"),
        ("SELECT " + "+".join(["1"] * 5000), "depth"),
        ("SELECT [" + ",".join(["1"] * 15000) + "]", "over 20,000 nodes"),
    ],
)
def test_statements_too_costly_to_plan_are_refused_before_planning(server, sql, match):
    r = httpx.post(f"{server.url}/query", json={"sql": sql}, timeout=30)
    assert r.status_code in (400, 413), r.text[:300]
    assert re.search(match, r.json()["error"]), r.json()["error"]


def test_results_over_the_row_or_byte_limit_are_refused(warehouse):
    srv = QueryServer(warehouse, limits=Limits(max_result_rows=100_000, max_result_bytes=4 << 20))
    srv.start()
    try:
        for fmt in ("arrow", "json"):
            r = httpx.post(f"{srv.url}/query", json={"sql": "SELECT * FROM range(200000)", "format": fmt})
            assert r.status_code == 413 and "over 100,000 rows" in r.json()["error"]
            r = httpx.post(
                f"{srv.url}/query", json={"sql": "SELECT repeat('x', 1000) FROM range(50000)", "format": fmt}
            )
            assert r.status_code == 413 and "4 MiB" in r.json()["error"]
        r = httpx.post(
            f"{srv.url}/query", json={"sql": "SELECT repeat('é', 80) AS s FROM range(20000)", "format": "json"}
        )
        assert r.status_code == 413 and "JSON answer" in r.json()["error"]  # Arrow under, JSON over
        with pytest.raises(QueryTooLarge, match="add a LIMIT"):
            QueryClient(srv.url)("SELECT * FROM range(200000)")
        assert len(QueryClient(srv.url)("SELECT * FROM range(100000)")) == 100_000
    finally:
        srv.shutdown()


def test_past_the_concurrency_cap_a_query_gets_503_with_retry_after(warehouse, monkeypatch):
    monkeypatch.setattr(limits_module, "QUEUE_SECONDS", 0.2)
    srv = QueryServer(warehouse, limits=Limits(timeout_seconds=3), max_concurrent=1)
    srv.start()
    try:
        slow = threading.Thread(
            target=lambda: httpx.post(
                f"{srv.url}/query", json={"sql": "SELECT sum(range) FROM range(10000000000)"}, timeout=60
            )
        )
        slow.start()
        deadline = time.monotonic() + 30
        while srv.running == 0:
            assert time.monotonic() < deadline, "the slow query never started"
            time.sleep(0.05)
        r = httpx.post(f"{srv.url}/query", json={"sql": "SELECT 1"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "2" and "retry" in r.json()["error"]
        assert httpx.get(f"{srv.url}/health").json()["ok"]  # /health never queues
    finally:
        slow.join()
        srv.shutdown()


def test_the_writer_stores_every_round_while_readers_storm(warehouse):
    """Six clients keep runaway queries going while the writer stores 20 rounds: none is lost."""
    srv = QueryServer(warehouse, limits=Limits(timeout_seconds=1.0), max_concurrent=4)
    srv.start()
    stop = threading.Event()
    answers: list[int] = []

    def storm() -> None:
        with httpx.Client() as c:
            while not stop.is_set():
                answers.append(
                    c.post(
                        f"{srv.url}/query", timeout=60, json={"sql": "SELECT sum(range) FROM range(10000000000)"}
                    ).status_code
                )

    clients = [threading.Thread(target=storm) for _ in range(6)]
    for t in clients:
        t.start()
    try:
        with warehouse.cursor() as cur:
            before = cur.execute("SELECT count(*) FROM scrapes").fetchone()[0]
        deadline = time.monotonic() + 30
        while srv.running < 4:  # every slot taken by a runaway query before the first write
            assert time.monotonic() < deadline, "the storm never filled the query slots"
            time.sleep(0.01)
        for i in range(20):
            ts = T0 + timedelta(hours=1, seconds=i)
            warehouse.write_stored(
                lambda con, ts=ts: con.execute("INSERT INTO scrapes VALUES (?, 'storm', true, 0.01, 1, 1, NULL)", [ts]),
                f"round {i}",
            )
    finally:
        stop.set()
        for t in clients:
            t.join()
        srv.shutdown()
    with warehouse.cursor() as cur:
        assert cur.execute("SELECT count(*) FROM scrapes").fetchone()[0] == before + 20
    assert answers and set(answers) <= {504, 503}
    warehouse.write(lambda con: con.execute("DELETE FROM scrapes WHERE target = 'storm'"))


def raw(server, data: bytes) -> bytes:
    """Send bytes as they are; the whole answer (the server closes after an error)."""
    host, port = server.server_address[:2]
    with socket.create_connection((str(host), port), timeout=30) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize(
    "request_bytes,status",
    [
        (b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}", b"400"),
        (b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}", b"400"),
        (b"POST /query HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"411"),
        (b"POST /query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b"411"),
        (b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", b"413"),
        (b'POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\n{"sql": "\xff\xfe"}', b"400"),
        (b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n[]", b"400"),
        (b'POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n{"sql": [1, 2]}', b"400"),
        (
            b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 200001\r\n\r\n"
            + b"[" * 100_000
            + b"1"
            + b"]" * 100_000,
            b"400",
        ),
        (b"GARBAGE\r\n\r\n", b"400"),
    ],
)
def test_malformed_http_gets_a_4xx_never_a_dropped_connection(server, warehouse, request_bytes, status):
    before = snapshot(warehouse)
    answer = raw(server, request_bytes)
    assert answer.split(b" ")[1] == status, answer[:300]
    assert snapshot(warehouse) == before


def test_a_body_that_does_not_arrive_in_time_gets_408_and_others_are_served(server, monkeypatch):
    monkeypatch.setattr(api_module, "BODY_SECONDS", 0.5)
    host, port = server.server_address[:2]
    with socket.create_connection((str(host), port), timeout=30) as slow:
        slow.sendall(b'POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"sql":')
        assert QueryClient(server.url)("SELECT 5 AS x")["x"][0] == 5  # served meanwhile
        answer = slow.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


TYPES = {  # every DuckDB type a reader may select, and its JSON form
    "BOOLEAN": ("true", True),
    "TINYINT": ("-3::TINYINT", -3),
    "UBIGINT": ("18446744073709551615::UBIGINT", 18446744073709551615),
    "HUGEINT": ("170141183460469231731687303715884105727::HUGEINT", 1.7014118346046923e38),
    "DOUBLE nan": ("'nan'::DOUBLE", None),
    "DOUBLE inf": ("'-inf'::DOUBLE", "-Infinity"),
    "DECIMAL": ("1.25::DECIMAL(5,2)", 1.25),
    "VARCHAR": ("'héllo'", "héllo"),
    "BLOB": ("'\\xAA\\xFF'::BLOB", "qv8="),
    "DATE": ("DATE '2026-12-01'", "2026-12-01"),
    "DATE infinity": ("'infinity'::DATE", None),
    "TIME": ("TIME '12:34:56.5'", "12:34:56.500000"),
    "TIMETZ": ("'12:00:00+02'::TIMETZ", None),
    "TIMESTAMP": ("TIMESTAMP '2026-12-01 10:00:00'", "2026-12-01T10:00:00"),
    "TIMESTAMP_NS": ("'2026-12-01 10:00:00.123456789'::TIMESTAMP_NS", None),
    "TIMESTAMPTZ": ("'2026-12-01 10:00:00+00'::TIMESTAMPTZ", None),
    "INTERVAL": ("INTERVAL '1 month 2 days 3 seconds'", {"months": 1, "days": 2, "nanoseconds": 3_000_000_000}),
    "UUID": ("'00000000-0000-0000-0000-000000000001'::UUID", "00000000-0000-0000-0000-000000000001"),
    "LIST nan": ("[1.5, 'nan'::DOUBLE, 'inf'::DOUBLE]", [1.5, None, "Infinity"]),
    "LIST ts": ("[TIMESTAMP '2026-12-01 10:00:00']", ["2026-12-01T10:00:00"]),
    "LIST decimal": ("[1.5::DECIMAL(4,1)]", [1.5]),
    "STRUCT": (
        "{'a': TIMESTAMP '2026-12-01 10:00:00', 'b': 'x'::BLOB, 'c': 2.5::DECIMAL(3,1)}",
        {"a": "2026-12-01T10:00:00", "b": "eA==", "c": 2.5},
    ),
    "MAP": ("MAP {'k': 1}", [["k", 1]]),
    "ARRAY": ("[1, 2, 3]::INTEGER[3]", [1, 2, 3]),
    "ENUM": ("'a'::ENUM('a', 'b')", "a"),
    "UNION": ("union_value(n := 5)", 5),
    "BIT": ("'0101'::BIT", None),
    "BIGNUM": ("'123456789012345678901234567890'::BIGNUM", None),
    "NULL": ("NULL", None),
}


@pytest.mark.parametrize("name", list(TYPES))
def test_every_type_answers_in_both_formats(server, name):
    literal, expected = TYPES[name]
    for fmt in ("arrow", "json"):
        r = httpx.post(f"{server.url}/query", json={"sql": f"SELECT {literal} AS v", "format": fmt})
        assert r.status_code in (200, 400), (fmt, r.status_code, r.text[:300])
        if r.status_code == 400:  # a type Arrow cannot carry: a clear refusal, never a dropped connection
            assert "cannot be sent" in r.json()["error"] or "query failed" in r.json()["error"]
            continue
        if fmt == "json":
            value = r.json()["rows"][0][0]
            if expected is not None or name == "NULL" or name.startswith("DOUBLE"):
                assert value == expected, (name, value)
            else:
                assert isinstance(value, str) and value, (name, value)  # text of its own
    json.loads(json.dumps(r.json()), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))


def test_duplicate_column_names_keep_every_value(server):
    r = httpx.post(f"{server.url}/query", json={"sql": "SELECT 1 AS a, 2 AS a, 3 AS b", "format": "json"})
    assert r.json()["columns"] == ["a", "a", "b"] and r.json()["rows"] == [[1, 2, 3]]
    df = QueryClient(server.url)("SELECT 1 AS a, 2 AS a")
    assert df.values.tolist() == [[1, 2]]


def test_table_to_json_covers_duckdbs_own_list_of_types(warehouse):
    """DuckDB's test_all_types() (every type at its minimum, maximum and NULL) converts whole;
    called here on a cursor of the test's own, since readers may not call test functions."""
    with warehouse.cursor() as cur:
        tbl = cur.sql("SELECT * FROM test_all_types()").to_arrow_table()
    out = table_to_json(tbl)
    assert len(out["rows"]) == 3 and len(out["columns"]) == tbl.num_columns
    json.loads(json.dumps(out, allow_nan=False))


def test_local_reads_go_through_the_same_layer(warehouse):
    before = snapshot(warehouse)
    with warehouse.cursor() as cur:
        with pytest.raises(QueryRefused, match=f"DELETE is not allowed|{PARSER_REFUSES}"):
            run_read(cur, WRITES_IN_READS[0][0])
        with pytest.raises(QueryTimeout, match="0.5 s limit"):
            run_read(cur, "SELECT sum(range) FROM range(10000000000)", limits=Limits(timeout_seconds=0.5))
        assert run_read(cur, "SELECT 41 + 1 AS x").to_pylist() == [{"x": 42}]
    assert snapshot(warehouse) == before
