"""What one reader statement may cost (warehouse.readonly enforces it), and how much memory the
warehouse takes; no heavy imports, so the command line can show the defaults."""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    """What one reader statement may cost; `serve` takes them from its command line."""

    timeout_seconds: float = 30.0  # wall time, from the statement's start to its answer's last byte sent
    max_sql_chars: int = 64_000  # statement text, before it is parsed
    max_tree_nodes: int = 20_000  # nodes of the parsed tree
    max_relations: int = 64  # tables, views, table functions, subqueries (200 joined took 17 s to plan)
    max_selects: int = 256  # SELECTs, UNION branches included
    max_result_rows: int = 5_000_000
    max_result_bytes: int = 256 << 20  # of the answer (Arrow or JSON), counted as written: the most one holds


MAX_CONCURRENT = 4  # statements the query API runs at once; one more waits QUEUE_SECONDS, then gets 503
QUEUE_SECONDS = 5.0

MB = 1_000_000  # DuckDB's MB; its MiB is 2^20
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT])(i?)B", re.IGNORECASE)  # as DuckDB reads one: MB 10^6, MiB 2^20


def size_bytes(text: str) -> int | None:
    """Bytes in a DuckDB size such as 512MB, 4GB or 2GiB; None when it is not one."""
    m = SIZE.fullmatch(text.strip())
    if m is None:
        return None
    power = "KMGT".index(m.group(2).upper()) + 1
    return int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)


# DuckDB's memory_limit (its buffer pool, the writer's and every reader's working memory together;
# past it DuckDB evicts cached blocks and spills large queries to disk) unless --memory-limit says
# otherwise: an eighth of the memory this process may use, and no more than its kind of work needs
# (docs/operations.md, "Memory"). DuckDB's own default, 80% of RAM, let a day's fast-forward reach
# 14.7 GB on a 24 GiB machine.
MEMORY_SHARE = 8
MEMORY_CEILING_MB = {
    "serve": 1024,  # collector and query API: at 256 MB the 24 h pages ran up to 50% slower
    "fast-forward": 2048,  # a round of the whole rack a minute, checkpointed every 256 MB of log
    "command": 1024,  # one-off reads and writes: reports, exports, publish
}
MEMORY_FLOOR_MB = 64  # DuckDB's smallest working set for the warehouse's writes; a smaller cap is refused
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def machine_memory() -> int:
    """Bytes this process may use: the machine's RAM, or its control group's limit when lower
    (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`, as the container sees them)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in CGROUP_LIMITS:
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def default_memory_limit(kind: str = "serve") -> str:
    """The memory cap a warehouse of this kind of work gets unless told (a DuckDB size, in MB)."""
    share = machine_memory() // MEMORY_SHARE // MB
    return f"{max(MEMORY_FLOOR_MB, min(share, MEMORY_CEILING_MB[kind]))}MB"


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux's /proc/self/statm); None where there is none."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


# glibc's heap, beside the DuckDB cap: a long-running process frees most of what Python allocates in
# a round (pages, parsed samples), and glibc keeps the freed blocks, in a heap ("arena") per thread
# that allocated them, up to 8 per core. `serve` kept them: RSS 544 -> 686 MB in its first 4
# minutes with Python's heap flat (docs/operations.md, Memory). DuckDB (its own jemalloc) and
# pyarrow (mimalloc) allocate apart from glibc's heaps, and neither call below reaches them.
ARENAS = 2  # heaps the threads `serve` starts share: collector, writer, query API
M_ARENA_MAX = -8  # mallopt's parameter, from glibc's malloc.h


@cache
def _glibc() -> ctypes.CDLL | None:
    """The C library this process runs on, where it is glibc (it has malloc_trim); None elsewhere
    (musl, macOS)."""
    libc = ctypes.CDLL(None)
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def share_heaps(arenas: int = ARENAS) -> bool:
    """Let threads started from now on share `arenas` heaps instead of one each; call it before the
    process starts its threads. False where the C library is not glibc (nothing changes)."""
    libc = _glibc()
    return libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1


def trim_heap() -> bool:
    """Give the pages of glibc's freed blocks back to the system (malloc_trim(0), every arena).
    False where the C library is not glibc, or nothing could be given back."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1
