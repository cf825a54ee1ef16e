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
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

import aiohttp

from moemeter.contract import Sample, TargetInfo
from moemeter.contract.clock import utc_now
from warehouse.ingest import ScrapeBatch

from .parse import MAX_PAGE_BYTES, ExpositionError, PageCache, parse_page

log = logging.getLogger(__name__)
ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"
_HEADERS = {"Accept": ACCEPT}


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


Fetch = Callable[[str, float], Awaitable[Response]]
Clock = Callable[[], datetime]


class ScrapeError(Exception):
    """The target could not be fetched; the message is the reason recorded."""


@asynccontextmanager
async def http_fetch() -> AsyncIterator[Fetch]:
    """The real fetch, over one pool of kept-alive connections for as long as the block runs: GET
    with a size cap; a short body or a broken connection is an error. A kept-alive connection the
    server closed before answering (uvicorn, vLLM's server, drops idle ones) is asked once more on
    a fresh one by aiohttp itself (a GET is idempotent); a second drop is an error. aiohttp, not
    httpx: its HTTP parser is C, and a round of the reference rack's 25 pages (6 MB) costs a
    quarter of httpx's CPU (docs/benchmark-history.md)."""
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:

        async def fetch(url: str, timeout: float) -> Response:
            try:
                async with session.get(url, headers=_HEADERS, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    if (resp.content_length or 0) > MAX_PAGE_BYTES:
                        raise ScrapeError(f"body of {resp.content_length} bytes is over {MAX_PAGE_BYTES}: refused")
                    chunks: list[bytes] = []
                    size = 0
                    async for chunk in resp.content.iter_any():
                        size += len(chunk)
                        if size > MAX_PAGE_BYTES:
                            raise ScrapeError(f"body over {MAX_PAGE_BYTES} bytes: refused")
                        chunks.append(chunk)
                    return Response(resp.status, resp.headers.get("Content-Type", ""), b"".join(chunks))
            except TimeoutError as exc:
                raise ScrapeError(f"timeout after {timeout:g}s ({type(exc).__name__})") from exc
            except aiohttp.ServerDisconnectedError as exc:
                raise ScrapeError("truncated or malformed HTTP response: closed without sending a response") from exc
            except (aiohttp.ClientPayloadError, aiohttp.ClientResponseError) as exc:
                raise ScrapeError(f"truncated or malformed HTTP response: {exc}") from exc
            except aiohttp.ClientError as exc:
                raise ScrapeError(f"connection failed: {type(exc).__name__}: {exc}") from exc

        yield fetch


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
