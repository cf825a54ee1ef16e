"""Faults at one target are recorded as its unhealthy scrape; the others are unaffected.

The faults are real: a loopback HTTP server that is down, slow, answers 500, garbage or a
body shorter than its Content-Length.
"""

from __future__ import annotations

import asyncio
import socket

from collectors.scrape import http_fetch, scrape_all, scrape_one
from moemeter.contract import TargetInfo
from tests.conftest import reply


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


async def _scrape(targets, timeout=1.0):
    async with http_fetch() as fetch:
        return await scrape_all(targets, fetch, timeout)


def test_every_fault_is_recorded_with_its_reason_and_the_good_target_is_unaffected(http_server, capture):
    base, routes = http_server
    good = capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").encode()
    routes["/good"] = reply(good)
    routes["/slow"] = reply(good, delay=3.0)
    routes["/error"] = reply(b"internal error", status=500)
    routes["/garbage"] = reply(b"<html>not metrics</html>\n")
    routes["/truncated"] = reply(good[:5000], declared_length=len(good))
    names = ["good", "slow", "error", "garbage", "truncated"]
    targets = [TargetInfo(n, f"{base}/{n}", "decode", 1) for n in names]
    targets.append(TargetInfo("down", f"http://127.0.0.1:{closed_port()}/metrics", "decode", 1))
    batches = {b.target.name: b for b in asyncio.run(_scrape(targets))}
    assert batches["good"].up and batches["good"].error is None
    assert len(batches["good"].samples) > 400
    assert not batches["slow"].up and "timeout" in batches["slow"].error
    assert not batches["error"].up and batches["error"].error.startswith("HTTP 500")
    assert not batches["garbage"].up and "parse error" in batches["garbage"].error
    assert not batches["truncated"].up and "truncated" in batches["truncated"].error
    assert not batches["down"].up and "connection failed" in batches["down"].error
    assert all(b.samples == [] for n, b in batches.items() if n != "good")
    assert len({b.ts for b in batches.values()}) == 1  # one scrape time per round


