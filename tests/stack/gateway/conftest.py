"""Run the gateway and the twin's simulated upstream on loopback in a background event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from stack.gateway.app import Gateway
from stack.gateway.keys import Keys
from stack.gateway.records import RecordLog
from stack.twin.upstream import SimulatedUpstream
from tests.e2e.test_browser import free_port


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []

    def run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def serve(self, app: web.Application, port: int) -> None:
        async def start() -> None:
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)

        self.run(start())

    def close(self) -> None:
        for r in reversed(self.runners):
            self.run(r.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class Rig:
    url: str
    upstream: SimulatedUpstream
    gateway: Gateway
    records: RecordLog
    loop: LoopThread

    def flush(self) -> None:
        """Wait until no request is in flight and every record is durable (or said to be lost): a
        client may have its whole answer before the gateway's handler has finished."""
        import time

        deadline = time.monotonic() + 30
        while self.gateway.metrics.in_flight or self.records.pending:
            assert time.monotonic() < deadline, (
                f"after 30 s: {self.gateway.metrics.in_flight} requests in flight, "
                f"{self.records.pending} records not written"
            )
            time.sleep(0.01)


def start_rig(
    tmp: Path,
    keys: Keys | None = None,
    upstream: SimulatedUpstream | None = None,
    upstream_url: str | None = None,
    **gateway_kwargs: object,
) -> Rig:
    loop = LoopThread()
    up = upstream or SimulatedUpstream(model="twin-moe")
    if upstream_url is None:
        up_port = free_port()
        loop.serve(up.app(), up_port)
        upstream_url = f"http://127.0.0.1:{up_port}"
    records = RecordLog(tmp / "records.sqlite", batch_seconds=0.01)
    gw = Gateway(upstream_url, records, keys=keys, **gateway_kwargs)  # type: ignore[arg-type]
    port = free_port()
    loop.serve(gw.app(), port)
    return Rig(f"http://127.0.0.1:{port}", up, gw, records, loop)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = start_rig(tmp_path)
    yield r
    r.loop.close()
