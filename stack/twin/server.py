"""Serve the rack twin on loopback: one HTTP endpoint per real process, plus its targets file.

Endpoints: each prefill and decode vLLM API server, the vllm-router, the metering gateway
(its /metrics and request feed), and one dcgm-exporter per tray. The model advances in a background thread in real time; each scrape renders the
latest state. `Twin.pages()` gives the same pages without HTTP (fast-forward, tests).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .config import TwinProfile
from .exposition import expert_snapshot, render_dcgm, render_plugin, render_router, render_step_phases, render_vllm
from .faults import Fault
from .model import TICK_SECONDS, RackModel
from .stats import InstanceStats

log = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
WARMUP_SECONDS = 120.0


@dataclass(frozen=True)
class Endpoint:
    name: str
    role: str
    gpus: int
    render: Callable[[], str]
    hostname: str = ""
    snapshot: Callable[[], dict[str, object]] | None = None  # GET /moemeter/experts
    feed: Callable[[int, int], dict[str, object]] | None = None  # GET /moemeter/requests (the gateway)


class Twin:
    """The model plus one renderer per endpoint; thread-safe."""

    def __init__(
        self,
        profile: TwinProfile,
        seed: int = 0,
        start: float | None = None,
        host: str = "127.0.0.1",
        ports: list[int] | None = None,
        tick: float = TICK_SECONDS,
        faults: tuple[Fault, ...] = (),
    ) -> None:
        self.profile = profile
        self.faults = faults
        self.tick = tick  # simulation step; fast-forward may take longer ones
        self.seed = seed
        self.host = host
        topo = profile.topology
        names = (
            [f"prefill-{i}" for i in range(topo.prefill_instances)]
            + [f"decode-{i}" for i in range(topo.decode_instances)]
            + ["router", "gateway"]
            + [f"gpu-tray-{t:02d}" for t in range(topo.trays)]
        )
        self.ports = dict(zip(names, ports or [0] * len(names)))
        self._servers: list[ThreadingHTTPServer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.time() - WARMUP_SECONDS if start is None else start
        self.model: RackModel | None = None

    # ---------------------------------------------------------------- pages
    def _build_model(self, prefill_urls: list[str], decode_urls: list[str]) -> None:
        self.model = RackModel(self.profile, self.seed, self._start, prefill_urls, decode_urls, self.tick, self.faults)

    def endpoints(self) -> list[Endpoint]:
        assert self.model is not None
        m, topo, profile = self.model, self.profile.topology, self.profile
        model = profile.model.name

        def prefill_page(s: InstanceStats) -> str:
            return render_vllm(s, profile) + render_step_phases(s, model)

        # The decode instance runs EPLB and the moemeter plugin: its page adds the plugin's families.
        def decode_page(s: InstanceStats) -> str:
            return render_vllm(s, profile) + render_plugin(m.experts.state, model) + render_step_phases(s, model)

        def snapshot() -> dict[str, object]:
            return expert_snapshot(m.experts.state, model, m.now)

        out = [Endpoint(s.name, "prefill", s.dp, partial(prefill_page, s)) for s in m.prefill]
        out += [Endpoint(s.name, "decode", s.dp, partial(decode_page, s), snapshot=snapshot) for s in m.decode]
        out.append(Endpoint("router", "router", 0, partial(render_router, m.router)))
        out.append(Endpoint("gateway", "gateway", 0, m.gateway.render, feed=m.gateway.page))
        for t in range(topo.trays):
            gpus = m.gpus[t * topo.gpus_per_tray : (t + 1) * topo.gpus_per_tray]
            host = f"gb300-tray-{t:02d}"
            out.append(Endpoint(f"gpu-tray-{t:02d}", "gpu", len(gpus), partial(render_dcgm, gpus, host, profile), host))
        return out

    def pages(self, at: float) -> dict[str, str]:
        """Advance to `at` and render every endpoint (used for fast-forward and tests)."""
        if self.model is None:
            topo = self.profile.topology
            self._build_model(
                [f"http://{self.host}:0/prefill-{i}" for i in range(topo.prefill_instances)],
                [f"http://{self.host}:0/decode-{i}" for i in range(topo.decode_instances)],
            )
        assert self.model is not None
        with self._lock:
            self.model.advance(at)
            return {e.name: e.render() for e in self.endpoints()}

    # ----------------------------------------------------------------- HTTP
    def serve(self) -> list[dict[str, object]]:
        """Bind every endpoint, start the clock; returns the targets list."""
        servers: dict[str, _Server] = {}
        for name, port in self.ports.items():
            srv = _Server((self.host, port), _Handler)
            servers[name] = srv
        reach = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host  # what a local scraper dials
        base = {name: f"http://{reach}:{srv.server_address[1]}" for name, srv in servers.items()}
        topo = self.profile.topology
        self._build_model(
            [base[f"prefill-{i}"] for i in range(topo.prefill_instances)],
            [base[f"decode-{i}"] for i in range(topo.decode_instances)],
        )
        self._catch_up()
        cache: dict[str, tuple[float, str]] = {}
        targets: list[dict[str, object]] = []
        for ep in self.endpoints():
            srv = servers[ep.name]
            srv.page = self._page_fn(ep, cache)  # type: ignore[attr-defined]
            srv.snapshot = self._snapshot_fn(ep)  # type: ignore[attr-defined]
            srv.feed = self._feed_fn(ep)  # type: ignore[attr-defined]
            entry: dict[str, object] = {
                "name": ep.name,
                "url": base[ep.name] + "/metrics",
                "role": ep.role,
                "gpus": ep.gpus,
                "stack": f"twin:{self.profile.name}",
            }
            if ep.hostname:
                entry["hostname"] = ep.hostname
            targets.append(entry)
            threading.Thread(target=srv.serve_forever, args=(0.1,), name=f"twin-{ep.name}", daemon=True).start()
            self._servers.append(srv)
        self._thread = threading.Thread(target=self._clock, name="twin-clock", daemon=True)
        self._thread.start()
        return targets

    def _catch_up(self) -> None:
        """Advance to now until a pass takes under a tick: the warm-up takes seconds of CPU, and
        the time it took would otherwise be simulated by the first scrape round (7.7 s on a busy
        2-core machine, so most of the collector's first round timed out)."""
        while True:
            started = time.time()
            with self._lock:
                assert self.model is not None
                self.model.advance(started)
            if time.time() - started < self.tick:
                return

    def _page_fn(self, ep: Endpoint, cache: dict[str, tuple[float, str]]) -> Callable[[], str]:
        def page() -> str:
            with self._lock:
                assert self.model is not None
                self.model.advance(time.time())  # a scrape sees the state of now, not of the last clock tick
                now = self.model.now
                hit = cache.get(ep.name)
                if hit and hit[0] == now:
                    return hit[1]
                text = ep.render()
                cache[ep.name] = (now, text)
                return text

        return page

    def _snapshot_fn(self, ep: Endpoint) -> Callable[[], bytes] | None:
        if ep.snapshot is None:
            return None
        snap = ep.snapshot

        def body() -> bytes:
            with self._lock:
                return json.dumps(snap()).encode()

        return body

    def _feed_fn(self, ep: Endpoint) -> Callable[[int, int], bytes] | None:
        if ep.feed is None:
            return None
        feed = ep.feed

        def body(after: int, limit: int) -> bytes:
            with self._lock:
                assert self.model is not None
                self.model.advance(time.time())
                return json.dumps(feed(after, limit)).encode()

        return body

    def _clock(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                assert self.model is not None
                self.model.advance(time.time())

    def close(self) -> None:
        self._stop.set()
        stoppers = [threading.Thread(target=srv.shutdown) for srv in self._servers]  # each waits a poll
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        for srv in self._servers:
            srv.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: tuple[str, int]) -> None:  # type: ignore[override]
        """A scraper that gave up and closed is one line in the log, never a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            log.info(
                "twin http: %s:%s went away before its answer was sent (%s)", *client_address[:2], type(exc).__name__
            )
        else:
            log.exception("twin http: error answering %s:%s", *client_address[:2])


class _Handler(BaseHTTPRequestHandler):
    # Kept-alive connections, as the real exporters keep them (uvicorn for vLLM, Go's net/http for
    # DCGM): a scraper pays for one connection per target, not one per scrape. An idle one is
    # closed after a minute (its thread ends); errors close theirs (send_error says so).
    protocol_version = "HTTP/1.1"
    timeout = 60

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        path, _, query = self.path.partition("?")
        snapshot = getattr(self.server, "snapshot", None)
        feed = getattr(self.server, "feed", None)
        if path == "/moemeter/experts" and snapshot is not None:
            body, content_type = snapshot(), "application/json"
        elif path == "/moemeter/requests" and feed is not None:
            args = dict(urllib.parse.parse_qsl(query))
            try:
                after, limit = int(args.get("after", 0)), min(int(args.get("limit", 1000)), 5000)
            except ValueError:
                self.send_error(400, "after and limit must be integers")
                return
            body, content_type = feed(after, limit), "application/json"
        elif path == "/metrics":
            body, content_type = self.server.page().encode(), CONTENT_TYPE  # type: ignore[attr-defined]
        else:
            self.send_error(
                404, "only /metrics (/moemeter/experts on EPLB instances, /moemeter/requests on the gateway)"
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("twin http: " + format, *args)


def write_targets(targets: list[dict[str, object]], path: Path) -> None:
    """Write atomically, so a collector never reads half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(targets, indent=2) + "\n")
    tmp.replace(path)
