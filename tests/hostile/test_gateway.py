"""The metering gateway against clients that hang up mid-stream and readers of its feed without a key.

A streaming client that closes its connection is metered for its prompt from the upstream's
running usage (vLLM's `stream_options.continuous_usage_stats`, which the gateway asks for on every
stream and takes out of what a client that did not ask for it reads); where no usage came, the
record says the prompt went unmetered. With `require_key`, the request feed (every tenant's users
and tokens) is served on the admin listener only. Real clients: httpx and the `openai` SDK
closing a stream, a raw socket where the client must hang up before any answer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from collectors.requests import fetch_feed
from collectors.scrape import http_fetch
from moemeter.contract import TargetInfo
from stack.gateway.app import Gateway, OperatorOnly, StreamTracker, serve, split_usage
from stack.gateway.keys import Keys, hash_key
from stack.gateway.records import RecordLog
from stack.twin.upstream import SimulatedUpstream
from tests.e2e.test_browser import free_port
from tests.stack.gateway.conftest import LoopThread, Rig, start_rig
from tests.stack.gateway.test_app import records, sse_chunks

SLOW = 0.05  # seconds between tokens: a stream of 200 outlasts any client here that hangs up
PROMPT = "one two three four five"  # 5 tokens to the twin
SECRET = "sk-acme-0123456789abcdef"


def body(endpoint: str, **extra: object) -> dict[str, object]:
    text = {"prompt": PROMPT} if endpoint == "completions" else {"messages": [{"role": "user", "content": PROMPT}]}
    return {"model": "twin-moe", **text, "max_tokens": 200, "stream": True, "twin_itl_seconds": SLOW, **extra}


def read_then_hang_up(url: str, payload: dict[str, object], events: int | None) -> list[Any]:
    """POST a stream with httpx, read `events` data events (None: up to [DONE]), close the connection."""
    got: list[Any] = []
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=payload) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                got.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                if len(got) == events or got[-1] == "[DONE]":
                    break
    return got


def wait_for(what: str, done: object, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"after {within} s: {what}"
        time.sleep(0.01)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = start_rig(tmp_path)
    yield r
    r.loop.close()


# ------------------------------------------------------------------ streams cut short by the client
@pytest.mark.integration
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_client_that_hangs_up_mid_stream_is_metered_for_its_prompt(rig: Rig, endpoint: str) -> None:
    got = read_then_hang_up(f"{rig.url}/v1/{endpoint}", body(endpoint, user="carol"), events=3)
    assert all("usage" not in c for c in got)  # the running usage it did not ask for is not in its chunks
    [rec] = records(rig)
    assert (rec["user"], rec["status"], rec["outcome"]) == ("carol", 499, "client_disconnect")
    assert (rec["prompt_tokens"], rec["usage_reported"]) == (5, True)  # the upstream's count, not a guess
    assert rec["cached_prompt_tokens"] is None  # running usage has no prompt_tokens_details
    assert 2 <= rec["generated_tokens"] < 200  # through the last chunk passed on (chat: a role chunk first)


@pytest.mark.integration
def test_the_openai_sdk_closing_a_stream_midway_is_metered_for_its_prompt(rig: Rig) -> None:
    client = openai.OpenAI(base_url=rig.url + "/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(
        model="twin-moe", prompt=PROMPT, max_tokens=200, stream=True, extra_body={"twin_itl_seconds": SLOW}
    )
    seen = list(itertools.islice(stream, 4))
    stream.close()
    assert all(c.usage is None for c in seen)
    [rec] = records(rig)
    assert (rec["outcome"], rec["prompt_tokens"], rec["usage_reported"]) == ("client_disconnect", 5, True)
    assert 4 <= rec["generated_tokens"] < 200


@pytest.mark.integration
def test_a_client_that_hangs_up_before_the_first_chunk_leaves_its_prompt_unmetered(tmp_path: Path) -> None:
    """No usage came before the hang-up: the record says so (usage_reported false, no count made up)."""
    rig = start_rig(tmp_path, upstream=SimulatedUpstream(model="twin-moe", ttft_seconds=3600))
    payload = json.dumps(body("completions"))
    port = int(rig.url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n{payload}".encode()
            )
            wait_for("the request never reached the upstream", lambda: rig.upstream.requests == 1)
        [rec] = records(rig)
    finally:
        rig.loop.close()
    assert (rec["status"], rec["outcome"], rec["stream"]) == (499, "client_disconnect", True)
    assert (rec["usage_reported"], rec["prompt_tokens"], rec["generated_tokens"]) == (False, 0, 0)


@pytest.mark.integration
def test_a_client_that_hangs_up_at_done_was_served_whole_and_read_no_usage(rig: Rig) -> None:
    payload = {**body("completions", twin_fault="linger-after-done"), "max_tokens": 4, "twin_itl_seconds": 0}
    got = read_then_hang_up(rig.url + "/v1/completions", payload, events=None)
    assert got[-1] == "[DONE]" and len(got) == 5
    assert all(c == "[DONE]" or (c["choices"] and "usage" not in c) for c in got)
    [rec] = records(rig)
    assert (rec["status"], rec["outcome"], rec["usage_reported"]) == (200, "ok", True)
    assert (rec["prompt_tokens"], rec["cached_prompt_tokens"], rec["generated_tokens"]) == (5, 0, 4)


@pytest.mark.integration
def test_an_upstream_without_running_usage_has_the_prompt_of_a_hang_up_counted(tmp_path: Path) -> None:
    """vllm-router 0.1.17 drops continuous_usage_stats from what it passes on (seen on the local
    stack: tests/integration/test_localstack.py): the upstream's own /tokenize counts the prompt."""
    upstream = SimulatedUpstream(model="twin-moe", continuous_usage_stats=False)
    rig = start_rig(tmp_path, upstream=upstream)
    try:
        read_then_hang_up(rig.url + "/v1/completions", body("completions"), events=3)
        [rec] = records(rig)
    finally:
        rig.loop.close()
    assert (rec["status"], rec["outcome"]) == (499, "client_disconnect")
    words = len(str(body("completions")["prompt"]).split())
    assert (rec["usage_reported"], rec["prompt_tokens"], rec["cached_prompt_tokens"]) == (True, words, None)
    assert 3 <= rec["generated_tokens"] < 200


