"""Running things: `moemeter up` (a stack, `serve` and `dashboard` as child processes), the local
CPU stack, a GPU rack's launch commands, and the dashboard."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from moemeter.contract import DEFAULT_INTERVAL

from .common import (
    COUNT,
    DEFAULT_API_PORT,
    DEFAULT_DB,
    PORT,
    SECONDS,
    SEED,
    CliError,
    Command,
    Commands,
    Row,
    lake_reading,
    number,
    open_lake,
)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DASHBOARD_PORT = 8501
DEFAULT_WORKDIR = ".moemeter"  # `up`'s targets files and databases
DEFAULT_LOCAL_BASE_PORT = 18100  # the local CPU stack's router; its other parts on the next nine ports
LOCAL_BASE_PORT = number(1, 65535 - 9, "the first of ten TCP ports", whole=True)

commands = Commands()


# ----------------------------------------------------------------------------- up
def _up_options(s: Command) -> None:
    from stack.twin.config import DEFAULT_PROFILE

    twin_db, local_db = (stack_files(Path(), stack)[1] for stack in ("twin", "local-cpu"))
    s.add_argument("--profile", default=DEFAULT_PROFILE, help="twin profile name or TOML path")
    s.add_argument("--seed", type=SEED, default=0, help="twin random seed")
    s.add_argument(
        "--db",
        help="DuckDB file (default: the stack's own in the work directory: "
        f"{twin_db} for the twin, {local_db} for the local CPU stack)",
    )
    s.add_argument(
        "--workdir",
        default=DEFAULT_WORKDIR,
        help="where the targets file and the database go; the database "
        "is kept between runs, so history survives a restart",
    )
    s.add_argument("--port", type=PORT, default=DEFAULT_DASHBOARD_PORT, help="dashboard port")
    s.add_argument("--host", default="127.0.0.1", help="dashboard address")
    s.add_argument("--api-port", type=PORT, default=DEFAULT_API_PORT, help="query API port")
    s.add_argument("--interval", type=SECONDS, default=DEFAULT_INTERVAL, help="scrape interval, seconds")
    s.add_argument(
        "--stack",
        choices=("twin", "local-cpu"),
        default="twin",
        help="what to observe: the rack twin, "
        "or real vLLM on this CPU (make vllm-env router-env first; `make run-vllm` does it all)",
    )
    s.add_argument(
        "--base-port",
        type=LOCAL_BASE_PORT,
        default=DEFAULT_LOCAL_BASE_PORT,
        help="local CPU stack: the router's port; vLLM, the gateway and the router's metrics on the next nine",
    )


def stack_files(workdir: Path, stack: str) -> tuple[Path, Path]:
    """The targets file and the default database of a stack under `moemeter up`: each stack its
    own, so `make run` then `make run-vllm` never mix targets, history or pool sizes."""
    if stack == "twin":  # where the twin's history has always been
        return workdir / "targets.json", workdir / DEFAULT_DB
    return workdir / f"targets-{stack}.json", workdir / f"moemeter-{stack}.duckdb"


@commands.command(
    "up",
    _up_options,
    help="start twin, collectors/warehouse and dashboard; Ctrl-C stops all",
    rows=[
        Row(
            "moemeter up [--profile P] [--seed N]",
            "twin + `serve` + `dashboard` as child processes",
        ),
        Row(
            "make run-vllm / moemeter up --stack local-cpu",
            "the same, observing **real vLLM on this CPU**: prefill + decode of a tiny MoE with NIXL KV "
            "transfer, vllm-router in front, the metering gateway in front of that, the moemeter plugin in "
            "both, traffic from the load generator; its own database "
            f"(`{stack_files(Path(DEFAULT_WORKDIR), 'local-cpu')[1]}`), never mixed with the twin's",
        ),
    ],
)
def cmd_up(args: argparse.Namespace) -> int:
    """twin (or the local CPU stack) + serve + dashboard as child processes; Ctrl-C stops all."""
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    targets, default_db = stack_files(workdir, args.stack)
    targets.unlink(missing_ok=True)
    db = args.db or str(default_db)
    me = [sys.executable, "-m", "moemeter"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    api = f"http://127.0.0.1:{args.api_port}"
    children: list[subprocess.Popen[bytes]] = []
    names: dict[int, str] = {}  # pid -> "twin --profile", "serve --targets", ...

    def start(cmd: list[str]) -> None:
        children.append(subprocess.Popen(cmd, env=env, start_new_session=True))
        names[children[-1].pid] = " ".join(cmd[2:4])

    if args.stack == "local-cpu":
        start(
            [
                *me,
                "localstack",
                "--workdir",
                str(workdir / "local-cpu"),
                "--targets-out",
                str(targets),
                "--base-port",
                str(args.base_port),
            ]
        )
    else:
        start([*me, "twin", "--profile", args.profile, "--seed", str(args.seed), "--targets-out", str(targets)])
    start(
        [
            *me,
            "serve",
            "--targets",
            str(targets),
            "--db",
            db,
            "--api-port",
            str(args.api_port),
            "--interval",
            str(args.interval),
            "--wait-targets",
            "600",
        ]
    )
    start([*me, "dashboard", "--api", api, "--port", str(args.port), "--host", args.host])
    url = f"http://{args.host}:{args.port}"
    print(f"moemeter up: dashboard {url}  (query API {api}, database {db}); Ctrl-C stops everything", flush=True)
    code = 0
    # `kill` stops the children too, like Ctrl-C; SIGINT explicitly, as a shell's background job
    # starts with it ignored (then Python raises no KeyboardInterrupt and `kill -INT` did nothing).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        while True:
            for c in children:
                if c.poll() is not None:
                    print(f"moemeter up: {names[c.pid]} exited with {c.returncode}; stopping", flush=True)
                    code = c.returncode or 1
                    raise KeyboardInterrupt
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        _stop_children(children)
    print("moemeter up: stopped", flush=True)
    return code


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


STOP_SECONDS = 8.0  # a child still running this long after SIGTERM gets SIGKILL


def _stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for c in children:
        if c.poll() is None:
            os.killpg(c.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    for c in children:
        try:
            c.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(c.pid, signal.SIGKILL)
            c.wait()


# ---------------------------------------------------------------------- localstack
def _localstack_options(s: Command) -> None:
    from stack.localstack import TRAFFIC_SESSIONS

    s.add_argument(
        "--workdir", default=str(Path(DEFAULT_WORKDIR, "local-cpu")), help="model directory and logs go here"
    )
    s.add_argument("--targets-out", help="write the targets file here once every part answers")
    s.add_argument(
        "--base-port",
        type=LOCAL_BASE_PORT,
        default=DEFAULT_LOCAL_BASE_PORT,
        help="router port; vLLM on +1 and +2, the gateway on +3, router metrics +9",
    )
    s.add_argument(
        "--traffic-sessions",
        type=COUNT,
        default=TRAFFIC_SESSIONS,
        help="load-generator sessions in flight through the gateway (0: none)",
    )


@commands.command(
    "localstack", _localstack_options, help="real vLLM on CPU: prefill + decode with NIXL, vllm-router, the plugin"
)
def cmd_localstack(args: argparse.Namespace) -> int:
    """Real vLLM on CPU: prefill + decode (NIXL), vllm-router, the gateway, traffic through it; Ctrl-C stops it."""
    from stack.localstack import ENGINES, MAX_RESTARTS, LocalCpuStack, StackError, drive_traffic, last_error
    from stack.twin.server import write_targets

    stack = LocalCpuStack(Path(args.workdir), args.base_port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        print(f"localstack: starting vLLM prefill + decode (NIXL) and vllm-router; logs in {args.workdir}", flush=True)
        stack.start()
        if args.targets_out:
            write_targets(stack.targets(), Path(args.targets_out))
        gateway = f"http://127.0.0.1:{stack.ports['gateway']}"
        print(
            f"localstack: ready; OpenAI API at the gateway {gateway} -> vllm-router "
            f"http://127.0.0.1:{stack.ports['router']}",
            flush=True,
        )
        if args.traffic_sessions:
            threading.Thread(target=drive_traffic, args=(gateway, stop, args.traffic_sessions), daemon=True).start()
        restarts: dict[str, int] = {}
        while not stop.wait(1.0):
            for name, c in list(stack.children.items()):
                if c.poll() is None or restarts.get(name, 0) > MAX_RESTARTS:
                    continue
                log_file = Path(args.workdir) / f"{name}.log"
                said = f" ({cause})" if (cause := last_error(log_file)) else ""
                if name not in ENGINES:
                    raise StackError(f"{name} exited with {c.returncode}{said}; see {log_file}")
                restarts[name] = restarts.get(name, 0) + 1
                if restarts[name] > MAX_RESTARTS:
                    print(
                        f"localstack: {name} exited with {c.returncode}{said} after {MAX_RESTARTS} restarts; "
                        f"leaving it down (the rest keeps serving); see {log_file}",
                        flush=True,
                    )
                    continue
                print(
                    f"localstack: {name} exited with {c.returncode}{said}; the gateway, the router and the other "
                    f"engine keep serving; restarting it ({restarts[name]}/{MAX_RESTARTS})",
                    flush=True,
                )
                try:
                    stack.restart(name, stop)
                except StackError as exc:
                    print(f"localstack: {name} did not come back: {exc}", flush=True)
                    continue
                if not stop.is_set():
                    print(f"localstack: {name} is serving again", flush=True)
    except StackError as exc:
        raise CliError(str(exc)) from exc
    finally:
        stop.set()
        stack.stop()
    return 0


# -------------------------------------------------------------------------- launch
def _launch_options(s: Command) -> None:
    s.add_argument("profile", help="profile directory name in stack/profiles, e.g. gb300-nvl72")
    s.add_argument("--targets-out", help="also write the targets file the collectors need")


@commands.command(
    "launch",
    _launch_options,
    help="print a GPU rack profile's vLLM and vllm-router commands",
    rows=[
        Row(
            "moemeter launch gb300-nvl72 [--targets-out F]",
            "the GB300 NVL72 rack's vLLM (DEP2 prefill, DP64 Wide-EP decode with EPLB) and vllm-router "
            "commands, per tray",
        ),
    ],
)
def cmd_launch(args: argparse.Namespace) -> int:
    """Print a GPU rack profile's launch commands (and write its targets file)."""
    from stack.launch import commands, load, targets
    from stack.twin.server import write_targets

    profile = load(args.profile)
    launches = commands(profile)
    print(f"# {args.profile}: image {profile['image']}; run each command on its tray")
    for launch in launches:
        print(launch.shell())
    if args.targets_out:
        write_targets(targets(profile), Path(args.targets_out))
        print(f"# targets for `moemeter serve`: {args.targets_out}")
    return 0


