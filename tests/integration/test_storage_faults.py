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
from pathlib import Path

import duckdb
import httpx
import pytest

from collectors.parse import parse_page
from collectors.service import Collector
from dashboard.source import writer_warning
from moemeter.contract import TargetInfo
from tests.e2e.test_browser import free_port, wait_http
from warehouse.api import QueryServer
from warehouse.db import Warehouse
from warehouse.ingest import ScrapeBatch

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


class OnSmallDisk:
    """The warehouse on the small disk, its query API, and a collector storing the recorded decode page."""

    def __init__(self, disk: Path, samples: list, tmp: Path) -> None:  # type: ignore[type-arg]
        targets = tmp / "targets.json"
        targets.write_text("[]")
        self.disk, self.samples, self.rounds = disk, samples, iter(range(10_000))
        self.wh = Warehouse(disk / "w.duckdb")
        self.api = QueryServer(self.wh)
        self.api.start()
        self.collector = Collector(self.wh, targets, interval=5.0)

    def store(self) -> int:
        at = T0 + timedelta(seconds=5 * next(self.rounds))
        return self.collector.store([ScrapeBatch(DECODE, at, True, 0.01, self.samples)])

    def stored(self) -> int:
        r = httpx.post(self.api.url + "/query", json={"sql": "SELECT count(*) FROM scrapes", "format": "json"})
        assert r.status_code == 200, r.text
        return int(r.json()["rows"][0][0])

    def health(self) -> dict:  # type: ignore[type-arg]
        return httpx.get(self.api.url + "/health").json()

    def fill(self) -> None:
        """Fill the disk to the last few KiB."""
        _sh("dd", "if=/dev/zero", f"of={self.disk / 'ballast'}", "bs=64k")

    def free(self) -> None:
        (self.disk / "ballast").unlink()


@pytest.fixture
def on_disk(small_disk, capture, tmp_path):
    rig = OnSmallDisk(small_disk, parse_page(capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").encode()), tmp_path)
    try:
        yield rig
    finally:
        rig.api.shutdown()
        rig.wh.close()


def test_full_disk_keeps_queries_answering_and_writes_resume(on_disk, caplog):
    rig = on_disk
    for _ in range(3):
        rig.store()
    assert rig.stored() == 3 and rig.health()["writer"]["ok"]
    rig.fill()
    caplog.set_level(logging.ERROR, logger="warehouse.db")
    failed = 0
    for _ in range(20):  # a few writes may still fit in the last free blocks
        try:
            rig.store()
        except Exception as exc:
            assert "No space left on device" in str(exc)
            failed += 1
    assert failed >= 10
    h = rig.health()
    assert not h["ok"] and not h["writer"]["ok"] and h["writer"]["problem"] == "disk full"
    assert h["writer"]["failed_writes"] == failed
    assert rig.stored() >= 3  # what it holds still answers
    assert sum("cannot write (disk full)" in r.getMessage() for r in caplog.records) == 1  # said once, clearly
    assert "disk full" in (writer_warning(h["writer"]) or "")
    # Space back: the next round is stored without a restart.
    rig.free()
    before = rig.stored()
    rig.store()
    assert rig.stored() == before + 1 and rig.health()["writer"]["ok"]


def test_a_checkpoint_that_fills_the_disk_is_survived_without_a_restart(on_disk):
    """DuckDB checkpoints when its WAL passes 16 MB (at a commit) or when asked; a checkpoint that
    meets a full disk is fatal to the database instance ("database has been invalidated"): every
    statement fails, readers' too. The warehouse opens the file again at once, so queries answer
    from what was committed, and writes resume by themselves once space is back."""
    rig = on_disk
    for _ in range(3):
        rig.store()  # committed to the WAL, not yet checkpointed into the file
    rig.fill()
    with pytest.raises(duckdb.FatalException, match="No space left on device"):
        rig.wh.write(lambda con: con.execute("CHECKPOINT"))
    assert rig.stored() == 3  # reopened: what was committed answers
    h = rig.health()
    assert not h["ok"] and h["writer"]["problem"] == "disk full"
    with pytest.raises(Exception, match="No space left on device"):
        for _ in range(20):  # the last free blocks may take a round or two
            rig.store()
    assert rig.stored() >= 3
    rig.free()
    before = rig.stored()
    rig.store()
    assert rig.stored() == before + 1 and rig.health()["ok"]
    rig.wh.write(lambda con: con.execute("CHECKPOINT"))  # and the file can be checkpointed again
    rig.api.shutdown()
    rig.wh.close()
    reopened = duckdb.connect(str(rig.disk / "w.duckdb"), read_only=True)
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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moemeter",
            "serve",
            "--db",
            str(small_disk / "w.duckdb"),
            "--targets",
            str(targets),
            "--api-port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "moemeter",
            "serve",
            "--db",
            str(small_disk / "new.duckdb"),
            "--targets",
            str(targets),
            "--api-port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