@pytest.mark.integration
def test_an_upstream_without_running_usage_or_tokenize_leaves_a_hung_up_prompt_unmetered(tmp_path: Path) -> None:
    """A server with neither: nothing to meter the prompt by, and the record says so."""
    upstream = SimulatedUpstream(model="twin-moe", continuous_usage_stats=False, tokenize=False)
    rig = start_rig(tmp_path, upstream=upstream)
    try:
        read_then_hang_up(rig.url + "/v1/completions", body("completions"), events=3)
        [rec] = records(rig)
    finally:
        rig.loop.close()
    assert (rec["status"], rec["outcome"]) == (499, "client_disconnect")
    assert (rec["usage_reported"], rec["prompt_tokens"], rec["cached_prompt_tokens"]) == (False, 0, None)
    assert 3 <= rec["generated_tokens"] < 200  # the chunks delivered, counted


@pytest.mark.integration
@pytest.mark.parametrize(
    ("options", "running"),
    [
        (None, False),
        ({"include_usage": True}, False),
        ({"include_usage": True, "continuous_usage_stats": True}, True),
        ({"continuous_usage_stats": True}, False),  # vLLM: no running usage without include_usage
        ({"include_usage": "false", "continuous_usage_stats": "true"}, False),  # pydantic's lax bools
        ({"include_usage": "yes", "continuous_usage_stats": 1}, True),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict | None) else "",
)
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_client_reads_the_usage_it_asked_for_and_no_more(
    rig: Rig, endpoint: str, options: dict | None, running: bool
) -> None:
    """Through the gateway, which asks for usage on every chunk, a client reads what vLLM's rules
    give it for its own stream_options: the twin's direct answer, chunk for chunk."""
    payload = {**body(endpoint), "max_tokens": 4, "twin_itl_seconds": 0}
    if options is not None:
        payload["stream_options"] = options
    through = httpx.post(f"{rig.url}/v1/{endpoint}", json=payload)
    direct = httpx.post(f"{rig.gateway.upstream}/v1/{endpoint}", json=payload, headers={"X-Request-Id": "x"})
    rid = through.headers["X-Request-Id"]
    gateway: list[Any] = sse_chunks(through.text)
    same = [c if c == "[DONE]" else {**c, "created": 0} for c in gateway]
    vllm: list[Any] = sse_chunks(direct.text)
    assert same == [c if c == "[DONE]" else {**c, "created": 0, "id": c["id"].replace("-x", f"-{rid}")} for c in vllm]
    assert running == any(c != "[DONE]" and c["choices"] and "usage" in c for c in same)
    [rec] = records(rig)
    assert (rec["outcome"], rec["prompt_tokens"], rec["generated_tokens"], rec["usage_reported"]) == ("ok", 5, 4, True)