def test_hostile_http_answers_are_refused_with_their_reason_and_a_gzipped_page_is_read(
    http_server, capture, monkeypatch
):
    """What a target may send besides a page: bytes that are not HTTP, a body over the size cap
    (declared, chunked without a length, or a gzip bomb that only grows when unpacked). Each is
    refused alone with its reason; a gzipped page (prometheus_client compresses when asked, as
    vLLM's /metrics does) reads as the plain one."""
    import gzip

    import collectors.scrape as scrape

    monkeypatch.setattr(scrape, "MAX_PAGE_BYTES", 20_000)
    base, routes = http_server
    page = capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").encode()[:15_000].rpartition(b"\n")[0] + b"\n"

    def raw(data: bytes):  # type: ignore[no-untyped-def]
        def behave(h) -> None:  # type: ignore[no-untyped-def]
            h.wfile.write(data)
            h.wfile.flush()
            h.close_connection = True

        return behave

    def answer(headers: str, body: bytes):  # type: ignore[no-untyped-def]
        return raw(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + headers.encode() + b"\r\n" + body)

    zipped = gzip.compress(page)
    bomb = gzip.compress(b"a 1\n" * 10_000)
    chunks = b"".join(b"%x\r\n%s\r\n" % (1000, b"#" * 999 + b"\n") for _ in range(30)) + b"0\r\n\r\n"
    routes["/plain"] = reply(page)
    routes["/gzip"] = answer(f"Content-Encoding: gzip\r\nContent-Length: {len(zipped)}\r\n", zipped)
    routes["/ssh"] = raw(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
    routes["/declared"] = answer("Content-Length: 50000\r\n", b"a 1\n")
    routes["/chunked"] = answer("Transfer-Encoding: chunked\r\n", chunks)
    routes["/bomb"] = answer(f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n", bomb)
    names = ["plain", "gzip", "ssh", "declared", "chunked", "bomb"]
    batches = {
        b.target.name: b for b in asyncio.run(_scrape([TargetInfo(n, f"{base}/{n}", "decode", 1) for n in names]))
    }
    assert batches["plain"].up and len(batches["plain"].samples) > 50
    assert batches["gzip"].up and list(batches["gzip"].samples) == list(batches["plain"].samples)
    assert "malformed HTTP response" in batches["ssh"].error
    assert "50000 bytes is over 20000" in batches["declared"].error
    assert "over 20000 bytes" in batches["chunked"].error and "over 20000 bytes" in batches["bomb"].error
    assert [n for n, b in batches.items() if b.up] == ["plain", "gzip"]
    assert all(b.samples == [] for n, b in batches.items() if not b.up)


def test_a_slow_target_does_not_delay_the_round_beyond_its_timeout(http_server, capture):
    base, routes = http_server
    routes["/slow"] = reply(b"a 1\n", delay=5.0)
    routes["/fast"] = reply(b"a 1\n")
    import time

    t0 = time.perf_counter()
    batches = asyncio.run(
        _scrape(
            [TargetInfo("slow", f"{base}/slow", "router", 0), TargetInfo("fast", f"{base}/fast", "router", 0)],
            timeout=0.5,
        )
    )
    assert time.perf_counter() - t0 < 2.0
    assert [b.up for b in batches] == [False, True]


def test_a_connection_dropped_before_any_response_is_asked_once_more():
    """uvicorn (vLLM's server) closes idle kept-alive connections; a scrape that lands on one
    gets nothing back and is retried on a fresh connection. A second drop is an error."""
    import socket
    import threading

    page = b"# TYPE a gauge\na 1\n"
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page)

    def serve(drops: int) -> tuple[str, threading.Thread]:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()

        def run() -> None:
            for k in range(drops + 1):
                conn, _ = srv.accept()
                conn.recv(65536)
                if k >= drops:
                    conn.sendall(answer)
                conn.close()
            srv.close()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return f"http://127.0.0.1:{srv.getsockname()[1]}/metrics", t

    async def scrape(url: str):  # type: ignore[no-untyped-def]
        async with http_fetch() as fetch:
            return await scrape_one(TargetInfo("t", url, "decode", 1), fetch, 5.0)

    url, _ = serve(drops=1)
    batch = asyncio.run(scrape(url))
    assert batch.up and [s.name for s in batch.samples] == ["a"]
    url, _ = serve(drops=2)
    batch = asyncio.run(scrape(url))
    assert not batch.up and "without sending a response" in batch.error


def test_a_page_being_parsed_holds_up_no_other_target(http_server, capture, monkeypatch):
    """The big page's parse (a named fake: it waits until the small target's scrape is done, as a
    25 MB page's parse takes seconds) blocks nothing: were it on the event loop, the small target
    would never be scraped and the wait would run out."""
    import threading

    import collectors.scrape as scrape

    base, routes = http_server
    small = capture("vllm-0.32.0-cpu-pd-decode-nixl.metrics.txt").encode()
    big = small + b"# big\n"
    routes["/big"], routes["/small"] = reply(big), reply(small)
    small_done = threading.Event()
    real = scrape.parse_page

    def parse(body: bytes, content_type: str = "text/plain"):  # type: ignore[no-untyped-def]
        if body == big and not small_done.wait(30):
            raise AssertionError("the small target was held up while the big page was parsed")
        out = real(body, content_type)
        if body == small:
            small_done.set()
        return out

    monkeypatch.setattr(scrape, "parse_page", parse)
    targets = [TargetInfo(n, f"{base}/{n}", "decode", 1) for n in ("big", "small")]
    big_batch, small_batch = asyncio.run(_scrape(targets, timeout=60))
    assert big_batch.up and small_batch.up and len(big_batch.samples) == len(small_batch.samples) > 100
