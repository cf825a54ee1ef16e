"""Shared fixtures: the recorded captures, and a loopback HTTP server whose answers a test sets."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def capture() -> Callable[[str], str]:
    return lambda name: (FIXTURES / name).read_text()


Behaviour = Callable[[BaseHTTPRequestHandler], None]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.server.routes[self.path](self)  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass


def reply(
    body: bytes,
    status: int = 200,
    content_type: str = "text/plain; version=0.0.4",
    delay: float = 0.0,
    declared_length: int | None = None,
) -> Behaviour:
    """An HTTP answer; declared_length larger than the body makes a truncated response."""

    def behave(h: BaseHTTPRequestHandler) -> None:
        time.sleep(delay)
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body) if declared_length is None else declared_length))
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()
        if declared_length is not None:
            h.close_connection = True

    return behave


@pytest.fixture
def http_server() -> Iterator[tuple[str, dict[str, Behaviour]]]:
    """(base_url, routes): set routes[path] = reply(...) before fetching."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.routes = {}  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", srv.routes  # type: ignore[attr-defined]
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def empty_api(tmp_path, monkeypatch) -> Iterator[str]:
    """A query API over a freshly migrated, empty warehouse; MOEMETER_API points at it."""
    from warehouse.api import QueryServer
    from warehouse.db import Warehouse

    wh = Warehouse(tmp_path / "empty.duckdb")
    srv = QueryServer(wh)
    srv.start()
    monkeypatch.setenv("MOEMETER_API", srv.url)
    yield srv.url
    srv.shutdown()
    wh.close()


def run_page(page: str, api_url: str, monkeypatch: pytest.MonkeyPatch, timeout: float = 60):  # type: ignore[no-untyped-def]
    """Render one dashboard page with AppTest against a query API; it must not raise."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("MOEMETER_API", api_url)
    at = AppTest.from_file(page, default_timeout=timeout)
    at.run()
    assert not at.exception, at.exception
    return at


def plotly_array(value: object) -> np.ndarray:
    """An array of a figure's JSON: a list, or plotly's typed array ({"dtype", "bdata", "shape"})."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        return flat.reshape([int(n) for n in str(value.get("shape", len(flat))).split(",")])
    return np.array(value, dtype=float)


def _children(pid: int) -> dict[int, str]:
    """The live processes whose parent is `pid`: their command lines."""
    out = {}
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit():
                continue
            state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]  # after the command name
            if ppid == str(pid) and state != "Z":
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A server a test started and never stopped keeps a core busy for every test after it (a leaked
    `moemeter serve` took half a core each): kill what is left and fail the run, naming it."""
    import os
    import signal

    left = _children(os.getpid())
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        print(
            "\nprocesses left running by the tests (killed):\n"
            + "\n".join(f"  {p}: {c[:200]}" for p, c in left.items())
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked slow says why it cannot be smaller: `@pytest.mark.slow("what it runs")`."""
    unexplained = [i.nodeid for i in items for m in i.iter_markers("slow") if not (m.args and str(m.args[0]).strip())]
    if unexplained:
        raise pytest.UsageError(f"slow without a reason: {', '.join(unexplained)}")
