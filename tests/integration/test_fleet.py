"""Two racks publish into one DuckLake on a real PostgreSQL at once, each through its own
`moemeter serve --lake`: twins of two profiles and seeds, their history fast-forwarded through the
ingest path. One publisher is killed with SIGKILL in the middle of its backlog and started again.
The lake then holds each rack's rows once (counted per minute and per series), answers each rack's
cost report as the rack's own file does, to the cent, and the fleet's as their sum."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta

import duckdb
import httpx
import pytest

from moemeter.cli import main
from stack.ready import scaled, wait_http
from tests.e2e.test_browser import free_port
from tests.postgres import running_postgres
from warehouse.lake import LakeError, open_reader

pytestmark = pytest.mark.integration
RACKS = {"rack-a": ("deepseek-v4.1-flash", "1"), "rack-b": ("deepseek-v4-flash", "2")}
HISTORY = "6m"


@pytest.fixture(scope="module")
def racks(tmp_path_factory):
    """rack -> its warehouse file, each with HISTORY of its twin at a 15 s interval, written at once."""
    tmp = tmp_path_factory.mktemp("fleet")
    files = {rack: tmp / f"{rack}.duckdb" for rack in RACKS}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "moemeter.cli", "twin", "--profile", profile, "--seed", seed]
            + ["--fast-forward", HISTORY, "--interval", "15", "--tick", "1", "--db", str(files[rack])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rack, (profile, seed) in RACKS.items()
    ]
    for r in runs:
        _, err = r.communicate(timeout=scaled(600))
        assert r.returncode == 0, err[-2000:]
    # serve goes on collecting from a target that is down (its rollups keep closing minutes)
    (tmp / "targets.json").write_text(
        json.dumps([{"name": "probe", "url": f"http://127.0.0.1:{free_port()}/metrics", "role": "router", "gpus": 0}])
    )
    return tmp, files


def serve(tmp, db, rack: str, uri: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "moemeter.cli", "serve", "--targets", str(tmp / "targets.json"), "--db", str(db)]
    argv += ["--api-port", str(port), "--lake", uri, "--lake-data", str(tmp / "lake"), "--rack", rack]
    argv += ["--publish-every", "0.2", "--chunk-minutes", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{rack}.log", "a"))  # noqa: SIM115
    return proc, f"http://127.0.0.1:{port}"


def watermark(uri: str, rack: str) -> datetime | None:
    """The rack's minute watermark in the lake; None before it published (or before any rack made
    the lake: a reader never creates one)."""
    try:
        reader = open_reader(uri)
    except LakeError as exc:
        if "creating a new DuckLake is explicitly disabled" in str(exc):
            return None
        raise
    with reader as con:
        if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'lake_state'").fetchone()[0]:
            return None
        row = con.execute("SELECT through FROM lake.lake_state WHERE rack = ? AND name = '1m'", [rack]).fetchone()
    return row[0] if row else None


def until(what: str, done, within: float, procs: list[subprocess.Popen]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not done():
        for p in procs:
            assert p.poll() is None, f"a publisher exited with {p.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"{what} not within {within:g} s"
        time.sleep(0.1)


def ended(db) -> datetime:
    """The minute after the fast-forward's last scrape: once the lake holds it, the history is in."""
    with duckdb.connect(str(db), read_only=True) as con:
        last = con.execute("SELECT max(ts) FROM scrapes").fetchone()[0]
    return last.replace(second=0, microsecond=0) + timedelta(minutes=1)


def per_minute_and_series(con, table: str, where: str, params: list) -> list[tuple]:
    """Rows per minute and series, the series by its key (the lake's id for it, the file's own
    id being a number of that file's)."""
    return con.execute(
        f"SELECT x.ts, s.series_key, count(*), sum({'x.delta' if table.startswith('increments') else 'x.value'}) "
        f"FROM {table} x JOIN series s USING (series_id) WHERE x.{where} GROUP BY ALL ORDER BY ALL",
        params,
    ).fetchall()


