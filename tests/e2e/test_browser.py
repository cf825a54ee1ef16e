"""`moemeter up` end to end in headless Chromium: live numbers from all 72 GPUs, moving.

Needs Debian's chromium (`make test` installs it); saves build/screenshots/live.png.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stack import ready

pytestmark = [pytest.mark.integration, pytest.mark.browser]
ROOT = Path(__file__).parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    """A free port below the kernel's ephemeral range. One the kernel gave for port 0 could be given
    again, to any of the many port 0 binds of the stack started next (the twin's endpoints), before
    the server meant to use it binds it: then that server exits, its port taken."""
    return free_port_block(1)


def assert_ports_free(*ports: int) -> None:
    """Nothing listens on these any more (connections left in TIME_WAIT are fine): binding succeeds."""
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def free_port_block(size: int = 10) -> int:
    """The first of `size` free ports, all below the kernel's ephemeral range: a server started
    minutes later still finds its port free, since no port 0 bind or outgoing connection of the
    processes started meanwhile (vLLM, NIXL, the router) is given one from there."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10000, low - size, 10)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + size):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {size} free ports in a row between 10000 and {low}")


def ms(seconds: float) -> int:
    """A browser wait in Playwright's milliseconds, for two cores; longer on fewer (ready.scaled):
    pinned to one core beside the twin, the Live page's lower charts took 85 s to appear."""
    return int(ready.scaled(seconds) * 1000)


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:  # type: ignore[type-arg]
    """Until `url` answers 200 (within `timeout` on two cores, longer on fewer: ready.scaled); with
    `proc`, fail at once (with its output) if that process exits."""
    try:
        ready.wait_http(url, ready.scaled(timeout), {"the process": proc} if proc is not None else None)
    except ready.NotReady as exc:
        output = proc.stdout.read() if proc is not None and proc.stdout and proc.poll() is not None else ""
        raise AssertionError(f"{exc}\n{output}") from exc


@pytest.fixture
def stack(tmp_path):
    port, api_port = free_port(), free_port()
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
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first, first
        wait_http(f"http://127.0.0.1:{port}/_stcore/health", 60)
        wait_http(f"http://127.0.0.1:{api_port}/health", 60)
        yield f"http://127.0.0.1:{port}", proc, port, api_port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def headline(page) -> dict[str, str]:
    out = {}
    for m in page.locator('[data-testid="stMetric"]').all():
        label = m.locator('[data-testid="stMetricLabel"]').inner_text().strip()
        out[label] = m.locator('[data-testid="stMetricValue"]').inner_text().strip()
    return out


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (make test installs it)")
def test_moemeter_up_shows_live_numbers_in_chromium(stack):
    from playwright.sync_api import sync_playwright

    url, proc, port, api_port = stack
    shots = ROOT / "build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 2400})
        page.goto(url, wait_until="networkidle")
        page.get_by_text("Targets up").first.wait_for(timeout=ms(90))
        page.wait_for_function("document.body.innerText.includes('25/25')", timeout=ms(60))
        page.get_by_text("GPU utilisation (72 GPUs)").first.wait_for(timeout=ms(60))
        first = headline(page)
        # Moving: after two more scrape rounds the rack throughput has new values.
        page.wait_for_function(
            f"!document.body.innerText.includes({first['Rack tok/s per GPU (logical)']!r})", timeout=ms(60)
        )
        second = headline(page)
        page.screenshot(path=str(shots / "live.png"), full_page=True)
        # The Experts page of the same stack: the decode instance's EPLB hot spots.
        page.goto(url + "/experts", wait_until="networkidle")
        page.get_by_text("Hottest rank now").first.wait_for(timeout=ms(90))
        page.get_by_text("Layer x rank: load / layer mean").first.wait_for(timeout=ms(60))
        page.screenshot(path=str(shots / "experts.png"), full_page=True)
        # The Cost page on the usage basis, and its FOCUS file: the rows add up to the page's cost.
        page.goto(url + "/cost", wait_until="networkidle")
        page.locator("[data-testid='stButtonGroup'] button", has_text=re.compile(r"^usage$")).click()
        page.get_by_text("cost basis usage").first.wait_for(timeout=ms(90))
        download = page.get_by_role("button", name=re.compile("Download FOCUS 1.2 .* usage basis"))
        download.first.wait_for(timeout=ms(60))
        cost = headline(page)["Cost"]
        with page.expect_download(timeout=ms(120)) as got:
            download.first.click()
        focus = got.value.path().read_text()
        page.screenshot(path=str(shots / "cost.png"), full_page=True)
        browser.close()
    import io

    import pandas as pd

    rows = pd.read_csv(io.StringIO(focus))
    assert f"${rows['BilledCost'].sum():,.2f}" == cost and set(rows["x_CostBasis"]) == {"usage"}
    assert second["Targets up"] == "25/25"
    for label in ("Rack tok/s per GPU (logical)", "Decode tok/s per GPU", "P90 per-user tok/s"):
        assert re.fullmatch(r"[\d,]+", second[label]), (label, second[label])
    assert 500_000 < float(second["Rack tok/s per GPU (logical)"].replace(",", "")) < 1_500_000
    assert (shots / "live.png").stat().st_size > 50_000
    # Ctrl-C stops everything cleanly: the process exits and its ports are free again.
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert_ports_free(port, api_port)