# ----------------------------------------------------------------------- dashboard
def _dashboard_options(s: Command) -> None:
    s.add_argument("--api", default=f"http://127.0.0.1:{DEFAULT_API_PORT}", help="query API URL")
    s.add_argument("--port", type=PORT, default=DEFAULT_DASHBOARD_PORT, help="port")
    s.add_argument("--host", default="127.0.0.1", help="address")
    s.add_argument(
        "--require-login",
        action="store_true",
        help="sign-in with Streamlit's OIDC login, configured "
        "under [auth] in .streamlit/secrets.toml (README, Security)",
    )
    lake_reading(s, rack=False)
    s.set_defaults(rack=None)


def _streamlit_cmd(port: int, host: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ROOT / "dashboard" / "app.py"),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
    ]  # no "Deploy" button: this dashboard is deployed


@commands.command(
    "dashboard",
    _dashboard_options,
    help="run the Streamlit dashboard",
    rows=[
        Row(
            "moemeter dashboard [--api URL] [--require-login] [--lake CATALOG]",
            f"the Streamlit app (:{DEFAULT_DASHBOARD_PORT}), optionally behind OIDC sign-in; with `--lake`, a "
            "**Fleet** page of every rack in the lake",
        ),
    ],
)
def cmd_dashboard(args: argparse.Namespace) -> int:
    env = {**os.environ, "MOEMETER_API": args.api, "PYTHONPATH": str(ROOT)}
    if args.require_login:
        import importlib.util

        from dashboard import login

        if problem := login.config_problem(login.secrets_files()):
            raise CliError(f"--require-login: {problem}; see README, Security")
        if importlib.util.find_spec("authlib") is None:
            raise CliError("--require-login needs Authlib (pip install 'Authlib>=1.3.2')")
        env[login.LOGIN_ENV] = "1"
    if args.lake:  # checked here, so a bad catalog is one line and not a page error
        with open_lake(args) as _:
            env["MOEMETER_LAKE"], env["MOEMETER_LAKE_DATA"] = args.lake, args.lake_data or ""
    lake = f"; the lake {args.lake}: Fleet page" if args.lake else ""
    print(f"dashboard: http://{args.host}:{args.port}  (query API {args.api}{lake})", flush=True)
    proc = subprocess.Popen(_streamlit_cmd(args.port, args.host), env=env)
    stopping: list[int] = []

    def forward(sig: int, _frame: object) -> None:  # Streamlit stops with us, and frees its port
        stopping.append(sig)
        if proc.poll() is None:
            proc.send_signal(sig)
        killer = threading.Timer(STOP_SECONDS, proc.kill)  # if it has not stopped by then (a no-op once it has)
        killer.daemon = True
        killer.start()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, forward)
    code = proc.wait()
    return 0 if stopping else code
