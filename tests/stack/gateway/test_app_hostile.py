"""The gateway against hostile or odd clients and upstreams: every request metered, nothing that
poisons /metrics or the feed, nothing internal in what a client reads. Real clients where a user
has them: the official `openai` SDK, and a raw client that closes the moment it reads [DONE]."""

from __future__ import annotations

import gc
import json
import socket
import sys
from pathlib import Path

import httpx
import openai
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from moemeter.contract.columns import MAX_COUNT
from stack.gateway.app import _parse
from stack.twin.upstream import SimulatedUpstream

from .conftest import Rig, start_rig
from .test_app import records, sse_chunks

FIXTURES = Path(__file__).parents[2] / "fixtures"
STREAM_CASES = json.loads((FIXTURES / "vllm-0.32.0-stream-field.json").read_text())["cases"]


def metrics(rig: Rig) -> dict[str, float]:
    """The gateway's /metrics, read by prometheus_client's own parser."""
    r = httpx.get(rig.url + "/metrics")
    assert r.status_code == 200, r.text[:300]
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for fam in text_string_to_metric_families(r.text)
        for s in fam.samples
    }


@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: json.dumps(c["stream"]))
def test_the_stream_field_means_what_vllm_makes_of_it(rig: Rig, case: dict) -> None:
    body = {"model": "twin-moe", "prompt": "a b", "max_tokens": 4, "stream": case["stream"]}
    r = httpx.post(rig.url + "/v1/completions", json=body)
    [rec] = records(rig)
    if case["vllm"] == "refused":
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
        assert (rec["status"], rec["outcome"]) == (400, "bad_stream") and rig.upstream.requests == 0
        return
    streamed = r.headers["content-type"].startswith("text/event-stream")
    assert streamed == bool(case["vllm"]) == rec["stream"]
    # Metered from the upstream's usage either way (a stream asks for it and hides it).
    assert (rec["outcome"], rec["prompt_tokens"], rec["generated_tokens"], rec["usage_reported"]) == ("ok", 2, 4, True)
    if streamed:
        assert all(c == "[DONE]" or c["choices"] for c in sse_chunks(r.text))


def test_a_stream_nobody_asked_for_is_metered(rig: Rig) -> None:
    r = httpx.post(
        rig.url + "/v1/completions",
        json={"model": "twin-moe", "prompt": "a", "max_tokens": 6, "twin_fault": "always-stream"},
    )
    assert r.headers["content-type"].startswith("text/event-stream")
    [rec] = records(rig)
    assert (rec["stream"], rec["outcome"], rec["generated_tokens"]) == (True, "ok", 6)
    assert rec["ttft_seconds"] is not None


def test_a_lone_surrogate_user_is_stored_and_metrics_keep_answering(rig: Rig) -> None:
    raw = b'{"model": "twin-moe", "prompt": "x", "max_tokens": 1, "user": "\\ud800ev\\udfffil"}'
    assert httpx.post(rig.url + "/v1/completions", content=raw).status_code == 200
    httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "x", "max_tokens": 2, "user": "bob"})
    [evil, bob] = records(rig)
    assert evil["user"] == "\ufffdev\ufffdil" and bob["user"] == "bob"
    m = metrics(rig)
    assert m["moemeter_gateway_generation_tokens_total[('user', '\ufffdev\ufffdil')]"] == 1
    assert m["moemeter_gateway_generation_tokens_total[('user', 'bob')]"] == 2
    feed = httpx.get(rig.url + "/moemeter/requests")  # the collectors' feed: valid UTF-8 JSON
    assert feed.status_code == 200 and feed.content.decode("utf-8") and len(feed.json()["records"]) == 2


@pytest.mark.parametrize("reported", [2**63, -5, 1e400, "lots"])
def test_usage_that_is_not_a_count_is_not_stored_as_one(rig: Rig, reported: object) -> None:
    for stream in (False, True):
        r = httpx.post(
            rig.url + "/v1/completions",
            content=json.dumps(
                {"model": "twin-moe", "prompt": "x", "max_tokens": 3, "stream": stream, "twin_prompt_tokens": reported}
            ),
        )
        assert r.status_code == 200
    recs = records(rig)
    # the whole answer's usage ignored; the stream's prompt counted by the upstream's /tokenize instead
    assert [(r["usage_reported"], r["prompt_tokens"]) for r in recs] == [(False, 0), (True, 1)]
    assert recs[1]["generated_tokens"] == 3  # the stream's chunks, counted instead
    assert all(0 <= v <= MAX_COUNT for v in metrics(rig).values())


