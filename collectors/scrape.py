"""Scrape every target concurrently, each under its own deadline, and record health as data.

A target that is down, slow, returns an HTTP error, garbage or a truncated page yields an
unhealthy `ScrapeBatch` with the reason; the others are unaffected. Pages are parsed in worker
threads, so a target's duration is its fetch alone and a slow parse delays no other target. The
fetch function and the clock are passed in, so tests drive faults exactly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from moemeter.contract import Sample, TargetInfo
from warehouse.ingest import ScrapeBatch

from .parse import MAX_PAGE_BYTES, ExpositionError, PageCache, parse_page

log = logging.getLogger(__name__)
ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


Fetch = Callable[[str, float], Awaitable[Response]]
Clock = Callable[[], datetime]


class ScrapeError(Exception):
    """The target could not be fetched; the message is the reason recorded."""


def utc_now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def http_fetcher(client: httpx.AsyncClient) -> Fetch:
    """The real fetch: GET with a size cap; a short body or broken connection is an error."""

    async def fetch(url: str, timeout: float) -> Response:
        try:
            return await get(url, timeout)
        except httpx.RemoteProtocolError as exc:
            # A kept-alive connection the server had just closed (uvicorn drops idle ones): nothing
            # was sent or received on it, so asking once more on a fresh connection is safe.
            if "without sending a response" not in str(exc):
                raise ScrapeError(f"truncated or malformed HTTP response: {exc}") from exc
            try:
                return await get(url, timeout)
            except httpx.RemoteProtocolError as again:
                raise ScrapeError(f"truncated or malformed HTTP response: {again}") from again

    async def get(url: str, timeout: float) -> Response:
        try:
            async with client.stream("GET", url, headers={"Accept": ACCEPT}, timeout=timeout) as resp:
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_PAGE_BYTES:
                        raise ScrapeError(f"body over {MAX_PAGE_BYTES} bytes: refused")
                    chunks.append(chunk)
                return Response(resp.status_code, resp.headers.get("content-type", ""), b"".join(chunks))
        except httpx.TimeoutException as exc:
            raise ScrapeError(f"timeout after {timeout:g}s ({type(exc).__name__})") from exc
        except httpx.RemoteProtocolError:
            raise
        except httpx.TransportError as exc:
            raise ScrapeError(f"connection failed: {type(exc).__name__}: {exc}") from exc

    return fetch


Parse = Callable[[bytes, str], Sequence[Sample]]


async def scrape_one(
    target: TargetInfo, fetch: Fetch, timeout: float, clock: Clock = utc_now, parse: Parse = parse_page
) -> ScrapeBatch:
    ts = clock()
    started = time.perf_counter()
    try:
        resp = await asyncio.wait_for(fetch(target.url, timeout), timeout)
    except TimeoutError:
        return ScrapeBatch(target, ts, False, time.perf_counter() - started, error=f"timeout after {timeout:g}s")
    except ScrapeError as exc:
        return ScrapeBatch(target, ts, False, time.perf_counter() - started, error=str(exc))
    duration = time.perf_counter() - started
    if resp.status != 200:
        snippet = resp.body[:120].decode("utf-8", "replace").strip()
        return ScrapeBatch(target, ts, False, duration, bytes=len(resp.body), error=f"HTTP {resp.status}: {snippet}")
    try:  # in a worker thread: a huge page never holds up another target's round on the event loop
        samples = await asyncio.to_thread(parse, resp.body, resp.content_type)
    except ExpositionError as exc:
        return ScrapeBatch(target, ts, False, duration, bytes=len(resp.body), error=str(exc))
    return ScrapeBatch(target, ts, True, duration, samples, bytes=len(resp.body))


async def scrape_all(
    targets: list[TargetInfo],
    fetch: Fetch,
    timeout: float,
    clock: Clock = utc_now,
    caches: dict[str, PageCache] | None = None,
) -> list[ScrapeBatch]:
    """All targets at once; one scrape time per round so a round lines up across targets. With
    `caches`, each target's page is parsed through its scrape cache there (added when missing)."""
    ts = clock()

    def parse(t: TargetInfo) -> Parse:
        return parse_page if caches is None else caches.setdefault(t.name, PageCache()).parse

    return list(await asyncio.gather(*(scrape_one(t, fetch, timeout, lambda: ts, parse(t)) for t in targets)))
