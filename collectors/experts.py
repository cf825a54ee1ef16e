"""Pull per-expert snapshots (GET <target>/moemeter/experts) from EPLB instances.

Only prefill and decode targets are asked, every few rounds; a target that answers 404 has no
moemeter plugin and is asked again much later, so it costs nothing in between.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from moemeter.contract import TargetInfo
from warehouse.experts import ExpertSnapshot, SnapshotError

from .scrape import Fetch, ScrapeError

SNAPSHOT_PATH = "/moemeter/experts"


NOT_READY = "not ready yet (HTTP 503)"


def endpoint_url(target: TargetInfo, path: str) -> str:
    """The URL of another endpoint on the server that serves a target's /metrics."""
    base = target.url[: -len("/metrics")] if target.url.endswith("/metrics") else target.url.rstrip("/")
    return base + path


def snapshot_url(target: TargetInfo) -> str:
    return endpoint_url(target, SNAPSHOT_PATH)


@dataclass
class SnapshotResult:
    target: TargetInfo
    snapshot: ExpertSnapshot | None
    error: str | None = None
    absent: bool = False  # 404: the target has no snapshot endpoint
    refused: bool = False  # it answered, with something that is not a snapshot


async def fetch_snapshot(target: TargetInfo, fetch: Fetch, timeout: float) -> SnapshotResult:
    try:
        resp = await fetch(snapshot_url(target), timeout)
    except ScrapeError as exc:
        return SnapshotResult(target, None, str(exc))
    if resp.status == 404:
        return SnapshotResult(target, None, "no snapshot endpoint", absent=True)
    if resp.status == 503:  # the endpoint exists, with nothing to show yet (no tokens routed)
        return SnapshotResult(target, None, NOT_READY)
    if resp.status != 200:
        return SnapshotResult(target, None, f"HTTP {resp.status}")
    try:
        return SnapshotResult(target, ExpertSnapshot.from_json(json.loads(resp.body)))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        return SnapshotResult(target, None, f"snapshot is not JSON: {exc}", refused=True)
    except SnapshotError as exc:
        return SnapshotResult(target, None, str(exc), refused=True)