def test_a_body_nested_too_deep_is_refused_and_recorded(rig: Rig) -> None:
    deep = b'{"model": "twin-moe", "prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    r = httpx.post(rig.url + "/v1/completions", content=deep)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
    [rec] = records(rig)
    assert (rec["status"], rec["outcome"]) == (400, "bad_json")


class _Garbage:
    """A cycle whose finalizer needs a few hundred frames of stack, as a closing socket's may."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        def down(n: int) -> int:
            return n and down(n - 1)

        down(600)


@pytest.mark.parametrize(
    ("parse", "finalizers_fail"),
    [
        pytest.param(
            json.loads,
            True,
            marks=pytest.mark.skipif(
                sys.version_info >= (3, 12), reason="from 3.12 the collector runs between bytecodes, not in a C parser"
            ),
        ),
        (lambda b: _parse(json.loads, b), False),
    ],
)
def test_a_body_nested_too_deep_runs_no_finalizer_at_the_recursion_limit(monkeypatch, parse, finalizers_fail):
    """The cycle collector, run by the parser's allocations hundreds of levels deep, would run
    unrelated finalizers there, and they fail for want of stack (under pytest: a failed test)."""
    lost: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: lost.append(u.exc_value))
    gc.collect()
    threshold = gc.get_threshold()
    gc.set_threshold(500, 10, 10)  # a collection once the parser is about 500 lists deep
    try:
        garbage = [_Garbage() for _ in range(5)]
        del garbage
        with pytest.raises(RecursionError):
            parse(b"[" * 100_000 + b"]" * 100_000)
    finally:
        gc.set_threshold(*threshold)
        gc.collect()  # the garbage's finalizers, with stack to spare
    assert any(isinstance(e, RecursionError) for e in lost) is finalizers_fail, lost


def test_openai_sdk_streams_with_usage_are_all_recorded_whole(tmp_path: Path) -> None:
    rig = start_rig(tmp_path, upstream=SimulatedUpstream(model="twin-moe"))
    try:
        client = openai.OpenAI(base_url=rig.url + "/v1", api_key="unused", max_retries=0)
        for i in range(8):
            stream = client.chat.completions.create(
                model="twin-moe",
                messages=[{"role": "user", "content": "a b c"}],
                max_tokens=5 + i,
                stream=True,
                stream_options={"include_usage": True},
                user="sdk",
                extra_body={"twin_fault": "linger-after-done"} if i % 2 else None,
            )
            chunks = list(stream)
            assert chunks[-1].usage.completion_tokens == 5 + i
            stream.close()
        recs = records(rig)
    finally:
        rig.loop.close()
    assert [(r["status"], r["outcome"], r["generated_tokens"], r["prompt_tokens"]) for r in recs] == [
        (200, "ok", 5 + i, 3) for i in range(8)
    ]


def test_a_client_that_closes_at_done_got_a_whole_answer(tmp_path: Path) -> None:
    """Reads until `data: [DONE]` and closes at once, while the upstream still holds its end open."""
    rig = start_rig(tmp_path, upstream=SimulatedUpstream(model="twin-moe"))
    body = json.dumps(
        {"model": "twin-moe", "prompt": "a b", "max_tokens": 4, "stream": True, "twin_fault": "linger-after-done"}
    )
    port = int(rig.url.rsplit(":", 1)[1])
    try:
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(
                    f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                )
                got = b""
                while b"data: [DONE]" not in got:
                    got += s.recv(65536)
        recs = records(rig)
        m = metrics(rig)
    finally:
        rig.loop.close()
    assert [(r["status"], r["outcome"], r["generated_tokens"], r["prompt_tokens"]) for r in recs] == [
        (200, "ok", 4, 2)
    ] * 5
    assert not any(k.startswith("moemeter_gateway_errors") for k in m)


def test_upstream_errors_reach_clients_as_openai_json_without_internal_addresses(rig: Rig) -> None:
    r = httpx.post(
        rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a", "twin_fault": "status-500-text"}
    )
    assert r.status_code == 500 and r.json()["error"]["code"] == "upstream_5xx"
    assert "10.0.0.7" not in r.text and "http://" not in r.text
    [rec] = records(rig)
    assert (rec["status"], rec["outcome"]) == (500, "upstream_5xx")


def test_an_unreachable_upstream_is_not_named_to_clients(tmp_path: Path) -> None:
    rig = start_rig(tmp_path, upstream_url="http://127.0.0.1:9")
    try:
        r = httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a"})
        models = httpx.get(rig.url + "/v1/models")
    finally:
        rig.loop.close()
    assert r.status_code == models.status_code == 502
    assert "127.0.0.1:9" not in r.text + models.text and r.json()["error"]["type"] == "upstream_error"


class _NestedUpstream(SimulatedUpstream):
    """Answers /v1/models and /tokenize with JSON nested past Python's recursion limit."""

    async def _models(self, request: web.Request) -> web.Response:
        return web.Response(body=b"[" * 100_000 + b"]" * 100_000, content_type="application/json")

    async def _tokenize(self, request: web.Request) -> web.Response:
        return await self._models(request)


