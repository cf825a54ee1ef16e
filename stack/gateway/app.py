"""The metering gateway: an OpenAI-compatible pass-through that attributes and measures each request.

POST /v1/completions and /v1/chat/completions are forwarded to one upstream (vllm-router in PD
mode, one vLLM, or any OpenAI-compatible server) with an X-Request-Id the gateway sets. Streams
ask the upstream for usage on every chunk (vLLM's `continuous_usage_stats`), so a client that hangs
up mid-stream is still metered for its prompt; what a client did not ask for (the running usage,
the final usage chunk) is taken out of what it reads. Each request ends as one RequestRecord: in
the durable log (GET /moemeter/requests, the collectors' feed) and in the /metrics summary. With
API keys required, those two carry every tenant's users and tokens and are served only on the
admin listener, never beside the API. The gateway never routes or retries; the router does.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from moemeter.contract.columns import MAX_COUNT, clean_text, is_token_count
from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import ANONYMOUS, RequestRecord

from .keys import Keys
from .metrics import GatewayMetrics
from .records import RecordLog

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 << 20
MAX_USER_CHARS = 256
MAX_IN_FLIGHT = 4096  # requests served at once; past it the gateway answers 429 with Retry-After
UPSTREAM_TIMEOUT = 600.0  # seconds a request may take upstream (`gateway --timeout`)
TOKENIZE_SECONDS = 10.0  # how long the upstream may take to count a cut-short stream's prompt
FEED_LIMIT = 5000
CLIENT_GONE = 499  # nginx's code for "client closed request"
# vLLM's request models declare `stream: bool | None`, so pydantic's lax bool decides what a value
# means (tests/fixtures/vllm-0.32.0-stream-field.json is vLLM's own answer for each value).
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_RESPONSE_ID = re.compile(rb'"id": ?"((?:chatcmpl|cmpl)-[^"\\]*)"')  # the first "id" of a response or chunk
# A chunk's usage: no JSON string holds `"usage":` (its quotes would be escaped), so a match is a
# key, and no object in vLLM's chunks but the chunk itself has one named "usage".
_USAGE_KEY = re.compile(r'(,\s*)?"usage"\s*:\s*(?=\{)')
_CHOICE_INDEX = re.compile(rb'"choices": ?\[\{"index": ?(\d+)[,}]')  # vLLM writes a choice's index first
_JSON = json.JSONDecoder()
_T = TypeVar("_T")


def _parse(parse: Callable[..., _T], *args: Any) -> _T:
    """`parse(*args)` on JSON from outside, with the cycle collector held off: a document nested to
    the recursion limit raises RecursionError there, and a finalizer the collector ran at that depth
    (an unrelated object's) would fail too, its error lost."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return parse(*args)
    finally:
        if collecting:
            gc.enable()


SLO_TTFT_HEADER = "x-slo-ttft-ms"
SLO_TPOT_HEADER = "x-slo-tpot-ms"
"""A request's own targets, in milliseconds (as llm-d reads x-llm-d-slo-ttft-ms and -tpot-ms): they
are recorded with it, and its attainment is judged by the tighter of each and its class's (by its
own alone where the class says own_targets: docs/definitions.md, "SLOs"). TPOT, time per output
token, is the mean inter-token latency."""
MAX_SLO_MS = 86_400_000.0


def slo_target(request: web.Request, header: str) -> float | None:
    """The target a request's header sets, in seconds; None without the header."""
    raw = request.headers.get(header)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not 0 < ms <= MAX_SLO_MS:  # NaN fails too
        raise Refused(
            400, "bad_slo_header", f"{header} must be a number of milliseconds above 0 and at most a day, got {raw!r}."
        )
    return ms / 1000


class Refused(Exception):
    """A request the gateway answers itself, with an OpenAI-style error body."""

    def __init__(
        self, status: int, outcome: str, message: str, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.outcome, self.message, self.kind, self.param = status, outcome, message, kind, param


def error_body(message: str, kind: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class OperatorOnly(MoemeterError, ValueError):
    """Keys are required and the operator endpoints were asked for beside the API."""


def stream_flag(value: object) -> bool:
    """What vLLM makes of a request's `stream` field: True/False, 0/1, or the strings pydantic takes
    for a bool; anything else is refused as vLLM refuses it."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise Refused(
        400, "bad_stream", f"stream: Input should be a valid boolean, not {json.dumps(value)[:40]}.", param="stream"
    )


def asked(value: object) -> bool:
    """Whether a request's flag (`stream_options.include_usage`, ...) is on, as vLLM reads a bool."""
    try:
        return stream_flag(value)
    except Refused:
        return False


@dataclass
class StreamTracker:
    """Follows an SSE stream event by event: token timings, usage, whether it ended properly."""

    started: float
    client_wants_usage: bool  # the final usage chunk goes on to the client
    client_wants_running_usage: bool = False  # ... and so does the usage on every chunk
    choices_per_prompt: int = 1  # the request's `n`: vLLM numbers choices prompt by prompt
    first: float | None = None
    last: float | None = None
    chunks: int = 0  # chunks that carried output
    gap_max: float = 0.0
    usage: dict[str, Any] | None = None  # the final usage chunk's, for the whole request
    running: dict[int, bytes | dict[str, Any]] | None = None  # choice index -> its latest chunk's usage
    done: bool = False  # the upstream sent [DONE]
    delivered: bool = False  # ... and it went on to the client
    upstream_error: str | None = None

    def event(self, raw: bytes, now: float) -> bytes | None:
        """Take one event; what of it goes on to the client, None for nothing."""
        data = raw[6:] if raw.startswith(b"data: ") and b"\n" not in raw else _data(raw)
        if not data:
            return raw
        if data == b"[DONE]":
            self.done = True
            return raw
        usage, rest = split_usage(data) if b'"usage"' in data else (None, data)
        out = raw if usage is None or self.client_wants_running_usage else b"data: " + rest
        quick = _token_chunk(rest)
        if quick is not None:  # the common case, decided without parsing the JSON
            if quick:
                self._token(now)
            if usage is not None:
                m = _CHOICE_INDEX.search(rest)
                if m is None:  # another server's formatting: read its index from the parsed chunk
                    return self._parsed(raw, rest, usage, out, now)
                self._running(int(m.group(1)), usage)
            return out
        return self._parsed(raw, rest, usage, out, now)

    def _parsed(
        self, raw: bytes, data: bytes, usage: bytes | dict[str, Any] | None, out: bytes, now: float
    ) -> bytes | None:
        try:
            chunk = _parse(json.loads, data)
        except (ValueError, RecursionError):
            return raw
        if not isinstance(chunk, dict):
            return raw
        if "error" in chunk:
            err = chunk["error"]
            self.upstream_error = str(err.get("message") if isinstance(err, dict) else err)
            return raw
        if usage is None and isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]  # not split out of the text: told apart below all the same
        choices = chunk.get("choices")
        if not choices:
            if usage is not None:
                self.usage = _usage_object(usage)
            return raw if self.client_wants_usage else None  # the usage chunk the gateway asked for
        if any(_carries_output(c) for c in choices if isinstance(c, dict)):
            self._token(now)
        if usage is not None:
            first = choices[0] if isinstance(choices, list) and isinstance(choices[0], dict) else {}
            index = first.get("index")
            self._running(index if isinstance(index, int) and index >= 0 else 0, usage)
        return out

    def _running(self, index: int, usage: bytes | dict[str, Any]) -> None:
        if self.running is None:
            self.running = {}
        self.running[index] = usage

    def running_tokens(self) -> tuple[int, int | None, int] | None:
        """(prompt, cached prompt or None, completion) from the latest usage of each choice, the
        upstream's count through the last chunk passed on; None without a valid one. A prompt is
        counted once for all its choices (choice i of a completions request is prompt i // n's)."""
        if not self.running:
            return None
        prompts: dict[int, tuple[int, int | None]] = {}
        completion = 0
        for index, usage in self.running.items():
            counted = usage_tokens(_usage_object(usage))
            if counted is None:
                return None
            prompts[index // self.choices_per_prompt] = counted[:2]
            completion += counted[2]
        cached = [c for _, c in prompts.values() if c is not None]
        total = sum(p for p, _ in prompts.values()), (sum(cached) if cached else None), completion
        return total if all(n is None or n <= MAX_COUNT for n in total) else None

    def _token(self, now: float) -> None:
        if self.first is None:
            self.first = now
        elif self.last is not None:
            self.gap_max = max(self.gap_max, now - self.last)
        self.last = now
        self.chunks += 1


def _data(raw: bytes) -> bytes:
    return b"".join(line[5:].strip() for line in raw.splitlines() if line.startswith(b"data:"))


def split_usage(data: bytes) -> tuple[bytes | None, bytes]:
    """A chunk's usage object, as JSON text, and the chunk without it; (None, data) when it has
    none. Every chunk of a stream carries one now, so it is cut out of the text, not parsed (it is
    when the stream ends without a final usage): vLLM's running usage is a flat object of counts;
    a nested one (the final usage's prompt_tokens_details) or another server's formatting is found
    by the JSON decoder."""
    at = data.rfind(b',"usage":{')
    if at >= 0:
        end = data.find(b"}", at)
        if end > 0 and data.find(b"{", at + 10, end) < 0 and data.find(b':"', at + 10, end) < 0:
            return data[at + 9 : end + 1], data[:at] + data[end + 1 :]
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None, data
    m = _USAGE_KEY.search(text)
    if m is None:
        return None, data
    try:
        _, end = _parse(_JSON.raw_decode, text, m.end())
    except (ValueError, RecursionError):
        return None, data
    usage = text[m.end() : end].encode()
    if m.group(1) is None:  # the first key: the comma after it goes with it
        tail = text[end:].lstrip()
        end = len(text) - len(tail[1:].lstrip()) if tail.startswith(",") else end
    return usage, (text[: m.start()] + text[end:]).encode()


def _usage_object(usage: bytes | dict[str, Any]) -> dict[str, Any] | None:
    if isinstance(usage, dict):
        return usage
    try:
        parsed = _parse(json.loads, usage)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _token_chunk(data: bytes) -> bool | None:
    """Whether a compact-JSON chunk (vLLM's pydantic dumps) carries output, from its bytes; None when
    it needs parsing: usage or error chunks, tool calls, reasoning, or another server's formatting."""
    if (
        b'"usage":{' in data
        or b'"error"' in data
        or b'"choices":[]' in data
        or b'"tool_calls"' in data
        or b'"reasoning' in data
    ):
        return None
    if b'"text":"' in data:
        return b'"text":""' not in data
    if b'"content":"' in data:
        return b'"content":""' not in data
    return None


def _carries_output(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(
            delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls")
        )
    return False


def usage_tokens(usage: dict[str, Any] | None) -> tuple[int, int | None, int] | None:
    """(prompt, cached prompt or None, completion) from an OpenAI usage object."""
    if not isinstance(usage, dict):
        return None
    try:
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        counts = prompt, (int(cached) if cached is not None else None), completion
    except (TypeError, ValueError, OverflowError):
        return None
    if not all(0 <= n <= MAX_COUNT for n in counts if n is not None):
        log.warning("upstream usage %s is not a count of tokens: ignored", json.dumps(usage)[:200])
        return None
    return counts


def public_ids(
    data: bytes, request_id: str, known: tuple[bytes, bytes] | None = None
) -> tuple[bytes, tuple[bytes, bytes] | None]:
    """`data` with the upstream's response id replaced by the one clients see (its prefix and the
    gateway's request id: vllm-router's ids name internal addresses), and the (upstream, public)
    pair for the next chunks of the same stream."""
    if known is None:
        m = _RESPONSE_ID.search(data)
        if m is None:
            return data, None
        upstream = m.group(1)
        known = (upstream, upstream.split(b"-", 1)[0] + b"-" + request_id.encode())
    return (data.replace(*known) if known[0] != known[1] else data), known


def _openai_error(data: bytes) -> bool:
    """Whether a body is an OpenAI-style error object (vLLM's own 4xx answers are)."""
    try:
        body = _parse(json.loads, data)
    except (ValueError, RecursionError):
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


@dataclass
class _Call:
    """One request on its way through: its record and, once the upstream streams, the stream's tracker."""

    rec: RequestRecord
    t0: float
    tracker: StreamTracker | None = None
    body: dict[str, Any] | None = None  # as forwarded upstream: what /tokenize is asked to count

    def prompt_unmetered(self) -> bool:
        """A stream cut short before any usage reached the gateway: its prompt is yet to be counted."""
        return self.tracker is not None and not self.rec.usage_reported and self.body is not None

    def delivered(self) -> bool:
        """The client has had the whole answer: the upstream's [DONE] went on to it."""
        return self.tracker is not None and self.tracker.delivered


class Gateway:
    def __init__(
        self,
        upstream: str,
        records: RecordLog,
        keys: Keys | None = None,
        metrics: GatewayMetrics | None = None,
        timeout: float = UPSTREAM_TIMEOUT,
        read_timeout: float = 120.0,
        connect_timeout: float = 5.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        upstream_key: str | None = None,
        models_ttl: float = 30.0,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.records = records
        self.keys = keys or Keys()
        self.metrics = metrics or GatewayMetrics()
        self.metrics.records_pending = lambda: self.records.pending
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)
        self.timeout = aiohttp.ClientTimeout(total=timeout, connect=connect_timeout, sock_read=read_timeout)
        self.max_body_bytes = max_body_bytes
        self.upstream_key = upstream_key
        self.models_ttl = models_ttl
        self.max_in_flight = max_in_flight
        self._counting: set[asyncio.Task[None]] = set()  # cut-short streams whose prompts are being counted
        self._models: tuple[float, set[str] | None] = (0.0, None)
        self.session: aiohttp.ClientSession | None = None
        # request ids: 16 hex digits this process draws, then a count of its requests. Two gateways'
        # ids, or one's before and after a restart, never meet, and the warehouse stores the count
        # as a number that packs in about 2 bytes, where a random UUID's 32 digits took 17.6.
        self._id_prefix, self._ids = f"{uuid.uuid4().hex[:16]}-", itertools.count(1)

    # ------------------------------------------------------------------ app
    def app(self, serving: bool = True, admin: bool = True) -> web.Application:
        """The OpenAI API (`serving`) and the operator endpoints (`admin`: /metrics, the request feed,
        /health), on one port or, apart, on two: per-user records are not for API clients' eyes.
        With keys required, /metrics and the feed beside the API answer 403 to everyone: no tenant's
        key opens every tenant's records, and the collectors read them on the admin listener."""
        app = web.Application(client_max_size=self.max_body_bytes)
        if serving:
            app.router.add_post("/v1/completions", self._completions)
            app.router.add_post("/v1/chat/completions", self._chat)
            app.router.add_get("/v1/models", self._list_models)
            app.on_startup.append(self._start)
            app.on_cleanup.append(self._stop)
        if admin:
            apart = not (serving and self.keys.require_key)
            app.router.add_get("/metrics", self._metrics if apart else self._operator_only)
            app.router.add_get("/moemeter/requests", self._feed if apart else self._operator_only)
            app.router.add_get("/health", self._health)
        return app

    async def _operator_only(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "error": f"{request.path} carries every tenant's records: with API keys required it is "
                "served only on the gateway's admin listener (--admin-port), not beside the API"
            },
            status=403,
        )

    async def _start(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def _stop(self, app: web.Application) -> None:
        if self._counting:  # cut-short streams whose records wait for their prompt's count
            await asyncio.wait(set(self._counting), timeout=TOKENIZE_SECONDS)
        if self.session is not None:
            await self.session.close()
        await asyncio.to_thread(self.records.close)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "ok": True,
                "upstream": self.upstream,
                "records_written": self.records.written,
                "records_failed": self.records.failed,
                "records_pending": self.records.pending,
            }
        )

    async def _feed(self, request: web.Request) -> web.Response:
        try:
            after = int(request.query.get("after", "0"))
            limit = min(int(request.query.get("limit", "1000")), FEED_LIMIT)
        except ValueError:
            return web.json_response({"error": "after and limit must be integers"}, status=400)
        if after < 0 or limit <= 0:
            return web.json_response({"error": "after must be >= 0 and limit > 0"}, status=400)
        return web.json_response(await asyncio.to_thread(self.records.page, after, limit))

    async def _list_models(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        try:
            async with self.session.get(
                self.upstream + "/v1/models",
                headers=self._upstream_headers(None),
                timeout=aiohttp.ClientTimeout(total=10),
            ) as up:
                return web.Response(body=await up.read(), status=up.status, content_type="application/json")
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("GET %s/v1/models failed: %r", self.upstream, exc)
            return web.json_response(
                error_body("The upstream is unavailable.", "upstream_error", "upstream_unavailable"), status=502
            )

    async def known_models(self) -> set[str] | None:
        """The upstream's model ids, cached; None when it cannot say (the upstream then decides)."""
        at, models = self._models
        if models is not None and time.monotonic() - at < self.models_ttl:
            return models
        assert self.session is not None
        try:
            async with self.session.get(
                self.upstream + "/v1/models",
                headers=self._upstream_headers(None),
                timeout=aiohttp.ClientTimeout(total=5),
            ) as up:
                if up.status != 200:
                    return None
                data = _parse(json.loads, await up.read())
            models = {str(m["id"]) for m in data.get("data", []) if isinstance(m, dict) and "id" in m}
        except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError, AttributeError, TypeError):
            return None
        self._models = (time.monotonic(), models)
        return models

    def _upstream_headers(self, request_id: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if request_id:
            headers["X-Request-Id"] = request_id
        if self.upstream_key:
            headers["Authorization"] = f"Bearer {self.upstream_key}"
        return headers

    # ------------------------------------------------------------ requests
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "completions")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._proxy(request, "chat/completions")

    def _attribute(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        tenant = self.keys.tenant_for(key)
        if tenant is None and self.keys.require_key:
            what = "an unknown API key" if key else "no API key"
            raise Refused(
                401,
                "unauthorized",
                f"This gateway requires an API key; the request had {what}.",
                "authentication_error",
            )
        return tenant or ANONYMOUS

    async def _read_body(self, request: web.Request) -> dict[str, Any]:
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            raise Refused(
                413,
                "body_too_large",
                f"Request body of {request.content_length} bytes is over the "
                f"gateway's limit of {self.max_body_bytes} bytes.",
            )
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise Refused(
                413, "body_too_large", f"Request body is over the gateway's limit of {self.max_body_bytes} bytes."
            ) from exc
        try:
            body = _parse(json.loads, raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refused(400, "bad_json", f"The request body is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise Refused(400, "bad_json", "The request body is nested too deeply.") from exc
        if not isinstance(body, dict):
            raise Refused(400, "bad_json", "The request body must be a JSON object.")
        return body

    async def _proxy(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        t0 = time.monotonic()
        rec = RequestRecord(
            request_id=f"{self._id_prefix}{next(self._ids)}",
            started_at=time.time(),
            user=ANONYMOUS,
            tenant=ANONYMOUS,
            model="",
            endpoint=endpoint,
            stream=False,
            status=200,
            outcome="ok",
        )
        call = _Call(rec, t0)
        self.metrics.in_flight += 1
        try:
            try:
                rec.tenant = rec.user = self._attribute(request)
                rec.slo_ttft_seconds = slo_target(request, SLO_TTFT_HEADER)
                rec.slo_itl_seconds = slo_target(request, SLO_TPOT_HEADER)
                if self.metrics.in_flight > self.max_in_flight:
                    raise Refused(
                        429,
                        "overloaded",
                        f"The gateway is serving {self.max_in_flight} requests; retry shortly.",
                        "server_error",
                    )
                body = await self._read_body(request)
                user = body.get("user")
                if isinstance(user, str) and user.strip():
                    rec.user = clean_text(user.strip()[:MAX_USER_CHARS])
                rec.stream = stream_flag(body.get("stream"))
                model = body.get("model")
                if not isinstance(model, str) or not model:
                    raise Refused(400, "missing_model", "You must provide a model parameter.", param="model")
                rec.model = clean_text(model[:MAX_USER_CHARS])
                models = await self.known_models()
                if models is not None and model not in models:
                    raise Refused(404, "unknown_model", f"The model `{rec.model}` does not exist.", param="model")
                if "stream" in body:
                    body = {**body, "stream": rec.stream}  # what vLLM would make of it, as a JSON boolean
                return await self._forward(request, body, call)
            except Refused as r:
                rec.status, rec.outcome = r.status, r.outcome
                headers = {"X-Request-Id": rec.request_id, **({"Retry-After": "1"} if r.status == 429 else {})}
                return web.json_response(
                    error_body(r.message, r.kind, r.outcome, r.param), status=r.status, headers=headers
                )
        except (asyncio.CancelledError, ConnectionResetError):
            if not call.delivered():  # a client that closes after [DONE] got the whole answer
                rec.status, rec.outcome = CLIENT_GONE, "client_disconnect"
            raise
        except Exception:
            log.exception("request %s failed inside the gateway", rec.request_id)
            rec.status, rec.outcome = 500, "gateway_error"
            return web.json_response(
                error_body("The gateway failed on this request.", "server_error", "gateway_error"),
                status=500,
                headers={"X-Request-Id": rec.request_id},
            )
        finally:
            rec.e2e_seconds = time.monotonic() - t0
            if call.prompt_unmetered():  # the record is appended once the upstream has counted the prompt
                task = asyncio.create_task(self._count_prompt_then_record(call))
                self._counting.add(task)
                task.add_done_callback(self._counting.discard)
            else:
                self._record(rec)

    def _record(self, rec: RequestRecord) -> None:
        self.metrics.observe(rec)
        self.records.append(rec)
        self.metrics.in_flight -= 1  # last: no request in flight means every record is appended

    async def _count_prompt_then_record(self, call: _Call) -> None:
        """A stream cut short before any usage came (vllm-router 0.1.17 drops continuous_usage_stats
        from the request it passes on): the upstream's own tokenizer counts the prompt
        (`POST /tokenize`, which vLLM serves and vllm-router passes on), and the record says so
        (usage_reported true, cached prompt tokens unknown). Where the upstream cannot count it,
        the prompt stays unmetered (usage_reported false)."""
        rec, body = call.rec, call.body or {}
        ask: dict[str, Any] = {"model": body.get("model")}
        if rec.endpoint == "chat/completions":
            ask.update(messages=body.get("messages"), add_generation_prompt=True)
        else:
            ask["prompt"] = body.get("prompt")
        try:
            assert self.session is not None
            async with self.session.post(
                self.upstream + "/tokenize",
                data=json.dumps(ask).encode(),
                headers=self._upstream_headers(rec.request_id),
                timeout=aiohttp.ClientTimeout(total=TOKENIZE_SECONDS),
            ) as up:
                count = _parse(json.loads, await up.read()).get("count") if up.status == 200 else None
            if is_token_count(count):
                rec.prompt_tokens, rec.cached_prompt_tokens, rec.usage_reported = count, None, True
        except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError, AttributeError, AssertionError) as exc:
            log.warning("request %s: the upstream could not count its prompt: %r", rec.request_id, exc)
        finally:
            self._record(rec)

    async def _forward(self, request: web.Request, body: dict[str, Any], call: _Call) -> web.StreamResponse:
        assert self.session is not None
        rec = call.rec
        raw = body.get("stream_options")
        opts: dict[str, Any] = raw if isinstance(raw, dict) else {}
        client_wants_usage = asked(opts.get("include_usage"))
        client_wants_running = client_wants_usage and asked(opts.get("continuous_usage_stats"))  # vLLM's rule
        if rec.stream:  # usage on every chunk: what a client that hangs up mid-stream consumed
            body = {**body, "stream_options": {**opts, "include_usage": True, "continuous_usage_stats": True}}
        n = body.get("n")
        choices_per_prompt = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
        url = f"{self.upstream}/v1/{rec.endpoint}"
        try:
            async with self.session.post(
                url,
                data=json.dumps(body).encode(),
                headers=self._upstream_headers(rec.request_id),
                timeout=self.timeout,
            ) as up:
                # Streaming is what the upstream does, whatever the request said: meter what it sends.
                if up.status != 200 or up.content_type != "text/event-stream":
                    return await self._whole(up, rec)
                wanted, rec.stream = rec.stream, True  # usage it was not asked for goes on to the client
                call.tracker = StreamTracker(
                    call.t0,
                    client_wants_usage=client_wants_usage or not wanted,
                    client_wants_running_usage=client_wants_running or not wanted,
                    choices_per_prompt=choices_per_prompt,
                )
                call.body = body
                return await self._stream(request, up, rec, call.tracker)
        except TimeoutError as exc:
            log.warning("request %s: %s did not answer in time", rec.request_id, url)
            raise Refused(504, "upstream_timeout", "The upstream did not answer in time.", "upstream_error") from exc
        except aiohttp.ClientConnectorError as exc:
            log.warning("request %s: cannot reach %s: %s", rec.request_id, self.upstream, exc.os_error)
            raise Refused(502, "upstream_unavailable", "Cannot reach the upstream.", "upstream_error") from exc
        except aiohttp.ClientError as exc:
            log.warning("request %s: the upstream %s failed: %r", rec.request_id, self.upstream, exc)
            raise Refused(502, "upstream_error", "The upstream failed.", "upstream_error") from exc

    async def _whole(self, up: aiohttp.ClientResponse, rec: RequestRecord) -> web.Response:
        data = await up.read()
        rec.status = up.status
        if up.status != 200:
            rec.outcome = "upstream_4xx" if up.status < 500 else "upstream_5xx"
            if not _openai_error(data):  # vLLM's own errors go on; a router's plain-text 500 names internal URLs
                log.warning("request %s: upstream answered HTTP %d: %r", rec.request_id, up.status, data[:300])
                kind = "upstream_error" if up.status >= 500 else "invalid_request_error"
                return web.json_response(
                    error_body(f"The upstream answered HTTP {up.status}.", kind, rec.outcome),
                    status=up.status,
                    headers={"X-Request-Id": rec.request_id},
                )
        else:
            try:
                counted = usage_tokens(_parse(json.loads, data).get("usage"))
            except (ValueError, AttributeError, RecursionError):
                counted = None
            if counted:
                rec.prompt_tokens, rec.cached_prompt_tokens, rec.generated_tokens = counted
                rec.usage_reported = True
            data, _ = public_ids(data, rec.request_id)
        headers = {"X-Request-Id": rec.request_id}
        return web.Response(
            body=data, status=up.status, headers=headers, content_type=up.content_type or "application/json"
        )

    async def _stream(
        self, request: web.Request, up: aiohttp.ClientResponse, rec: RequestRecord, tr: StreamTracker
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Request-Id": rec.request_id},
        )
        await resp.prepare(request)
        try:
            try:
                buf, sep = b"", b""
                ids: tuple[bytes, bytes] | None = None
                async for data in up.content.iter_any():  # whatever arrived: one or many events, or part of one
                    buf += data
                    if not sep:
                        sep = b"\r\n\r\n" if b"\r\n\r\n" in buf else b"\n\n" if b"\n\n" in buf else b""
                        if not sep:
                            continue
                    *events, buf = buf.split(sep)
                    if events:
                        now = time.monotonic()
                        kept = [passed + sep for e in events if (passed := tr.event(e, now)) is not None]
                        if kept:
                            out, ids = public_ids(b"".join(kept), rec.request_id, ids)
                            await resp.write(out)
                        tr.delivered = tr.done  # the client has the whole answer, whenever it closes now
                if buf.strip() and (passed := tr.event(buf, time.monotonic())) is not None:
                    await resp.write(public_ids(passed, rec.request_id, ids)[0])
                    tr.delivered = tr.done
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, TimeoutError) as exc:
                if not tr.delivered:  # after [DONE] the answer is whole; only the connection's end was untidy
                    rec.outcome = "upstream_timeout" if isinstance(exc, TimeoutError) else "upstream_dropped"
                    log.warning("request %s: the upstream stream ended early: %r", rec.request_id, exc)
                    await resp.write(
                        b"data: "
                        + json.dumps(
                            error_body("The upstream stream ended early.", "upstream_error", rec.outcome)
                        ).encode()
                        + b"\n\n"
                    )
            else:
                if tr.upstream_error is not None:
                    rec.outcome = "upstream_stream_error"
                elif not tr.done:
                    rec.outcome = "upstream_dropped"
                    await resp.write(
                        b"data: "
                        + json.dumps(
                            error_body("The upstream closed the stream before [DONE].", "upstream_error", rec.outcome)
                        ).encode()
                        + b"\n\n"
                    )
            try:
                await resp.write_eof()
            except ConnectionResetError:
                if not tr.delivered:
                    raise
        finally:
            _finish_stream(rec, tr)
        return resp


def _finish_stream(rec: RequestRecord, tr: StreamTracker) -> None:
    """The stream's counts: the upstream's final usage; else, when the stream was cut short (the
    client hung up, the upstream dropped it), its latest running usage; else the output chunks
    that reached the client, and the prompt unmetered (usage_reported false)."""
    counted = usage_tokens(tr.usage) if tr.usage is not None else tr.running_tokens()
    if counted:
        rec.prompt_tokens, rec.cached_prompt_tokens, rec.generated_tokens = counted
        rec.usage_reported = True
    else:
        rec.generated_tokens = tr.chunks  # what reached the client, one token per chunk
    if tr.first is not None:
        rec.ttft_seconds = tr.first - tr.started
        if tr.last is not None and rec.generated_tokens > 1 and tr.last > tr.first:
            rec.itl_mean_seconds = (tr.last - tr.first) / (rec.generated_tokens - 1)
            rec.itl_max_seconds = tr.gap_max
            rec.decode_tokens_per_second = 1.0 / rec.itl_mean_seconds


async def serve(
    gateway: Gateway, host: str, port: int, stop: asyncio.Event, admin: tuple[str, int] | None = None
) -> None:
    """Run until `stop` is set. Client disconnects cancel the handler, which closes the upstream request.
    With `admin` (host, port), /metrics, the request feed and /health are served there and not on `port`;
    with keys required, it must be given."""
    if gateway.keys.require_key and admin is None:
        raise OperatorOnly(
            "the keys file requires API keys, so the request feed and /metrics (every tenant's users and "
            "tokens) are served only apart from the API: give --admin-port (the collectors' gateway target "
            "is then http://ADMIN-HOST:ADMIN-PORT/metrics)"
        )
    apps = [(gateway.app(admin=admin is None), host, port)]
    if admin is not None:
        apps.append((gateway.app(serving=False), *admin))
    runners = []
    try:
        for app, h, p in apps:
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, h, p, backlog=1024).start()
        log.info(
            "gateway on http://%s:%d -> %s%s",
            host,
            port,
            gateway.upstream,
            f"; metrics and request feed on http://{admin[0]}:{admin[1]}" if admin else "",
        )
        await stop.wait()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()
