"""The metering gateway in front of the twin's rack: one record per finished request, in the real
gateway's feed schema (stack/gateway/records.py) and with its /metrics families."""

from __future__ import annotations

import uuid
from collections import deque
from itertools import islice

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from stack.gateway.metrics import GatewayMetrics
from stack.gateway.records import SCHEMA, RequestRecord

USERS_PER_TENANT = 15


class TwinGatewayLog:
    def __init__(self, seed: int, model: str, keep: int = 300_000) -> None:
        # A new log each time the twin starts (it keeps its records in memory, and its sequence numbers
        # start again at 1): a fixed id made the warehouse skip a restarted twin's records until their
        # numbers passed the old cursor (seen: a Users page whose last request was 7 h old).
        self.log_id = f"twin-seed-{seed}-{uuid.uuid4().hex[:12]}"
        self.model = model
        self.records: deque[dict[str, object]] = deque(maxlen=keep)
        self.seq = 0
        self.metrics = GatewayMetrics()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.metrics)

    def add(
        self,
        user: np.ndarray,
        arrival: np.ndarray,
        first: np.ndarray,
        finish: np.ndarray,
        prompt: np.ndarray,
        cached: np.ndarray,
        generated: np.ndarray,
        tpot: np.ndarray,
    ) -> None:
        for u, t0, t1, t2, p, c, g, itl in zip(
            user.tolist(),
            arrival.tolist(),
            first.tolist(),
            finish.tolist(),
            prompt.tolist(),
            cached.tolist(),
            generated.tolist(),
            tpot.tolist(),
        ):
            self.seq += 1
            timed = g > 1 and itl > 0
            r = RequestRecord(
                request_id=f"twin-{self.seq}",
                started_at=t0,
                user=f"user-{u:04d}",
                tenant=f"tenant-{u // USERS_PER_TENANT:02d}",
                model=self.model,
                endpoint="chat/completions" if u % 10 < 7 else "completions",
                stream=True,
                status=200,
                outcome="ok",
                prompt_tokens=int(p),
                cached_prompt_tokens=int(c),
                generated_tokens=int(g),
                ttft_seconds=max(t1 - t0, 0.0),
                itl_mean_seconds=itl if timed else None,
                decode_tokens_per_second=1 / itl if timed else None,
                e2e_seconds=max(t2 - t0, 0.0),
                usage_reported=True,
            )
            self.metrics.observe(r)
            self.records.append({"seq": self.seq, **r.to_json()})

    def page(self, after: int, limit: int) -> dict[str, object]:
        oldest = self.seq - len(self.records) + 1 if self.records else None
        start = max(after - (oldest or 0) + 1, 0) if oldest else 0
        rows = list(islice(self.records, start, start + limit))  # a deque's [i] walks from its nearer end
        return {
            "schema": SCHEMA,
            "log_id": self.log_id,
            "oldest": oldest,
            "records": rows,
            "next": rows[-1]["seq"] if rows else after,
            "more": start + limit < len(self.records),
        }

    def render(self) -> str:
        return generate_latest(self.registry).decode()