def test_an_upstream_answering_json_nested_too_deep_fails_no_request(tmp_path: Path, caplog) -> None:
    """Its model list unread (the upstream then decides), its prompt count unread (the prompt stays
    unmetered): every request still answered and recorded."""
    rig = start_rig(tmp_path, upstream=_NestedUpstream(model="twin-moe"))
    try:
        for stream in (False, True):
            body = {"model": "twin-moe", "prompt": "a b", "max_tokens": 3, "stream": stream, "twin_prompt_tokens": "x"}
            assert httpx.post(rig.url + "/v1/completions", json=body).status_code == 200
        recs = records(rig)
    finally:
        rig.loop.close()
    assert [(r["status"], r["outcome"], r["usage_reported"]) for r in recs] == [(200, "ok", False)] * 2
    assert any("could not count its prompt: RecursionError" in r.getMessage() for r in caplog.records)


def test_requests_past_the_in_flight_bound_get_429_and_are_recorded(tmp_path: Path) -> None:
    rig = start_rig(tmp_path, upstream=SimulatedUpstream(model="twin-moe", itl_seconds=0.05), max_in_flight=2)
    slow = {"model": "twin-moe", "prompt": "a", "max_tokens": 200, "stream": True}
    try:
        with (
            httpx.Client(timeout=30) as c,
            c.stream("POST", rig.url + "/v1/completions", json=slow) as one,
            c.stream("POST", rig.url + "/v1/completions", json=slow) as two,
        ):
            reading = one.iter_raw(), two.iter_raw()  # kept: a dropped iterator closes its response
            for r in reading:
                next(r)  # both are being served
            over = httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a"})
        assert over.status_code == 429 and over.headers["Retry-After"] == "1"
        assert over.json()["error"]["code"] == "overloaded"
        rig.flush()  # the two closed streams have ended at the gateway too
        after = httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a", "max_tokens": 1})
        assert after.status_code == 200  # the bound frees as requests end
        outcomes = sorted(r["outcome"] for r in records(rig))
    finally:
        rig.loop.close()
    assert outcomes == ["client_disconnect", "client_disconnect", "ok", "overloaded"]


def test_response_ids_never_name_internal_addresses(rig: Rig) -> None:
    body = {"model": "twin-moe", "prompt": "a", "max_tokens": 3, "twin_fault": "router-ids"}
    whole = httpx.post(rig.url + "/v1/completions", json=body)
    streamed = httpx.post(
        rig.url + "/v1/chat/completions", json={**body, "stream": True, "messages": [{"role": "user", "content": "a"}]}
    )
    assert whole.json()["id"] == f"cmpl-{whole.headers['X-Request-Id']}"
    ids = {c["id"] for c in sse_chunks(streamed.text) if isinstance(c, dict)}
    assert ids == {f"chatcmpl-{streamed.headers['X-Request-Id']}"}
    assert "10.0.0.7" not in whole.text + streamed.text and "addr" not in whole.text + streamed.text
    assert [r["outcome"] for r in records(rig)] == ["ok", "ok"]