@pytest.mark.integration
def test_a_client_that_asked_for_running_usage_and_hangs_up_reads_it_and_is_metered(rig: Rig) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    got = read_then_hang_up(rig.url + "/v1/completions", body("completions", stream_options=options), events=3)
    assert [c["usage"]["completion_tokens"] for c in got] == [1, 2, 3]
    [rec] = records(rig)
    assert (rec["outcome"], rec["prompt_tokens"], rec["usage_reported"]) == ("client_disconnect", 5, True)


# ------------------------------------------------------------------ the running usage, read from bytes
def chunk(usage: dict | None = None, index: int = 0, text: str = " t") -> bytes:
    c: dict[str, object] = {"id": "cmpl-1", "choices": [{"index": index, "text": text, "finish_reason": None}]}
    if usage is not None:
        c["usage"] = usage
    return json.dumps(c, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    "data",
    [
        chunk({"prompt_tokens": 9, "total_tokens": 10, "completion_tokens": 1}),  # vLLM's: last, flat
        b'{"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1},"id":"cmpl-1","choices":[]}',
        b'{"id": "cmpl-1", "usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}}, "n": 1}',
    ],
)
def test_usage_is_cut_out_of_a_chunk_leaving_valid_json(data: bytes) -> None:
    usage, rest = split_usage(data)
    assert usage is not None and json.loads(usage)["prompt_tokens"] == 9
    without = json.loads(rest)
    assert without == {k: v for k, v in json.loads(data).items() if k != "usage"}


def test_usage_inside_generated_text_is_text() -> None:
    """A model that writes `,"usage":{...}` writes it in a JSON string, escaped: not a usage object."""
    data = chunk(text=',"usage":{"prompt_tokens":1}}')
    assert split_usage(data) == (None, data)
    tr = StreamTracker(0.0, client_wants_usage=False)
    assert tr.event(b"data: " + data, 1.0) == b"data: " + data and tr.running is None


def test_running_usage_counts_each_prompt_once_across_its_choices() -> None:
    """A completions request of 2 prompts with n=2 (choices 0, 1 of the first, 2, 3 of the second)
    cut short: each prompt counted once, every choice's tokens so far."""
    tr = StreamTracker(0.0, client_wants_usage=False, choices_per_prompt=2)
    for index, prompt, done in [(0, 7, 1), (1, 7, 1), (2, 4, 1), (0, 7, 2), (3, 4, 3)]:
        out = tr.event(b"data: " + chunk({"prompt_tokens": prompt, "completion_tokens": done}, index), 1.0)
        assert out is not None and b"usage" not in out
    assert tr.running_tokens() == (7 + 4, None, 2 + 1 + 1 + 3)


