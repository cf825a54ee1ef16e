"""A full disk and a read-only file system, for real: the warehouse on its own small tmpfs
(needs root to mount, as `make test` in CI has). A full disk: writes fail with a clear reason,
queries keep answering from what is stored, /health says why and how many rounds were lost,
and writing resumes by itself once space is back. A read-only file system: `serve` answers
queries over what the file holds and says it is not collecting."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import datetime, timedelta

import duckdb
import httpx
import pytest

from collectors.parse import parse_page
from collectors.service import Collector
from dashboard.source import writer_warning
from tests.e2e.test_browser import free_port, wait_http
from warehouse.api import QueryServer
from warehouse.db import Warehouse
from warehouse.ingest import ScrapeBatch, TargetInfo

pytestmark = pytest.mark.integration
DECODE = TargetInfo("decode-0", "http://127.0.0.1:1/metrics", "decode", 1, "test")
T0 = datetime(2026, 11, 30, 12, 0, 0)


def _sh(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or _sh("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)).returncode != 0:
        pytest.skip("needs root and mount(8) for a real small file system")
    try:
        yield disk
    finally:
        _sh("umount", "-l", str(disk))


def test_full_disk_keeps_queries_answering_and_writes_resume(small_disk, capture, caplog, tmp_path):
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    wh = Warehouse(small_disk / "w.duckdb")
    api = QueryServer(wh)
    api.start()
    collector = Collector(wh, targets, interval=5.0)
    page = capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt")
    samples = parse_page(page.encode())
    rounds = iter(range(10_000))

    def store() -> int:
        k = next(rounds)
        return collector.store([ScrapeBatch(DECODE, T0 + timedelta(seconds=5 * k), True, 0.01, samples)])

    def stored() -> int:
        return int(httpx.post(api.url + "/query", json={"sql": "SELECT count(*) AS n FROM scrapes",
                                                        "format": "json"}).json()["rows"][0][0])  # fmt: skip

    def health() -> dict:
        return httpx.get(api.url + "/health").json()

    try:
        for _ in range(3):
            store()
        assert stored() == 3 and health()["writer"]["ok"]
        # Fill the disk to the last few KiB.
        _sh("dd", "if=/dev/zero", f"of={small_disk / 'ballast'}", "bs=64k")
        caplog.set_level(logging.ERROR, logger="warehouse.db")
        failed = 0
        for _ in range(20):  # a few writes may still fit in the last free blocks
            try:
                store()
            except Exception as exc:
                assert "No space left on device" in str(exc)
                failed += 1
        assert failed >= 10
        h = health()
        assert not h["ok"] and not h["writer"]["ok"] and h["writer"]["problem"] == "disk full"
        assert h["writer"]["failed_writes"] == failed
        assert stored() >= 3  # what it holds still answers
        assert sum("cannot write (disk full)" in r.getMessage() for r in caplog.records) == 1  # said once, clearly
        assert "disk full" in (writer_warning(h["writer"]) or "")
        # Space back: the next round is stored without a restart.
        (small_disk / "ballast").unlink()
        before = stored()
        store()
        assert stored() == before + 1 and health()["writer"]["ok"]
    finally:
        api.shutdown()
        wh.close()


def test_a_checkpoint_that_fills_the_disk_is_survived_without_a_restart(small_disk, capture, tmp_path):
    """DuckDB checkpoints when its WAL passes 16 MB (at a commit) or when asked; a checkpoint that
    meets a full disk is fatal to the database instance ("database has been invalidated"): every
    statement fails, readers' too. The warehouse opens the file again at once, so queries answer
    from what was committed, and writes resume by themselves once space is back."""
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    wh = Warehouse(small_disk / "w.duckdb")
    api = QueryServer(wh)
    api.start()
    collector = Collector(wh, targets, interval=5.0)
    samples = parse_page(capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").encode())
    rounds = iter(range(10_000))

    def store() -> int:
        return collector.store([ScrapeBatch(DECODE, T0 + timedelta(seconds=5 * next(rounds)), True, 0.01, samples)])

    def stored() -> int:
        r = httpx.post(api.url + "/query", json={"sql": "SELECT count(*) FROM scrapes", "format": "json"})
        assert r.status_code == 200, r.text
        return int(r.json()["rows"][0][0])

    try:
        for _ in range(3):
            store()  # committed to the WAL, not yet checkpointed into the file
        _sh("dd", "if=/dev/zero", f"of={small_disk / 'ballast'}", "bs=64k")
        with pytest.raises(duckdb.FatalException, match="No space left on device"):
            wh.write(lambda con: con.execute("CHECKPOINT"))
        assert stored() == 3  # reopened: what was committed answers
        h = httpx.get(api.url + "/health").json()
        assert not h["ok"] and h["writer"]["problem"] == "disk full"
        with pytest.raises(Exception, match="No space left on device"):
            for _ in range(20):  # the last free blocks may take a round or two
                store()
        assert stored() >= 3
        (small_disk / "ballast").unlink()
        before = stored()
        store()
        assert stored() == before + 1 and httpx.get(api.url + "/health").json()["ok"]
        wh.write(lambda con: con.execute("CHECKPOINT"))  # and the file can be checkpointed again
    finally:
        api.shutdown()
        wh.close()
    reopened = duckdb.connect(str(small_disk / "w.duckdb"), read_only=True)
    assert reopened.execute("SELECT count(*) FROM scrapes").fetchone()[0] == before + 1


def test_serve_on_a_read_only_file_system_serves_what_it_holds(small_disk, capture, tmp_path):
    wh = Warehouse(small_disk / "w.duckdb")
    page = parse_page(capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").encode())
    Collector(wh, tmp_path / "none.json", interval=5.0).store([ScrapeBatch(DECODE, T0, True, 0.01, page)])
    wh.close()
    assert _sh("mount", "-o", "remount,ro", str(small_disk)).returncode == 0
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moemeter", "serve", "--db", str(small_disk / "w.duckdb"),
                             "--targets", str(targets), "--api-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", 30)
        writer = httpx.get(url + "/health").json()["writer"]
        assert not writer["ok"] and writer["problem"] == "read-only" and "Read-only file system" in writer["error"]
        rows = httpx.post(url + "/query", json={"sql": "SELECT count(*) FROM scrapes", "format": "json"}).json()
        assert rows["rows"] == [[1]]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "NOT collecting" in out and "serving its queries read-only" in err
    # A file that cannot be created at all is refused with the reason, not served.
    refused = subprocess.run([sys.executable, "-m", "moemeter", "serve", "--db", str(small_disk / "new.duckdb"),
                              "--targets", str(targets), "--api-port", str(free_port())],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
