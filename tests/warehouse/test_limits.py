"""The warehouse's default memory cap: derived from the machine (its control group's limit when
lower), no more than its kind of work needs, and overridable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warehouse import limits
from warehouse.db import Warehouse, WarehouseError
from warehouse.limits import default_memory_limit, machine_memory, size_bytes

MIB = 1 << 20
GIB = 1024 * MIB


@pytest.mark.parametrize(
    ("machine", "kind", "cap"),
    [
        (24 * GIB, "serve", "1024MB"),  # this machine: the ceiling
        (24 * GIB, "fast-forward", "2048MB"),
        (24 * GIB, "command", "1024MB"),
        (1_000_000_000, "serve", "125MB"),  # a small VM: an eighth
        (8_000_000_000, "fast-forward", "1000MB"),
        (256 * MIB, "serve", "64MB"),  # never below the floor
    ],
)
def test_the_default_cap_is_an_eighth_of_the_machine_up_to_the_kinds_ceiling(monkeypatch, machine, kind, cap):
    monkeypatch.setattr(limits, "machine_memory", lambda: machine)
    assert default_memory_limit(kind) == cap


@pytest.mark.parametrize(
    ("v2", "v1", "expected"),
    [
        ("max\n", None, None),  # no limit: the machine's RAM
        ("1073741824\n", None, 1 * GIB),
        (None, "2147483648\n", 2 * GIB),
        (None, "9223372036854771712\n", None),  # v1's "no limit" is larger than any RAM
        ("garbage", "536870912", 512 * MIB),
    ],
)
def test_a_control_groups_limit_lowers_what_the_machine_has(tmp_path, monkeypatch, v2, v1, expected):
    paths = []
    for name, text in (("memory.max", v2), ("memory.limit_in_bytes", v1)):
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        paths.append(path)
    monkeypatch.setattr(limits, "CGROUP_LIMITS", tuple(paths))
    physical = limits.os.sysconf("SC_PAGE_SIZE") * limits.os.sysconf("SC_PHYS_PAGES")
    assert machine_memory() == min(physical, expected or physical)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("256MB", 256_000_000), ("2GiB", 2 * GIB), (" 1.5 GB ", 1_500_000_000), ("64mib", 64 * MIB), ("4", None)],
)
def test_sizes_read_as_duckdb_reads_them(text, expected):
    assert size_bytes(text) == expected


def test_a_warehouse_given_no_cap_takes_the_default_and_one_given_keeps_it(tmp_path):
    setting = "SELECT current_setting('memory_limit') AS m"
    wh = Warehouse(tmp_path / "d.duckdb")
    assert wh.query_df(setting)["m"][0] == wh.write(lambda con: con.sql(setting).fetchone()[0])
    default = wh.query_df(setting)["m"][0]
    wh.close()
    wh = Warehouse(tmp_path / "d.duckdb", memory_limit="1GiB")
    assert wh.query_df(setting)["m"][0] == "1.0 GiB" != default
    wh.close()
    import duckdb

    with duckdb.connect(config={"memory_limit": default_memory_limit()}) as con:
        assert con.sql(setting).fetchone()[0] == default  # DuckDB's own rendering of the default


@pytest.mark.parametrize("small", ["0MB", "1KB", "61MiB", "0.01GB", "63.9MB"])
def test_a_cap_too_small_to_write_with_is_refused_before_the_file_is_touched(tmp_path, small):
    with pytest.raises(WarehouseError, match="give at least 64MB"):
        Warehouse(tmp_path / "m.duckdb", memory_limit=small)
    assert not (tmp_path / "m.duckdb").exists()


def _run(script: str) -> str:
    """A fresh interpreter's output: glibc's heap there holds only what the script did."""
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}  # glibc's defaults
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True, env=env
    )
    return done.stdout + done.stderr


glibc = pytest.mark.skipif(limits._glibc() is None, reason="the C library is not glibc")


@glibc
def test_trimming_gives_freed_blocks_back_to_the_system():
    out = _run(
        "import os\n"
        "from warehouse.limits import trim_heap\n"
        "page = os.sysconf('SC_PAGE_SIZE')\n"  # 4 KiB here, 64 KiB on some ARM hosts
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * page >> 20\n"
        "blocks = [bytes(4000) for _ in range(50_000)]\n"  # 200 MB of blocks malloc keeps in its heap
        "kept = blocks[-1]\n"  # the top block stays, so freeing the rest cannot shrink the heap's end
        "del blocks\n"
        "freed = rss()\n"
        "trim_heap()\n"
        "print(freed, rss())\n"
    )
    freed, trimmed = map(int, out.split())
    assert freed - trimmed >= 150, out  # MB


@glibc
@pytest.mark.parametrize(("shared", "most"), [(True, limits.ARENAS), (False, None)])
def test_shared_heaps_hold_every_threads_blocks(shared, most):
    out = _run(
        "import ctypes, threading\n"
        "from warehouse.limits import share_heaps\n"
        f"assert share_heaps() if {shared} else True\n"
        "together = threading.Barrier(6)\n"
        "def work(): held = [bytearray(70_000) for _ in range(50)]; together.wait()\n"  # below mmap's threshold
        "threads = [threading.Thread(target=work) for _ in range(6)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "ctypes.CDLL(None).malloc_stats()\n"  # one 'Arena N:' paragraph per heap, on stderr
    )
    arenas = out.count("Arena ")
    if most:
        assert 1 <= arenas <= most, out
    else:
        assert arenas > limits.ARENAS, out  # without sharing, each thread took a heap of its own


def test_where_the_c_library_is_not_glibc_nothing_changes(monkeypatch):
    monkeypatch.setattr(limits, "_glibc", lambda: None)
    assert limits.share_heaps() is False
    assert limits.trim_heap() is False