def test_two_racks_publish_at_once_and_a_killed_publisher_loses_and_duplicates_nothing(racks, capsys):
    tmp, files = racks
    history_in = {rack: ended(db) for rack, db in files.items()}
    with running_postgres() as database:
        uri = database("fleet")
        procs = {rack: serve(tmp, db, rack, uri) for rack, db in files.items()}
        try:
            for _, api in procs.values():
                wait_http(api + "/health", scaled(60))
            alive = [p for p, _ in procs.values()]
            until("rack-a's first step", lambda: watermark(uri, "rack-a") is not None, scaled(120), alive)
            procs["rack-a"][0].send_signal(signal.SIGKILL)  # in the middle of its backlog, a minute a step
            procs["rack-a"][0].wait(30)
            killed_at = watermark(uri, "rack-a")
            assert killed_at is not None and killed_at < history_in["rack-a"], "rack-a published all before the kill"
            procs["rack-a"] = serve(tmp, files["rack-a"], "rack-a", uri)
            for rack in RACKS:
                until(
                    f"{rack}'s history in the lake",
                    lambda r=rack: (watermark(uri, r) or datetime.min) >= history_in[r],
                    scaled(240),
                    [p for p, _ in procs.values()],
                )
            for rack, (_, api) in procs.items():  # what an SRE sees of the publishing

                def published(r: str = rack, url: str = api) -> bool:
                    health = httpx.get(url + "/health", timeout=10).json()["lake"]
                    assert health["rack"] == r and health["error"] == "", health
                    return health["through"] != "" and datetime.fromisoformat(health["through"]) >= history_in[r]

                until(
                    f"{rack}'s /health to say its history is in", published, scaled(30), [p for p, _ in procs.values()]
                )
        finally:
            for p, _ in procs.values():
                p.send_signal(signal.SIGTERM)
            for p, _ in procs.values():
                p.wait(30)
        log = (tmp / "rack-a.log").read_text()
        assert "Traceback" not in log, log[-3000:]
        check_the_lake(uri, tmp, files, capsys)


def check_the_lake(uri: str, tmp, files, capsys) -> None:  # type: ignore[no-untyped-def]
    settled = {}
    for rack, db in files.items():
        through = watermark(uri, rack)
        assert through is not None
        settled[rack] = through - timedelta(minutes=1)  # its last minute may still take an interval's tail
        with duckdb.connect(str(db), read_only=True) as local, open_reader(uri, rack) as lake:
            for table in ("increments_1m", "samples_1m"):
                mine = per_minute_and_series(local, table, "ts < ?", [settled[rack]])
                theirs = per_minute_and_series(lake, table, "ts < ?", [settled[rack]])
                assert len(mine) > 1000 and theirs == mine, f"{rack} {table}: {len(theirs)} vs {len(mine)} rows"
            for table, cut in (("scrapes", "ts < ?"), ("expert_placement", "ts < ?"), ("series", "TRUE")):
                params = [through] if "?" in cut else []
                some = "* EXCLUDE (series_id)" if table == "series" else "*"
                mine = local.execute(f"SELECT {some} FROM {table} WHERE {cut} ORDER BY ALL", params).fetchall()
                theirs = lake.execute(f"SELECT {some} FROM {table} WHERE {cut} ORDER BY ALL", params).fetchall()
                assert theirs == mine, f"{rack} {table}: {len(theirs)} vs {len(mine)} rows"
            pools = local.execute("SELECT name, role, gpus FROM targets WHERE role IN ('prefill', 'decode')").fetchall()
        (tmp / f"{rack}-pools.json").write_text(
            json.dumps([{"name": n, "url": f"http://{n}/metrics", "role": r, "gpus": g} for n, r, g in pools])
        )
    # one window for every report: whole minutes every rack has, before what may still change
    with_all = max(first_scrape(db) for db in files.values()).replace(second=0) + timedelta(minutes=1)
    window = ["--from", with_all.isoformat(), "--to", min(settled.values()).isoformat(), "--json"]
    own = {}
    for rack, db in files.items():
        capsys.readouterr()
        argv = ["report", "cost", *window, "--db", str(db), "--targets", str(tmp / f"{rack}-pools.json")]
        assert main(argv) == 0
        own[rack] = json.loads(capsys.readouterr().out)
        assert main(["report", "cost", *window, "--lake", uri, "--rack", rack]) == 0
        from_lake = json.loads(capsys.readouterr().out)
        assert (from_lake["pools"], from_lake["total"]) == (own[rack]["pools"], own[rack]["total"]), rack
        assert own[rack]["total"]["cost_usd"] > 0
    assert main(["report", "cost", *window, "--lake", uri]) == 0
    fleet = json.loads(capsys.readouterr().out)
    assert sorted(fleet["racks"]) == sorted(RACKS)
    assert fleet["fleet"]["cost_usd"] == round(sum(r["total"]["cost_usd"] for r in own.values()), 2)
    assert fleet["fleet"]["generated_tokens"] == sum(r["pools"]["decode"]["generated_tokens"] for r in own.values())


def first_scrape(db) -> datetime:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT min(ts) FROM scrapes").fetchone()[0]
