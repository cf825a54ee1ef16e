"""Read from a Prometheus-compatible HTTP API instead of scraping (Prometheus, Thanos, Mimir,
VictoriaMetrics): `/api/v1/query_range` for the samples, `/api/v1/metadata` for the types.

Series map to targets by their `instance` label against the targets file's URLs (host:port);
each evaluation step becomes one ScrapeBatch per target, through the same ingest path as a
scrape, so rates, resets and rollups behave the same.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from moemeter.contract import Sample, TargetInfo
from moemeter.errors import MoemeterError
from warehouse.ingest import ScrapeBatch

# Families moemeter reads; everything else in a fleet's Prometheus stays there.
DEFAULT_MATCH = '{__name__=~"vllm:.+|vllm_router_.+|DCGM_.+|moemeter_.+"}'
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


class PromAPIError(MoemeterError, RuntimeError):
    """The API answered with an error or something that is not its JSON."""


Get = Callable[[str, dict[str, str]], Any]


def http_get(base_url: str, timeout: float = 30.0) -> Get:
    def get(path: str, params: dict[str, str]) -> Any:
        try:
            resp = httpx.get(base_url.rstrip("/") + path, params=params, timeout=timeout)
        except httpx.HTTPError as exc:
            raise PromAPIError(f"{base_url}{path}: {type(exc).__name__}: {exc}") from exc
        try:
            body = resp.json()
        except ValueError as exc:
            raise PromAPIError(f"{base_url}{path}: HTTP {resp.status_code}, not JSON") from exc
        if resp.status_code != 200 or body.get("status") != "success":
            raise PromAPIError(f"{base_url}{path}: {body.get('errorType', resp.status_code)}: {body.get('error', '')}")
        return body["data"]

    return get


def instance_of(url: str) -> str:
    return urlsplit(url).netloc


def family_of(name: str, types: dict[str, str]) -> tuple[str, str]:
    """(family, kind) of a sample name, from the API's metadata (which names families)."""
    if name in types:
        return name, types[name]
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            family = name[: -len(suffix)]
            return family, types[family]
    return name, "unknown"


def pull_range(
    get: Get, targets: list[TargetInfo], start: datetime, end: datetime, step_seconds: float, match: str = DEFAULT_MATCH
) -> list[ScrapeBatch]:
    """One ScrapeBatch per target and evaluation step in [start, end]."""
    meta = get("/api/v1/metadata", {})
    types = {name: entries[0]["type"] for name, entries in meta.items() if entries}
    data = get(
        "/api/v1/query_range",
        {
            "query": match,
            "start": f"{start.replace(tzinfo=UTC).timestamp():.3f}",
            "end": f"{end.replace(tzinfo=UTC).timestamp():.3f}",
            "step": f"{step_seconds:g}",
        },
    )
    if data.get("resultType") != "matrix":
        raise PromAPIError(f"query_range returned {data.get('resultType')!r}, expected a matrix")
    by_instance = {instance_of(t.url): t for t in targets}
    rows: dict[tuple[str, float], list[Sample]] = defaultdict(list)
    for series in data["result"]:
        labels = dict(series["metric"])
        name = labels.pop("__name__", "")
        target = by_instance.get(labels.pop("instance", ""))
        labels.pop("job", None)
        if target is None or not name:
            continue
        family, kind = family_of(name, types)
        key = tuple(sorted(labels.items()))
        for ts, value in series["values"]:
            rows[(target.name, float(ts))].append(Sample(name, key, float(value), family, kind))
    named = {t.name: t for t in targets}
    return [
        ScrapeBatch(named[name], datetime.fromtimestamp(ts, UTC).replace(tzinfo=None), True, 0.0, samples)
        for (name, ts), samples in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]
