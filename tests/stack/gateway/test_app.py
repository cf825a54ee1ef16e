"""The gateway against the twin's simulated upstream: attribution, usage, timings, every failure path."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from stack.gateway.app import Gateway
from stack.gateway.keys import Keys, hash_key
from stack.gateway.records import RecordLog
from stack.twin.upstream import SimulatedUpstream

from .conftest import Rig, free_port, start_rig


def records(rig: Rig) -> list[dict]:
    rig.flush()
    return rig.records.page(0, 1000)["records"]


def sse_chunks(text: str) -> list[dict | str]:
    out: list[dict | str] = []
    for event in text.split("\n\n"):
        if event.startswith("data: "):
            payload = event[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_non_streaming_request_is_attributed_and_counted(rig: Rig) -> None:
    r = httpx.post(
        rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a b c d e", "max_tokens": 7, "user": "alice"}
    )
    assert r.status_code == 200
    rid = r.headers["X-Request-Id"]
    assert rig.upstream.request_ids == [rid]  # passed on, so vLLM's own request ids join
    assert r.json()["id"] == f"cmpl-{rid}"
    [rec] = records(rig)
    assert (rec["user"], rec["tenant"], rec["model"], rec["endpoint"], rec["stream"]) == (
        "alice",
        "anonymous",
        "twin-moe",
        "completions",
        False,
    )
    assert (rec["prompt_tokens"], rec["cached_prompt_tokens"], rec["generated_tokens"]) == (5, 0, 7)
    assert (rec["status"], rec["outcome"], rec["usage_reported"]) == (200, "ok", True)
    assert rec["ttft_seconds"] is None and rec["itl_mean_seconds"] is None  # not measurable without a stream


def test_request_ids_count_up_after_a_prefix_of_the_process_own(rig: Rig, tmp_path: Path) -> None:
    body = {"model": "twin-moe", "prompt": "a", "max_tokens": 1}
    ids = [httpx.post(rig.url + "/v1/completions", json=body).headers["X-Request-Id"] for _ in range(3)]
    prefix = ids[0].rsplit("-", 1)[0]
    assert re.fullmatch("[0-9a-f]{16}", prefix) and ids == [f"{prefix}-{n}" for n in (1, 2, 3)]
    other = Gateway(rig.gateway.upstream, RecordLog(tmp_path / "other.sqlite"))  # another gateway, or a restart
    assert other._id_prefix != f"{prefix}-"


def test_stream_hides_the_usage_chunk_it_asked_for(rig: Rig) -> None:
    body = {"model": "twin-moe", "messages": [{"role": "user", "content": "x y z"}], "max_tokens": 5, "stream": True}
    through = httpx.post(rig.url + "/v1/chat/completions", json=body)
    rid = through.headers["X-Request-Id"]
    direct = httpx.post(rig.gateway.upstream + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid})
    strip = [
        {k: v for k, v in c.items() if k != "created"} if isinstance(c, dict) else c for c in sse_chunks(through.text)
    ]
    assert strip == [
        {k: v for k, v in c.items() if k != "created"} if isinstance(c, dict) else c for c in sse_chunks(direct.text)
    ]
    assert all(c == "[DONE]" or c["choices"] for c in sse_chunks(through.text))
    rec = records(rig)[0]
    assert (rec["prompt_tokens"], rec["generated_tokens"], rec["usage_reported"]) == (3, 5, True)


def test_stream_keeps_the_usage_chunk_when_the_client_asked(rig: Rig) -> None:
    body = {
        "model": "twin-moe",
        "prompt": "p q",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = sse_chunks(httpx.post(rig.url + "/v1/completions", json=body).text)
    assert chunks[-2]["usage"]["completion_tokens"] == 3 and chunks[-1] == "[DONE]"


def test_stream_timings(tmp_path: Path) -> None:
    rig = start_rig(tmp_path, upstream=SimulatedUpstream(model="twin-moe", ttft_seconds=0.1, itl_seconds=0.02))
    try:
        httpx.post(
            rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a", "max_tokens": 11, "stream": True}
        )
        rec = records(rig)[0]
    finally:
        rig.loop.close()
    # the upstream waits at least this long; how much longer depends on the machine (no upper bound)
    assert rec["ttft_seconds"] >= 0.1
    assert rec["itl_mean_seconds"] >= 0.02  # 10 gaps of at least 20 ms
    assert rec["e2e_seconds"] >= rec["ttft_seconds"] + 10 * rec["itl_mean_seconds"] - 1e-6
    assert rec["itl_max_seconds"] >= rec["itl_mean_seconds"]
    assert rec["decode_tokens_per_second"] == pytest.approx(1 / rec["itl_mean_seconds"])
    assert rec["e2e_seconds"] >= 0.1 + 10 * 0.02


def test_prefix_cache_hits_are_recorded(rig: Rig) -> None:
    prompt = " ".join(f"w{i}" for i in range(40))
    for _ in range(2):
        httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": prompt, "max_tokens": 1})
    assert [r["cached_prompt_tokens"] for r in records(rig)] == [0, 32]


def test_keys_attribute_tenants_and_refuse_strangers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "sk-acme-0123456789abcdef"
    rig = start_rig(tmp_path, keys=Keys(require_key=True, tenants={hash_key(secret): "acme"}))
    body = {"model": "twin-moe", "prompt": "a", "max_tokens": 2}
    try:
        assert httpx.post(rig.url + "/v1/completions", json=body).status_code == 401
        bad = httpx.post(rig.url + "/v1/completions", json=body, headers={"Authorization": "Bearer sk-wrong-key-xyz"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        ok = httpx.post(rig.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {secret}"})
        named = httpx.post(
            rig.url + "/v1/completions", json={**body, "user": "bob"}, headers={"Authorization": f"Bearer {secret}"}
        )
        assert ok.status_code == named.status_code == 200
        recs = records(rig)
        assert [(r["user"], r["tenant"], r["outcome"]) for r in recs] == [
            ("anonymous", "anonymous", "unauthorized"),
            ("anonymous", "anonymous", "unauthorized"),
            ("acme", "acme", "ok"),
            ("bob", "acme", "ok"),
        ]
        assert rig.upstream.requests == 2  # the refused ones never reached it
        stored = (tmp_path / "records.sqlite").read_bytes() + (tmp_path / "records.sqlite-wal").read_bytes()
    finally:
        rig.loop.close()
    assert secret.encode() not in stored and b"sk-wrong" not in stored
    assert secret not in caplog.text and "sk-wrong" not in caplog.text


@pytest.mark.parametrize(
    ("send", "status", "outcome", "message"),
    [
        (dict(content=b"{not json"), 400, "bad_json", "not valid JSON"),
        (dict(content=b"[1, 2]"), 400, "bad_json", "JSON object"),
        (dict(json={"prompt": "a"}), 400, "missing_model", "provide a model"),
        (dict(json={"model": "gpt-9", "prompt": "a"}), 404, "unknown_model", "`gpt-9` does not exist"),
        (dict(content=b"x" * 3000), 413, "body_too_large", "over the gateway's limit"),
    ],
)
def test_bad_requests_get_openai_errors_and_are_recorded(
    tmp_path: Path, send: dict, status: int, outcome: str, message: str
) -> None:
    rig = start_rig(tmp_path, max_body_bytes=2048)
    try:
        r = httpx.post(rig.url + "/v1/completions", headers={"Content-Type": "application/json"}, **send)
        assert r.status_code == status
        err = r.json()["error"]
        assert message in err["message"] and err["code"] == outcome and err["type"]
        [rec] = records(rig)
        assert (rec["status"], rec["outcome"]) == (status, outcome)
        # still serving
        assert httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a"}).status_code == 200
    finally:
        rig.loop.close()


def test_upstream_down(tmp_path: Path) -> None:
    rig = start_rig(tmp_path, upstream_url=f"http://127.0.0.1:{free_port()}")
    try:
        r = httpx.post(rig.url + "/v1/completions", json={"model": "m", "prompt": "a"})
        assert r.status_code == 502 and "Cannot reach the upstream" in r.json()["error"]["message"]
        assert records(rig)[0]["outcome"] == "upstream_unavailable"
    finally:
        rig.loop.close()


def test_upstream_timeout_and_error_status(tmp_path: Path) -> None:
    rig = start_rig(tmp_path, timeout=1.0, read_timeout=0.5)
    body = {"model": "twin-moe", "prompt": "a"}
    try:
        r = httpx.post(rig.url + "/v1/completions", json={**body, "twin_fault": "stall"}, timeout=10)
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
        r = httpx.post(rig.url + "/v1/completions", json={**body, "twin_fault": "status-503"})
        assert r.status_code == 503 and "injected" in r.json()["error"]["message"]  # passed through
        assert [(x["status"], x["outcome"]) for x in records(rig)] == [(504, "upstream_timeout"), (503, "upstream_5xx")]
        m = httpx.get(rig.url + "/metrics").text
        assert 'moemeter_gateway_errors_total{class="upstream_timeout"} 1.0' in m
        assert 'moemeter_gateway_errors_total{class="upstream_5xx"} 1.0' in m
    finally:
        rig.loop.close()


def test_upstream_drops_the_stream_midway(rig: Rig) -> None:
    body = {"model": "twin-moe", "prompt": "a", "max_tokens": 10, "stream": True}
    r = httpx.post(rig.url + "/v1/completions", json={**body, "twin_fault": "drop-after-3"})
    chunks = sse_chunks(r.text)
    assert len([c for c in chunks if isinstance(c, dict) and c.get("choices")]) == 3
    assert chunks[-1]["error"]["code"] == "upstream_dropped"  # the client is told, not left hanging
    rec = records(rig)[0]  # metered from the running usage of the last chunk the upstream sent
    assert (rec["outcome"], rec["prompt_tokens"], rec["generated_tokens"], rec["usage_reported"]) == (
        "upstream_dropped",
        1,
        3,
        True,
    )


def test_client_disconnect_midway_is_recorded_and_closes_the_upstream(tmp_path: Path) -> None:
    up = SimulatedUpstream(model="twin-moe", itl_seconds=0.05)
    rig = start_rig(tmp_path, upstream=up)
    try:
        body = json.dumps({"model": "twin-moe", "prompt": "a", "max_tokens": 200, "stream": True, "user": "carol"})
        port = int(rig.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            got = b""
            while got.count(b"data: ") < 4:
                got += s.recv(65536)
        deadline = time.monotonic() + 5
        while up.aborted == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert up.aborted == 1  # the gateway closed its upstream request: no leaked generation
        rec = records(rig)[0]
        assert (rec["user"], rec["status"], rec["outcome"]) == ("carol", 499, "client_disconnect")
        assert 3 <= rec["generated_tokens"] < 200  # what was delivered so far
        assert httpx.get(rig.url + "/metrics").text.count("moemeter_gateway_in_flight_requests 0.0") == 1
    finally:
        rig.loop.close()


def test_feed_pages_without_loss_or_repeats_across_a_restart(tmp_path: Path) -> None:
    rig = start_rig(tmp_path)
    for i in range(25):
        httpx.post(rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a", "user": f"u{i}"})
    rig.flush()
    seen, after = [], 0
    while True:
        page = httpx.get(rig.url + "/moemeter/requests", params={"after": after, "limit": 10}).json()
        seen += page["records"]
        after = page["next"]
        if not page["more"]:
            break
    log_id = page["log_id"]
    rig.loop.close()
    assert [r["user"] for r in seen] == [f"u{i}" for i in range(25)]
    assert [r["seq"] for r in seen] == sorted({r["seq"] for r in seen})
    again = RecordLog(tmp_path / "records.sqlite")  # the gateway restarted on the same file
    try:
        page = again.page(after, 100)
        assert page["log_id"] == log_id and page["records"] == []
    finally:
        again.close()


def test_feed_refuses_bad_cursors(rig: Rig) -> None:
    assert httpx.get(rig.url + "/moemeter/requests", params={"after": "x"}).status_code == 400
    assert httpx.get(rig.url + "/moemeter/requests", params={"after": -1}).status_code == 400


def test_metrics_bound_the_user_labels(tmp_path: Path) -> None:
    from stack.gateway.metrics import GatewayMetrics

    rig = start_rig(tmp_path, metrics=GatewayMetrics(max_users=2))
    try:

        def send(i: int) -> None:
            httpx.post(
                rig.url + "/v1/completions", json={"model": "twin-moe", "prompt": "a", "max_tokens": 4, "user": f"u{i}"}
            )

        threads = [threading.Thread(target=send, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        text = httpx.get(rig.url + "/metrics").text
    finally:
        rig.loop.close()
    lines = [ln for ln in text.splitlines() if ln.startswith("moemeter_gateway_generation_tokens_total{")]
    assert len(lines) == 3 and any('user="other"' in ln for ln in lines)
    assert sum(float(ln.rsplit(" ", 1)[1]) for ln in lines) == 20


def test_operator_endpoints_can_live_apart_from_the_api(tmp_path: Path) -> None:
    """Per-user records are not for API clients: with an admin port, the public one serves only /v1."""
    import asyncio

    from stack.gateway.app import Gateway, serve

    from .conftest import LoopThread

    loop = LoopThread()
    up = SimulatedUpstream(model="twin-moe")
    up_port, port, admin = free_port(), free_port(), free_port()
    loop.serve(up.app(), up_port)
    gw = Gateway(f"http://127.0.0.1:{up_port}", RecordLog(tmp_path / "r.sqlite", batch_seconds=0.01))
    stop = asyncio.Event()
    task = asyncio.run_coroutine_threadsafe(serve(gw, "127.0.0.1", port, stop, ("127.0.0.1", admin)), loop.loop)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{admin}/health", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        assert (
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": "twin-moe", "prompt": "a"}).status_code
            == 200
        )
        assert httpx.get(f"http://127.0.0.1:{port}/moemeter/requests").status_code == 404
        assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 404
        deadline = time.monotonic() + 10  # the record is written after the reply
        while not (records := httpx.get(f"http://127.0.0.1:{admin}/moemeter/requests").json()["records"]):
            assert time.monotonic() < deadline, "the request's record never appeared"
            time.sleep(0.02)
        assert len(records) == 1
        assert "moemeter_gateway_requests_total" in httpx.get(f"http://127.0.0.1:{admin}/metrics").text
    finally:
        loop.loop.call_soon_threadsafe(stop.set)
        task.result(10)
        loop.close()


def test_per_request_slo_targets_are_recorded_and_a_bad_one_refused(rig: Rig) -> None:
    body = {"model": "twin-moe", "prompt": "a b c", "max_tokens": 3}
    ok = httpx.post(rig.url + "/v1/completions", json=body, headers={"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "12.5"})
    plain = httpx.post(rig.url + "/v1/completions", json=body)
    assert ok.status_code == plain.status_code == 200
    forwarded = len(rig.upstream.request_ids)
    bad = [
        httpx.post(rig.url + "/v1/completions", json=body, headers={name: value})
        for name, value in (("x-slo-ttft-ms", "fast"), ("x-slo-tpot-ms", "0"), ("x-slo-ttft-ms", "nan"))
    ]
    assert [r.status_code for r in bad] == [400, 400, 400]
    assert "x-slo-ttft-ms must be a number of milliseconds" in bad[0].json()["error"]["message"]
    assert len(rig.upstream.request_ids) == forwarded  # refused before the upstream saw them
    recs = records(rig)
    assert [(r["slo_ttft_seconds"], r["slo_itl_seconds"]) for r in recs[:2]] == [(0.25, 0.0125), (None, None)]
    assert [(r["status"], r["outcome"]) for r in recs[2:]] == [(400, "bad_slo_header")] * 3
