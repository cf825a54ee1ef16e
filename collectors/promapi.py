"""Read from a Prometheus-compatible HTTP API instead of scraping (Prometheus, Thanos, Mimir,
VictoriaMetrics): `/api/v1/query_range` for the samples, `/api/v1/metadata` for the types.

Series map to targets by their `instance` label against the targets file's URLs (host:port);
each evaluation step becomes one ScrapeBatch per target, through the same ingest path as a
scrape, so rates, resets and rollups behave the same.

A source is not trusted for time or size: a point outside the window asked for, or later than
this host's clock (moemeter.contract.clock.MAX_AHEAD), is refused and counted, never stored (its time
would move the rollups' watermarks and retention's "now"); an answer over MAX_ANSWER_BYTES is
refused whole before it is parsed, and a long range is asked for in pieces of MAX_STEPS_PER_QUERY.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from moemeter.contract import Sample, TargetInfo, instance_of
from moemeter.contract.clock import latest_allowed, utc_now
from moemeter.contract.errors import MoemeterError
from warehouse.ingest import ScrapeBatch

# Families moemeter reads; everything else in a fleet's Prometheus stays there.
DEFAULT_MATCH = '{__name__=~"vllm:.+|vllm_router_.+|DCGM_.+|moemeter_.+"}'
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")
MAX_ANSWER_BYTES = 64 << 20
"""The largest answer read from the API: the reference rack's ~60,000 series at a few points each
take about 20 MB as JSON; 1 M series took 213 MB, and 1.34 GB once parsed."""
MAX_STEPS_PER_QUERY = 30
"""Evaluation steps asked for in one query_range (a backfill asks for a long range in pieces)."""
TIME_SLACK = 1e-3  # seconds: an evaluation time printed with milliseconds lies this close to the one asked for


class PromAPIError(MoemeterError, RuntimeError):
    """The API answered with an error or something that is not its JSON."""


class AnswerTooLarge(PromAPIError):
    """The answer passed the byte cap: asked for again in smaller pieces, or refused."""


Get = Callable[[str, dict[str, str]], Any]


def http_get(base_url: str, timeout: float = 30.0, max_bytes: int | None = None) -> Get:
    """A GET of the API's `data`; an answer over `max_bytes` (MAX_ANSWER_BYTES) raises AnswerTooLarge."""

    def get(path: str, params: dict[str, str]) -> Any:
        cap = max_bytes or MAX_ANSWER_BYTES
        try:
            with httpx.stream("GET", base_url.rstrip("/") + path, params=params, timeout=timeout) as resp:
                raw = bytearray()
                for chunk in resp.iter_bytes():
                    raw += chunk
                    if len(raw) > cap:
                        raise AnswerTooLarge(
                            f"{base_url}{path}: the answer is over {cap:,} bytes: refused; narrow the match or the step"
                        )
        except httpx.HTTPError as exc:
            raise PromAPIError(f"{base_url}{path}: {type(exc).__name__}: {exc}") from exc
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise PromAPIError(f"{base_url}{path}: HTTP {resp.status_code}, not JSON") from exc
        if not isinstance(body, dict):
            raise PromAPIError(f"{base_url}{path}: HTTP {resp.status_code}, not an API answer")
        if resp.status_code != 200 or body.get("status") != "success":
            raise PromAPIError(f"{base_url}{path}: {body.get('errorType', resp.status_code)}: {body.get('error', '')}")
        return body["data"]

    return get


def family_of(name: str, types: dict[str, str]) -> tuple[str, str]:
    """(family, kind) of a sample name, from the API's metadata (which names families)."""
    if name in types:
        return name, types[name]
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            family = name[: -len(suffix)]
            return family, types[family]
    return name, "unknown"


@dataclass
class Pulled:
    """What a range read gave: a batch per target and evaluation step, and per target the points
    refused (reason -> count)."""

    batches: list[ScrapeBatch] = field(default_factory=list)
    refused: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))


def pull_range(
    get: Get,
    targets: list[TargetInfo],
    start: datetime,
    end: datetime,
    step_seconds: float,
    match: str = DEFAULT_MATCH,
    now: Callable[[], datetime] = utc_now,
) -> Pulled:
    """One ScrapeBatch per target and evaluation step in [start, end] (naive UTC), asked for in
    pieces of at most MAX_STEPS_PER_QUERY steps, a piece whose answer is over the cap in halves
    (down to one step, which is refused if still over); points outside the window or after
    moemeter.contract.clock.latest_allowed are refused and counted."""
    types = _types(get("/api/v1/metadata", {}))
    pulled, step = Pulled(), timedelta(seconds=step_seconds)
    piece, steps = start, MAX_STEPS_PER_QUERY
    while piece <= end:
        until = min(end, piece + step * (steps - 1))
        try:
            _pull_piece(get, targets, piece, until, step_seconds, match, types, latest_allowed(now()), pulled)
        except AnswerTooLarge:
            if until == piece:
                raise
            steps = max(1, int((until - piece) / step + 1) // 2)
            continue
        piece = until + step
    return pulled


def _types(meta: Any) -> dict[str, str]:
    """Family name -> kind, from /api/v1/metadata's answer."""
    if not isinstance(meta, dict):
        raise PromAPIError("metadata is not an object")
    types = {}
    for name, entries in meta.items():
        entry = entries[0] if isinstance(entries, list) and entries else None
        if isinstance(entry, dict) and isinstance(entry.get("type"), str):
            types[str(name)] = entry["type"]
    return types


def _pull_piece(
    get: Get,
    targets: list[TargetInfo],
    start: datetime,
    end: datetime,
    step_seconds: float,
    match: str,
    types: dict[str, str],
    latest: datetime,
    pulled: Pulled,
) -> None:
    lo, hi = start.replace(tzinfo=UTC).timestamp(), end.replace(tzinfo=UTC).timestamp()
    data = get(
        "/api/v1/query_range",
        {"query": match, "start": f"{lo:.3f}", "end": f"{hi:.3f}", "step": f"{step_seconds:g}"},
    )
    if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        what = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PromAPIError(f"query_range returned {what!r}, expected a matrix")
    by_instance = {instance_of(t.url): t for t in targets}
    rows: dict[tuple[str, float], list[Sample]] = defaultdict(list)
    hi = min(hi, latest.replace(tzinfo=UTC).timestamp())
    for series in data["result"]:
        try:
            labels = {str(k): str(v) for k, v in dict(series["metric"]).items()}
            values = [(float(ts), float(value)) for ts, value in series["values"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise PromAPIError(f"query_range returned a series that is not one: {exc!r}") from exc
        name = labels.pop("__name__", "")
        target = by_instance.get(labels.pop("instance", ""))
        labels.pop("job", None)
        if target is None or not name:
            continue
        family, kind = family_of(name, types)
        key = tuple(sorted(labels.items()))
        for ts, value in values:
            if not lo - TIME_SLACK <= ts <= hi + TIME_SLACK:  # NaN fails too
                pulled.refused[target.name][_outside(ts, lo, latest)] += 1
                continue
            rows[(target.name, ts)].append(Sample(name, key, value, family, kind))
    named = {t.name: t for t in targets}
    pulled.batches += [
        ScrapeBatch(named[name], datetime.fromtimestamp(ts, UTC).replace(tzinfo=None), True, 0.0, samples)
        for (name, ts), samples in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]


def _outside(ts: float, lo: float, latest: datetime) -> str:
    if ts > latest.replace(tzinfo=UTC).timestamp():
        return "points after this host's clock: refused"
    if ts < lo:
        return "points before the window asked for: refused"
    return "points outside the window asked for: refused"
