"""Drive planned sessions against an OpenAI-compatible URL (the gateway) and summarise what came back.

Closed loop (`concurrency` sessions at a time) or open loop (`rate` new sessions per second, at most
`concurrency` in flight). Requests stream with usage by default; each one's client-side TTFT and
mean inter-token latency are measured, its usage kept, and its X-Request-Id noted so it can be
found again in the warehouse.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import httpx
import numpy as np

from .workload import Session, WorkloadSpec, plan_sessions


@dataclass
class Result:
    request_id: str  # the gateway's X-Request-Id ("" when none came back)
    user: str
    session: str
    stream: bool
    status: int  # 0: no HTTP answer at all
    error: str | None
    prompt_tokens: int | None
    cached_prompt_tokens: int | None
    completion_tokens: int | None
    ttft_seconds: float | None
    itl_mean_seconds: float | None
    e2e_seconds: float


def summarise(results: list[Result], wall_seconds: float) -> dict[str, Any]:
    """Requests, tokens, P50/P90 per-user tokens/s (1 / quantile of mean inter-token latency, as
    docs/definitions.md defines it: P90 is the slow tail), TTFT, errors."""
    ok = [r for r in results if r.error is None]
    itl = np.array([r.itl_mean_seconds for r in ok if r.itl_mean_seconds], dtype=float)
    ttft = np.array([r.ttft_seconds for r in ok if r.ttft_seconds is not None], dtype=float)
    errors: dict[str, int] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    gen = sum(r.completion_tokens or 0 for r in ok)

    def q(a: np.ndarray, p: float) -> float | None:
        return round(float(np.quantile(a, p)), 6) if a.size else None

    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": errors,
        "users": len({r.user for r in results}),
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "cached_prompt_tokens": sum(r.cached_prompt_tokens or 0 for r in ok),
        "generated_tokens": gen,
        "wall_seconds": round(wall_seconds, 3),
        "output_tokens_per_second": round(gen / wall_seconds, 3) if wall_seconds else None,
        "per_user_tokens_per_second_p50": round(1 / q(itl, 0.5), 3) if itl.size else None,  # type: ignore[operator]
        "per_user_tokens_per_second_p90": round(1 / q(itl, 0.9), 3) if itl.size else None,  # type: ignore[operator]
        "ttft_seconds_p50": q(ttft, 0.5),
        "ttft_seconds_p90": q(ttft, 0.9),
    }


CONCURRENCY = 8
"""Sessions in flight, closed loop (`loadgen --concurrency`)."""
STREAM_SHARE = 0.9
"""The share of requests that stream (`loadgen --stream-share`)."""


class LoadGen:
    def __init__(
        self,
        url: str,
        model: str,
        spec: WorkloadSpec,
        seed: int = 0,
        concurrency: int = CONCURRENCY,
        rate: float | None = None,
        duration: float | None = None,
        stream_share: float = STREAM_SHARE,
        ignore_eos: bool = True,
        api_key: str | None = None,
        timeout: float = 600.0,
        progress: TextIO | None = sys.stderr,
    ) -> None:
        self.url = url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.spec = spec
        self.sessions = plan_sessions(spec, seed)
        self.rng = random.Random(seed + 1)
        self.concurrency = concurrency
        self.rate = rate
        self.duration = duration
        self.stream_share = stream_share
        self.ignore_eos = ignore_eos
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.progress = progress
        self.results: list[Result] = []
        self._deadline = float("inf")
        self._done_sessions = 0

    def run(self) -> list[Result]:
        return asyncio.run(self.arun())

    async def arun(self) -> list[Result]:
        start = time.monotonic()
        if self.duration:
            self._deadline = start + self.duration
        limits = httpx.Limits(max_connections=self.concurrency * 2, max_keepalive_connections=self.concurrency * 2)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits, headers=self.headers) as client:
            ticker = asyncio.create_task(self._tick(start))
            try:
                if self.rate:
                    await self._open_loop(client)
                else:
                    queue = list(reversed(self.sessions))

                    async def worker() -> None:
                        while queue and time.monotonic() < self._deadline:
                            await self._session(client, queue.pop())

                    await asyncio.gather(*(worker() for _ in range(self.concurrency)))
            finally:
                ticker.cancel()
                self._show(start, final=True)
        return self.results

    async def _open_loop(self, client: httpx.AsyncClient) -> None:
        gate = asyncio.Semaphore(self.concurrency)
        tasks = []

        async def one(s: Session) -> None:
            async with gate:
                await self._session(client, s)

        for s in self.sessions:
            if time.monotonic() >= self._deadline:
                break
            tasks.append(asyncio.create_task(one(s)))
            await asyncio.sleep(self.rng.expovariate(self.rate or 1.0))
        await asyncio.gather(*tasks)

    async def _session(self, client: httpx.AsyncClient, s: Session) -> None:
        messages = [{"role": "system", "content": s.system}, *(s.parent_context or [])]
        for turn in s.turns:
            if time.monotonic() >= self._deadline:
                break
            messages.append({"role": "user", "content": " ".join(turn.words)})
            text = await self._send(client, s, messages, turn.max_tokens)
            messages.append({"role": "assistant", "content": text or "(no answer)"})
            if turn.fork is not None:
                turn.fork.parent_context = [dict(m) for m in messages[1:]]
                await self._session(client, turn.fork)  # the parent waits for its subagent's result
            await asyncio.sleep(self.rng.expovariate(1 / self.spec.think_seconds) if self.spec.think_seconds else 0)
        if s.parent_context is None:  # subagents are part of their parent's session
            self._done_sessions += 1

    async def _send(
        self, client: httpx.AsyncClient, s: Session, messages: list[dict[str, str]], max_tokens: int
    ) -> str:
        stream = self.rng.random() < self.stream_share
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "user": s.user,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM: generate max_tokens, so the plan's output lengths hold
        t0 = time.monotonic()
        res = Result("", s.user, s.sid, stream, 0, None, None, None, None, None, None, 0.0)
        text = ""
        try:
            if stream:
                text = await self._stream(client, body, res, t0)
            else:
                r = await client.post(self.url, json=body)
                res.status, res.request_id = r.status_code, r.headers.get("X-Request-Id", "")
                if r.status_code == 200:
                    data = r.json()
                    text = str((data.get("choices") or [{}])[0].get("message", {}).get("content") or "")
                    self._usage(res, data.get("usage"))
                else:
                    res.error = _error_code(r.text, r.status_code)
        except httpx.HTTPError as exc:
            res.error = type(exc).__name__
        res.e2e_seconds = time.monotonic() - t0
        self.results.append(res)
        return text

    async def _stream(self, client: httpx.AsyncClient, body: dict[str, Any], res: Result, t0: float) -> str:
        parts: list[str] = []
        first = last = None
        async with client.stream("POST", self.url, json=body) as r:
            res.status, res.request_id = r.status_code, r.headers.get("X-Request-Id", "")
            if r.status_code != 200:
                res.error = _error_code((await r.aread()).decode(errors="replace"), r.status_code)
                return ""
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                try:
                    chunk = json.loads(line[6:])
                except ValueError:
                    res.error = "malformed_chunk"
                    continue
                if not isinstance(chunk, dict):
                    continue
                if "error" in chunk:
                    res.error = str(chunk["error"].get("code") or "stream_error")
                    continue
                self._usage(res, chunk.get("usage"))
                for c in chunk.get("choices") or []:
                    piece = (c.get("delta") or {}).get("content")
                    if piece:
                        now = time.monotonic()
                        first = first if first is not None else now
                        last = now
                        parts.append(piece)
        if first is not None:
            res.ttft_seconds = first - t0
            n = res.completion_tokens or len(parts)
            if last is not None and n > 1 and last > first:
                res.itl_mean_seconds = (last - first) / (n - 1)
        return "".join(parts)

    @staticmethod
    def _usage(res: Result, usage: Any) -> None:
        if isinstance(usage, dict):
            res.prompt_tokens = usage.get("prompt_tokens")
            res.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details")
            res.cached_prompt_tokens = details.get("cached_tokens") if isinstance(details, dict) else None

    async def _tick(self, start: float) -> None:
        every = 0.5 if self.progress is not None and self.progress.isatty() else 10.0
        while True:
            await asyncio.sleep(every)
            self._show(start)

    def _show(self, start: float, final: bool = False) -> None:
        if self.progress is None:
            return
        total = len(self.sessions)
        done = min(self._done_sessions, total)
        width = 30
        bar = "#" * (width * done // max(total, 1))
        errors = sum(1 for r in self.results if r.error)
        line = (
            f"[{bar:<{width}}] {done}/{total} sessions, {len(self.results)} requests, {errors} errors, "
            f"{time.monotonic() - start:.0f}s"
        )
        tty = self.progress.isatty()
        self.progress.write(("\r" + line if tty else line + "\n") + ("\n" if final and tty else ""))
        self.progress.flush()


def _error_code(text: str, status: int) -> str:
    try:
        return str(json.loads(text)["error"]["code"] or f"http_{status}")
    except (ValueError, KeyError, TypeError):
        return f"http_{status}"


def write_results(results: list[Result], out: TextIO) -> None:
    for r in results:
        out.write(json.dumps(asdict(r)) + "\n")