def test_running_usage_that_is_not_a_count_meters_nothing() -> None:
    tr = StreamTracker(0.0, client_wants_usage=False)
    tr.event(b"data: " + chunk({"prompt_tokens": -5, "completion_tokens": 1}), 1.0)
    assert tr.running is not None and tr.running_tokens() is None


# ------------------------------------------------------------------ the feed with keys required
@pytest.mark.integration
def test_with_keys_required_the_feed_beside_the_api_answers_no_one(tmp_path: Path) -> None:
    """Not without a key, and not with a tenant's: its key is for its own requests, not everyone's records."""
    rig = start_rig(tmp_path, keys=Keys(require_key=True, tenants={hash_key(SECRET): "acme"}))
    auth = {"Authorization": f"Bearer {SECRET}"}
    try:
        ok = httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a"}, headers=auth)
        assert ok.status_code == 200
        rig.flush()
        answers = [
            httpx.get(rig.url + path, headers=headers)
            for path in ("/moemeter/requests", "/moemeter/requests?after=0&limit=10", "/metrics")
            for headers in ({}, auth)
        ]
    finally:
        rig.loop.close()
    assert [r.status_code for r in answers] == [403] * 6
    assert all("records" not in r.json() and "acme" not in r.text for r in answers)
    assert "--admin-port" in answers[0].json()["error"]


@pytest.mark.integration
def test_with_keys_required_the_collectors_read_the_feed_on_the_admin_listener(tmp_path: Path) -> None:
    loop = LoopThread()
    up = SimulatedUpstream(model="twin-moe")
    up_port, port, admin = free_port(), free_port(), free_port()
    loop.serve(up.app(), up_port)
    keys = Keys(require_key=True, tenants={hash_key(SECRET): "acme"})
    gw = Gateway(f"http://127.0.0.1:{up_port}", RecordLog(tmp_path / "r.sqlite", batch_seconds=0.01), keys=keys)
    stop = asyncio.Event()
    task = asyncio.run_coroutine_threadsafe(serve(gw, "127.0.0.1", port, stop, ("127.0.0.1", admin)), loop.loop)
    api, operator = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"

    def answers() -> bool:
        try:
            return httpx.get(operator + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    async def collect() -> list[dict]:
        async with http_fetch() as fetch:
            result = await fetch_feed(TargetInfo("gateway", operator + "/metrics", "gateway", 0), None, fetch, 5.0)
        assert result.error is None, result.error
        return [r for page in result.pages for r in page["records"]]

    try:
        wait_for("the admin listener never answered", answers)
        auth = {"Authorization": f"Bearer {SECRET}"}
        ok = httpx.post(api + "/v1/completions", json={"model": "twin-moe", "prompt": "a b"}, headers=auth)
        assert ok.status_code == 200
        assert httpx.get(api + "/moemeter/requests", headers=auth).status_code == 404  # not beside the API
        wait_for("the request's record never became durable", lambda: gw.records.written == 1)
        got = asyncio.run(collect())
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        task.result(10)
        loop.close()
    assert [(r["tenant"], r["outcome"], r["prompt_tokens"]) for r in got] == [("acme", "ok", 2)]


def test_with_keys_required_the_gateway_will_not_serve_the_feed_beside_the_api(tmp_path: Path) -> None:
    records = RecordLog(tmp_path / "r.sqlite")
    gw = Gateway("http://127.0.0.1:9", records, keys=Keys(require_key=True, tenants={hash_key(SECRET): "acme"}))
    try:
        with pytest.raises(OperatorOnly, match="--admin-port"):  # at once: a deadline, not a speed
            asyncio.run(asyncio.wait_for(serve(gw, "127.0.0.1", free_port(), asyncio.Event()), 30))
    finally:
        records.close()
