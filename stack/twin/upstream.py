"""A simulated OpenAI-compatible server: the twin's stand-in for vLLM behind the gateway.

It answers /v1/models, /v1/completions and /v1/chat/completions the way vLLM 0.32 does (one chunk
per token, a final usage chunk only when `stream_options.include_usage`, and with it
`continuous_usage_stats` the running usage on every chunk: the chat role chunk's with 0 completion
tokens, each token chunk's with the tokens so far; `[DONE]`), counting a prompt's tokens as its
whitespace-separated words and serving repeated 16-token prefix blocks from a simulated prefix cache
(`prompt_tokens_details.cached_tokens`). Times come from the `ttft_seconds` and `itl_seconds`
settings; `continuous_usage_stats=False` makes it a server that ignores that option (as vllm-router
0.1.17 drops it from what it passes on). `POST /tokenize` counts a prompt or chat's tokens as vLLM's
does (`{"count": N, ...}`); `tokenize=False` makes it a server without it. For gateway
tests it also injects faults a real server cannot be made to show on demand, named by the request
body's field `twin_fault` (a body field, so it passes through the gateway unchanged):
`drop-after-N` (close the stream after N tokens, no [DONE]), `stall` (never answer),
`always-stream` (stream whatever the request said), `router-ids` (response ids naming internal
addresses, as through vllm-router), `linger-after-done` (hold the connection
open a while after [DONE], as a router in between may), `status-N` (answer HTTP N), `status-N-text` (answer HTTP N with a plain-text body naming an internal
address, as vllm-router's 500s do). A body field `twin_itl_seconds` sets this request's gap between
tokens; `twin_prompt_tokens` the prompt tokens its usage reports (whatever the value).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from aiohttp import web

from stack.gateway.app import Refused, error_body, stream_flag

BLOCK_TOKENS = 16


class PrefixCache:
    """Which 16-token blocks were seen before, as a chain of hashes (like vLLM's block hashes)."""

    def __init__(self, max_blocks: int = 200_000) -> None:
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def lookup_and_insert(self, tokens: list[str]) -> int:
        """Cached tokens of this prompt (whole leading blocks seen before); remembers its blocks."""
        h = b""
        cached, hit = 0, True
        for i in range(0, len(tokens) - len(tokens) % BLOCK_TOKENS, BLOCK_TOKENS):
            h = hashlib.blake2b(h + " ".join(tokens[i : i + BLOCK_TOKENS]).encode(), digest_size=16).digest()
            if hit and h in self._blocks:
                cached += BLOCK_TOKENS
                self._blocks.move_to_end(h)
            else:
                hit = False
                self._blocks[h] = None
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
        return min(cached, max(len(tokens) - 1, 0))


def prompt_words(body: dict[str, Any], chat: bool) -> list[str]:
    """A prompt's tokens, as the twin counts them: its words (a chat's messages' contents together)."""
    if chat:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return text.split() or ["<empty>"]


class SimulatedUpstream:
    def __init__(
        self,
        model: str = "twin-moe",
        ttft_seconds: float = 0.0,
        itl_seconds: float = 0.0,
        default_max_tokens: int = 16,
        continuous_usage_stats: bool = True,
        tokenize: bool = True,
    ) -> None:
        self.model = model
        self.tokenize = tokenize  # False: no /tokenize, as a server other than vLLM
        self.continuous_usage_stats = continuous_usage_stats  # False: ignored, as by a server without it
        self.ttft_seconds = ttft_seconds
        self.itl_seconds = itl_seconds
        self.default_max_tokens = default_max_tokens
        self.cache = PrefixCache()
        self.requests = 0
        self.aborted = 0  # streams the client (the gateway) closed before the end
        self.request_ids: list[str] = []  # X-Request-Id of each request, in arrival order

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        if self.tokenize:
            app.router.add_post("/tokenize", self._tokenize)
        return app

    async def _tokenize(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        tokens = prompt_words(body, chat="messages" in body)
        return web.json_response({"count": len(tokens), "max_model_len": 4096, "tokens": list(range(len(tokens)))})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "twin"}]}
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        self.requests += 1
        rid = request.headers.get("X-Request-Id", uuid.uuid4().hex)
        self.request_ids.append(rid)
        body: dict[str, Any] = await request.json()
        fault = str(body.get("twin_fault", ""))
        if fault == "stall":
            await asyncio.sleep(3600)
        if fault.startswith("status-") and fault.endswith("-text"):
            return web.Response(
                text="Failed to send request to http://10.0.0.7:8100/v1/completions: reset", status=int(fault[7:-5])
            )
        if fault.startswith("status-"):
            status = int(fault[7:])
            return web.json_response(
                {"error": {"message": f"injected HTTP {status}", "type": "twin_fault", "param": None, "code": status}},
                status=status,
            )
        if body.get("model") != self.model:
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
                status=404,
            )
        tokens = prompt_words(body, chat)
        cached = self.cache.lookup_and_insert(tokens)
        opts = body["stream_options"] if isinstance(body.get("stream_options"), dict) else {}
        try:
            stream = stream_flag(body.get("stream"))
            include_usage = stream_flag(opts.get("include_usage"))  # pydantic's bool, as vLLM reads them
            running = include_usage and stream_flag(opts.get("continuous_usage_stats")) and self.continuous_usage_stats
        except Refused as r:
            return web.json_response(error_body(r.message, "BadRequestError", "400", r.param), status=400)
        n_out = int(body.get("max_tokens") or body.get("max_completion_tokens") or self.default_max_tokens)
        usage = {
            "prompt_tokens": body.get("twin_prompt_tokens", len(tokens)),
            "completion_tokens": n_out,
            "total_tokens": len(tokens) + n_out,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if fault == "router-ids":  # vllm-router in PD mode names both instances in the id it passes on
            rid = f"___prefill_addr_10.0.0.7:8100___decode_addr_10.0.0.8:8200_{rid}"
        cid, created = f"{'chatcmpl' if chat else 'cmpl'}-{rid}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        if self.ttft_seconds:
            await asyncio.sleep(self.ttft_seconds)
        if not stream and fault != "always-stream":
            await asyncio.sleep(self.itl_seconds * max(n_out - 1, 0))
            out = " ".join(f"t{i}" for i in range(n_out))
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "length"}
                if chat
                else {"index": 0, "text": out, "finish_reason": "length"}
            )
            return web.json_response(
                {
                    "id": cid,
                    "object": kind,
                    "created": created,
                    "model": self.model,
                    "choices": [choice],
                    "usage": usage,
                }
            )
        itl = float(body.get("twin_itl_seconds", self.itl_seconds))

        def so_far(completion: int) -> dict[str, Any]:  # vLLM's UsageInfo field order, without details
            prompt = usage["prompt_tokens"]
            total = prompt + completion if isinstance(prompt, int) else prompt
            return {"prompt_tokens": prompt, "total_tokens": total, "completion_tokens": completion}

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        drop_after = int(fault[11:]) if fault.startswith("drop-after-") else None
        kind += ".chunk" if chat else ""
        try:
            if chat:
                role = {
                    "id": cid,
                    "object": kind,
                    "created": created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                }
                await self._event(resp, {**role, "usage": so_far(0)} if running else role)
            for i in range(n_out):
                if drop_after is not None and i == drop_after:
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                if i and itl:
                    await asyncio.sleep(itl)
                last = i == n_out - 1
                piece = f" t{i}"
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                choice["finish_reason"] = "length" if last else None
                chunk = {"id": cid, "object": kind, "created": created, "model": self.model, "choices": [choice]}
                await self._event(resp, {**chunk, "usage": so_far(i + 1)} if running else chunk)
            if include_usage:
                await self._event(
                    resp,
                    {"id": cid, "object": kind, "created": created, "model": self.model, "choices": [], "usage": usage},
                )
            await resp.write(b"data: [DONE]\n\n")
            if fault == "linger-after-done":
                await asyncio.sleep(0.5)
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.aborted += 1
            raise
        return resp

    @staticmethod
    async def _event(resp: web.StreamResponse, chunk: dict[str, Any]) -> None:
        await resp.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
