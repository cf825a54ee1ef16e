"""Debian's PostgreSQL for the lake's tests: a server of the test's own on a socket under a
temporary directory and a free port, stopped after; it makes fresh databases, each a DuckLake
catalog (a lake's data path is fixed in its catalog)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stack.ready import scaled
from tests.e2e.test_browser import free_port

BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)), None)


def _as_owner(argv: list[str], owner: str | None) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the `postgres` user."""
    return ["runuser", "-u", owner, "--", *argv] if owner else argv


@contextmanager
def running_postgres() -> Iterator[Callable[[str], str]]:
    if BIN is None:
        pytest.skip("needs Debian's postgresql package (make test installs it)")
    owner = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a postgres user to run PostgreSQL as")
        owner = "postgres"
    bindir = BIN.parent
    home = Path(tempfile.mkdtemp(prefix="moemeter-pg-"))  # short: a socket path has 107 characters
    if owner:
        shutil.chown(home, owner)
    port = free_port()

    def run(*argv: str) -> None:
        done = subprocess.run(_as_owner(list(argv), owner), capture_output=True, text=True, timeout=scaled(120))
        assert done.returncode == 0, f"{argv[0]} failed: {done.stdout}{done.stderr}"

    try:
        run(str(bindir / "initdb"), "-D", str(home / "data"), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-k {home} -p {port} -c listen_addresses='' -c fsync=off"
        run(str(bindir / "pg_ctl"), "-D", str(home / "data"), "-o", options, "-l", str(home / "log"), "-w", "start")
        try:

            def database(name: str) -> str:
                """A new, empty database on this server: its DuckLake catalog URI."""
                run(str(bindir / "createdb"), "-h", str(home), "-p", str(port), "-U", "postgres", name)
                return f"postgres:dbname={name} host={home} port={port} user=postgres"

            yield database
        finally:
            run(str(bindir / "pg_ctl"), "-D", str(home / "data"), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(home, ignore_errors=True)
