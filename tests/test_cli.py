"""The moemeter command: help everywhere, offline ingest and query, clear errors (exit 2)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from moemeter.cli import main

ROOT = Path(__file__).parents[1]

FIXTURES = Path(__file__).parent / "fixtures"
SUBCOMMANDS = [
    "up",
    "serve",
    "dashboard",
    "twin",
    "ingest",
    "query",
    "export",
    "pull",
    "publish",
    "lake",
    "lake setup",
    "lake owners",
    "lake assign",
    "lake tidy",
    "eplb",
    "eplb plan",
    "eplb rules",
    "rules",
    "slo",
    "slo load",
    "report",
    "report slo",
    "gateway",
    "loadgen",
    "launch",
    "localstack",
]


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_help(sub):
    out = subprocess.run([sys.executable, "-m", "moemeter", *sub.split(), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: moemeter" in out.stdout


def test_help_loads_no_command_s_dependencies():
    """A command's options are declared when it is used (moemeter/cli/common.py, Command): `moemeter
    --help` loads neither DuckDB, pandas, numpy nor the gateway, so it answers at once."""
    code = (
        "import sys\nfrom moemeter.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('duckdb', 'pandas', 'numpy', 'aiohttp', 'httpx', 'warehouse', 'collectors', 'stack', 'dashboard')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"


def test_ingest_then_query_a_real_capture(tmp_path, capsys):
    db = str(tmp_path / "w.duckdb")
    for at in ("2026-11-30T10:00:00Z", "2026-11-30T10:00:05Z"):
        assert (
            main(
                [
                    "ingest",
                    "--file",
                    str(FIXTURES / "vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt"),
                    "--target",
                    "decode-0",
                    "--at",
                    at,
                    "--db",
                    db,
                    "--role",
                    "decode",
                    "--gpus",
                    "1",
                ]
            )
            == 0
        )
    capsys.readouterr()
    assert (
        main(
            [
                "query",
                "--db",
                db,
                "--json",
                "SELECT s.metric, x.value FROM readings x JOIN series s USING (series_id) "
                "WHERE s.metric = 'vllm:generation_tokens_total' ORDER BY x.ts",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{"metric": "vllm:generation_tokens_total", "value": 96.0}] * 2
    assert main(["query", "--db", db, "SELECT count(*) AS scrapes FROM scrapes"]) == 0
    assert "2" in capsys.readouterr().out


def test_query_refuses_anything_but_select(tmp_path, capsys):
    db = str(tmp_path / "w.duckdb")
    main(
        [
            "ingest",
            "--file",
            str(FIXTURES / "vllm-router-0.1.17-pd.metrics.txt"),
            "--target",
            "router",
            "--at",
            "2026-11-30T10:00:00",
            "--db",
            db,
            "--role",
            "router",
        ]
    )
    assert main(["query", "--db", db, "SELECT count(*) AS n FROM samples"]) == 0
    rows = int(capsys.readouterr().out.split()[-1])
    assert rows > 70
    assert main(["query", "--db", db, "DELETE FROM samples"]) == 2
    assert "only SELECT statements are allowed" in capsys.readouterr().err
    assert main(["query", "--db", db, "WITH x AS (DELETE FROM samples RETURNING *) SELECT count(*) FROM x"]) == 2
    assert re.search(
        "DELETE is not allowed|A CTE needs a SELECT", capsys.readouterr().err
    )  # ours, or DuckDB 1.5's parser
    assert main(["query", "--db", db, "SELECT count(*) AS n FROM samples"]) == 0
    assert int(capsys.readouterr().out.split()[-1]) == rows


def test_query_through_an_api_that_is_down_is_one_line_not_a_traceback(capsys):
    from tests.e2e.test_browser import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for argv in (
        ["query", "--api", url, "SELECT 1"],
        [
            "export",
            "--api",
            url,
            "--out",
            "/nonexistent",
            "--from",
            "2026-11-30T10:00:00",
            "--to",
            "2026-11-30T11:00:00",
            "--tables",
            "scrapes",
        ],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"the query API at {url} does not answer" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1, err


def test_bad_inputs_exit_2_with_the_reason_and_store_nothing(tmp_path, capsys):
    db = str(tmp_path / "w.duckdb")
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("<html>oops</html>\n")
    assert main(["ingest", "--file", str(garbage), "--target", "x", "--at", "2026-11-30T10:00:00", "--db", db]) == 2
    assert "parse error" in capsys.readouterr().err
    assert not Path(db).exists()
    assert main(["ingest", "--file", str(garbage), "--target", "x", "--at", "yesterday", "--db", db]) == 2
    assert main(["query", "--db", str(tmp_path / "none.duckdb"), "SELECT 1"]) == 2
    assert main(["twin", "--profile", "no-such-profile"]) == 2
    assert "available:" in capsys.readouterr().err
    assert main(["twin", "--fast-forward", "10s", "--db", db, "--memory-limit", "lots"]) == 2
    assert "memory limit 'lots': give a size such as 512MB" in capsys.readouterr().err
    assert not Path(db).exists()


def test_fast_forward_writes_history_through_the_ingest_path(tmp_path, capsys):
    db = str(tmp_path / "h.duckdb")
    assert main(["twin", "--fast-forward", "30s", "--db", db, "--seed", "3"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["samples"] > 7 * 39_000
    assert summary["db_megabytes"] > 0 and summary["peak_rss_megabytes"] > 0 and summary["twin_peak_rss_megabytes"] > 0
    assert "fast-forward: 0.5 min of 0.5 min written (100%)" in err  # progress, on stderr
    assert (
        main(
            ["query", "--db", db, "--json", "SELECT count(DISTINCT ts) AS n, count(DISTINCT target) AS t FROM scrapes"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == [{"n": 7, "t": 25}]
    # the gateway's request records came along, each once, all finished within the window
    sql = "SELECT count(*) AS n, count(DISTINCT request_id) AS d, max(ingested_at) >= max(finished_at) AS ok FROM requests"
    assert main(["query", "--db", db, "--json", sql]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["n"] == row["d"] > 10_000 and row["ok"]
    # and the decode instance's expert snapshot of the first round (one a minute), through the collector's store
    assert (
        main(["query", "--db", db, "--json", "SELECT target, count(*) AS n FROM expert_snapshots GROUP BY target"]) == 0
    )
    assert json.loads(capsys.readouterr().out) == [{"target": "decode-0", "n": 1}]


def test_eplb_plan_prints_the_vllm_placement_as_json(tmp_path, capsys):
    src = FIXTURES / "eplb" / "vllm-default-policy-vector.json"
    assert main(["eplb", "plan", "--input", str(src), "--policy", "vllm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["phy2log"] == json.loads(src.read_text())["phy2log"]
    assert len(out["rank_load"]) == 2 and len(out["rank_load"][0]) == 8
    assert all(0 < b <= 1 for b in out["balancedness"])
    assert main(["eplb", "plan", "--input", str(src), "--policy", "refined"]) == 0
    assert "max rank load" in capsys.readouterr().out


def test_eplb_plan_refuses_bad_input_with_the_constraint(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps({"weight": [[1, 2, 3]], "num_replicas": 4, "num_groups": 2, "num_nodes": 1, "num_gpus": 2})
    )
    assert main(["eplb", "plan", "--input", str(bad), "--json"]) == 2
    assert "do not divide into num_groups=2" in capsys.readouterr().err
    bad.write_text("{")
    assert main(["eplb", "plan", "--input", str(bad)]) == 2


def test_eplb_rules_file_passes_promtool(tmp_path, capsys):
    out = tmp_path / "rules.yml"
    assert main(["eplb", "rules", "--out", str(out)]) == 0
    assert "EPLBRankHot" in out.read_text()
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian's prometheus package, installed by make test) is not here")
    check = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 3 rules found" in check.stdout


@pytest.mark.integration
def test_loadgen_through_the_gateway_to_the_twin(tmp_path, capsys):
    """The commands a user runs: the twin as upstream, the gateway, the load generator."""
    import httpx

    from tests.e2e.test_browser import free_port, wait_http

    up, gw = free_port(), free_port()
    twin = subprocess.Popen(
        [sys.executable, "-m", "moemeter", "twin", "--openai-port", str(up)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    gate = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "gateway",
            "--upstream",
            f"http://127.0.0.1:{up}",
            "--port",
            str(gw),
            "--records",
            str(tmp_path / "gw.sqlite"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{up}/v1/models", 30, twin)
        wait_http(f"http://127.0.0.1:{gw}/health", 30, gate)
        out = tmp_path / "requests.jsonl"
        assert (
            main(
                [
                    "loadgen",
                    "--url",
                    f"http://127.0.0.1:{gw}",
                    "--sessions",
                    "4",
                    "--users",
                    "3",
                    "--think-seconds",
                    "0",
                    "--answer-tokens",
                    "8",
                    "--json",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        summary = json.loads(capsys.readouterr().out)
        sent = [json.loads(line) for line in out.read_text().splitlines()]
        assert summary["requests"] == len(sent) == summary["ok"] > 0
        assert summary["per_user_tokens_per_second_p90"] > 0  # how fast is the machine's business: make bench

        deadline = time.monotonic() + 30  # the log writer stores in batches: wait for all, with a deadline
        while True:
            feed = httpx.get(f"http://127.0.0.1:{gw}/moemeter/requests", params={"limit": 1000}).json()
            if len(feed["records"]) >= len(sent) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sorted(r["request_id"] for r in feed["records"]) == sorted(r["request_id"] for r in sent)
    finally:
        for p in (gate, twin):
            p.terminate()
            p.wait(10)
    assert gate.returncode == 0


def test_gateway_refuses_bad_setup(tmp_path, capsys):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"require_key": True, "keys": [{"sha256": "sk-in-clear", "tenant": "acme"}]}))
    assert main(["gateway", "--upstream", "http://127.0.0.1:1", "--keys", str(keys)]) == 2
    assert "a hash, not the key" in capsys.readouterr().err
    assert main(["gateway"]) == 2
    assert "--upstream URL is required" in capsys.readouterr().err
    assert main(["gateway", "--upstream", "http://127.0.0.1:1", "--host", "0.0.0.0"]) == 2
    assert "give --admin-port too" in capsys.readouterr().err
    assert main(["loadgen", "--url", "http://127.0.0.1:1", "--users", "0"]) == 2


@pytest.mark.parametrize("days", ["0", "-1", "nan"])
def test_gateway_refuses_a_log_kept_for_no_time_and_drops_nothing(tmp_path, capsys, days):
    from moemeter.contract.requests import RequestRecord
    from stack.gateway.records import RecordLog

    log = RecordLog(tmp_path / "gw.sqlite")
    log.append(RequestRecord("r1", time.time() - 3600, "u", "anonymous", "m", "completions", False, 200, "ok"))
    log.close()
    argv = ["gateway", "--upstream", "http://127.0.0.1:1", "--port", "1", "--records", str(log.path)]
    for flag, unit in (("--keep-days", "days"), ("--timeout", "seconds")):
        with pytest.raises(SystemExit) as refused:
            main([*argv, flag, days])
        assert refused.value.code == 2
        assert f"argument {flag}: {unit} from 0.001 to " in capsys.readouterr().err
    assert [r["request_id"] for r in log.page(0, 10)["records"]] == ["r1"]  # type: ignore[index, union-attr]


HOSTILE_FLAGS = [  # the flag refused last; what each did before
    ["serve", "--keep-hour-days", "-1"],  # dropped every hour row as each hour closed
    ["serve", "--keep-raw-days", "nan"],  # roll-ups failed from the first hour on
    ["serve", "--keep-minute-days", "1e6"],  # the same (a timestamp's overflow)
    ["serve", "--interval", "0"],  # scrape rounds without a pause
    ["serve", "--interval", "inf"],  # one failed round, then nothing stored
    ["serve", "--query-timeout", "nan"],  # every query failed
    ["serve", "--query-max-mb", "inf"],
    ["serve", "--publish-every", "nan"],  # a publisher spinning on the lake
    ["serve", "--chunk-minutes", "nan"],
    ["serve", "--api-port", "70000"],
    ["pull", "--prometheus", "http://127.0.0.1:1", "--from", "2026-12-01", "--to", "2026-12-02", "--step", "0"],
    ["ingest", "--file", "page.txt", "--target", "x", "--at", "2026-12-01T00:00:00", "--gpus=-8"],  # -8 GPUs' cost
    ["gateway", "--upstream", "http://127.0.0.1:1", "--port", "70000"],
    ["twin", "--seed=-1"],
    ["localstack", "--base-port", "65530"],  # its ten ports would pass 65535
    ["up", "--stack", "local-cpu", "--base-port", "65530"],
    ["twin", "--fast-forward", "1h", "--tick", "nan"],
    ["query", "--max-rows=-5", "SELECT 1"],
]


@pytest.mark.parametrize("argv", HOSTILE_FLAGS, ids=lambda a: " ".join(a[:1] + a[-2:]).replace("=", " "))
def test_a_flags_number_out_of_range_is_refused_before_anything_is_opened(tmp_path, capsys, argv):
    """NaN, the infinities, 0, negatives and values past a flag's range, each named with its range:
    the warehouse is not opened (its rows are as they were) and no file is made."""
    db = tmp_path / "rack.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE kept AS SELECT 1 AS row")
    con.close()
    before = db.read_bytes()
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--db", str(db), "--targets", str(tmp_path / "targets.json")])
    assert refused.value.code == 2
    flag = next(a for a in reversed(argv) if a.startswith("--")).split("=")[0]
    assert re.search(rf"argument {flag}: .* from .* to .*, not ", capsys.readouterr().err)
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["rack.duckdb"]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["twin", "--fast-forward", "nan"], "a duration must be above 0"),
        (["twin", "--fast-forward=-1h"], "a duration must be above 0"),
        (["twin", "--fast-forward", "1e6d"], "at most 3,650 days"),
        (["twin", "--fast-forward", "2s"], "shorter than one --interval"),
        (["loadgen", "--url", "http://127.0.0.1:1", "--first-turn-words", "0"], "--first-turn-words must be from 1"),
        (["loadgen", "--url", "http://127.0.0.1:1", "--turns-mean", "nan"], "--turns-mean must be from 1"),
    ],
)
def test_a_duration_or_workload_that_cannot_run_is_refused_and_writes_nothing(tmp_path, capsys, argv, said):
    db = tmp_path / "ff.duckdb"
    assert main([*argv, *(["--db", str(db)] if argv[0] == "twin" else [])]) == 2
    assert said in capsys.readouterr().err and not db.exists()


def test_twin_ports_past_65535_are_refused(capsys):
    assert main(["twin", "--base-port", "65530"]) == 2
    assert "ports must end by 65535" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_up_stops_every_child_on_a_signal_sent_to_it_alone(tmp_path, sig):
    """As a shell's background job (SIGINT ignored when it starts), `kill -INT` or `kill` on the
    one pid stops the twin, serve and the dashboard within 10 s and frees their ports."""
    from tests.e2e.test_browser import assert_ports_free, free_port, wait_http

    port, api_port = free_port(), free_port()
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "up",
            "--workdir",
            str(tmp_path),
            "--port",
            str(port),
            "--api-port",
            str(api_port),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    children: list[int] = []
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/_stcore/health", 120, proc)
            wait_http(f"http://127.0.0.1:{api_port}/health", 120, proc)
        except AssertionError as exc:  # its output went to the log
            raise AssertionError(f"{exc}\n{(tmp_path / 'up.log').read_text()[-3000:]}") from exc
        children = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert len(children) == 3, children
        proc.send_signal(sig)
        assert proc.wait(10) == 0, (tmp_path / "up.log").read_text()[-3000:]  # the requirement's own deadline
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            for pid in children:  # never leave them running for later tests
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        log.close()
    for pid in children:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", pid
    assert_ports_free(port, api_port)


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dashboard_passes_a_signal_to_streamlit_and_waits_for_it(tmp_path, sig):
    from tests.e2e.test_browser import assert_ports_free, free_port, wait_http

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moemeter", "dashboard", "--port", str(port), "--api", "http://127.0.0.1:9"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    streamlit: list[int] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 120, proc)
        streamlit = [
            int(p)
            for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ]
        assert len(streamlit) == 1, streamlit
        proc.send_signal(sig)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in streamlit:  # never leave it running for later tests
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)
    assert all(not os.path.exists(f"/proc/{pid}") for pid in streamlit)  # waited for, not left behind
    assert_ports_free(port)


def test_each_stack_has_its_own_targets_and_database(tmp_path):
    from moemeter.cli.running import stack_files

    twin, local = stack_files(tmp_path, "twin"), stack_files(tmp_path, "local-cpu")
    assert twin == (tmp_path / "targets.json", tmp_path / "moemeter.duckdb")  # the twin's history stays put
    assert not set(twin) & set(local)


@pytest.mark.integration
def test_serve_answers_while_it_waits_for_the_stack_and_says_so(tmp_path):
    """`moemeter up` starts serve before the stack has written its targets file (real vLLM takes
    minutes): the query API answers meanwhile, /health says what collection waits for, and the
    first round runs once the file appears."""
    import httpx

    from tests.e2e.test_browser import free_port, wait_http

    api_port, targets = free_port(), tmp_path / "targets.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "serve",
            "--targets",
            str(targets),
            "--db",
            str(tmp_path / "w.duckdb"),
            "--api-port",
            str(api_port),
            "--interval",
            "1",
            "--wait-targets",
            "120",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{api_port}"
    try:
        wait_http(url + "/health", 60, proc)
        waiting = httpx.get(url + "/health").json()["collector"]
        assert "waiting for the targets file" in waiting["starting"] and waiting["rounds"] == 0
        assert httpx.post(url + "/query", json={"sql": "SELECT count(*) FROM scrapes", "format": "json"}).json()[
            "rows"
        ] == [[0]]
        targets.write_text("[]")
        deadline = time.monotonic() + 60
        while (h := httpx.get(url + "/health").json()["collector"])["rounds"] == 0:
            assert time.monotonic() < deadline, h
            time.sleep(0.2)
        assert h["starting"] == "" and h["ok"]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


@pytest.mark.integration
@pytest.mark.vllm
def test_the_twin_then_the_local_cpu_stack_never_mix(tmp_path):
    """`make run` then `make run-vllm` in one work directory: each stack keeps its own targets and
    database, and the second one's pools are its own 1 + 1 GPUs, not the twin's 72."""
    import duckdb

    from dashboard.data import live
    from tests.e2e.test_browser import assert_ports_free, free_port, free_port_block, wait_http
    from tests.integration.test_durability import wait_rounds
    from warehouse.api import QueryClient

    def up(*extra: str) -> tuple[subprocess.Popen, str, list[int]]:  # type: ignore[type-arg]
        port, api_port = free_port(), free_port()
        with (tmp_path / "up.log").open("a") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "moemeter",
                    "up",
                    "--workdir",
                    str(tmp_path),
                    "--port",
                    str(port),
                    "--api-port",
                    str(api_port),
                    *extra,
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        api = f"http://127.0.0.1:{api_port}"
        wait_http(api + "/health", 60, proc)
        return proc, api, [port, api_port]

    def stop(proc: subprocess.Popen, ports: list[int]) -> None:  # type: ignore[type-arg]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, (tmp_path / "up.log").read_text()[-3000:]
        assert_ports_free(*ports)

    def stacks(db: Path) -> set[str]:
        with duckdb.connect(str(db), read_only=True) as con:
            return {r[0] for r in con.execute("SELECT DISTINCT stack FROM targets").fetchall()}

    seen = {}
    for name, extra in (("twin", ()), ("local-cpu", ("--stack", "local-cpu", "--base-port", str(free_port_block(10))))):
        proc, api, ports = up(*extra)
        try:
            wait_rounds(api, 2, within=600 if name == "local-cpu" else 60)  # real vLLM loads for minutes
            q = QueryClient(api)
            latest = live.latest_scrape_time(q)
            assert latest is not None
            seen[name] = live.pool_gpus(live.targets(q, live.Window.ending(latest, 900)))
        finally:
            if proc.poll() is None:
                stop(proc, ports)
            else:
                pytest.fail(f"moemeter up exited with {proc.returncode}:\n{(tmp_path / 'up.log').read_text()[-3000:]}")
    assert seen["twin"]["rack"] == 72 and seen["twin"]["prefill"] > 1
    assert seen["local-cpu"] == {"prefill": 1, "decode": 1, "rack": 2}
    assert stacks(tmp_path / "moemeter-local-cpu.duckdb") == {"local-cpu"}
    assert "local-cpu" not in stacks(tmp_path / "moemeter.duckdb")
