"""The metering gateway in front of the twin's rack: one record per finished request, in the real
gateway's feed schema (moemeter/contract/requests.py) and with its /metrics families."""

from __future__ import annotations

import functools
import uuid
from collections import deque
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from moemeter.contract.requests import RECORD_KEYS, SCHEMA, ColumnPage, records_of
from stack.gateway.metrics import GatewayMetrics

USERS_PER_TENANT = 15


class TwinGatewayLog:
    def __init__(self, seed: int, model: str, keep: int = 300_000) -> None:
        # A new log each time the twin starts (it keeps its records in memory, and its sequence numbers
        # start again at 1): a fixed id made the warehouse skip a restarted twin's records until their
        # numbers passed the old cursor (seen: a Users page whose last request was 7 h old).
        self.log_id = f"twin-seed-{seed}-{uuid.uuid4().hex[:12]}"
        self.model = model
        self.keep = keep
        # The records kept, as the columns each batch came in (RECORD_KEYS -> a list each), oldest
        # first: a record is a dict only in a page that asks for it (a day's fast-forward makes
        # 65 M of them and reads them as columns).
        self._batches: deque[dict[str, list[Any]]] = deque()
        self.oldest = 1  # the seq of the oldest record kept
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
        """One record per finished request, as RequestRecord(...).to_json() would give it, built
        column by column (record by record, the twin spent a third of its time here)."""
        n = len(user)
        itl = np.where((generated > 1) & (tpot > 0), tpot, np.nan)  # NaN: none (a None in the record)
        ttft, e2e = np.maximum(first - arrival, 0.0), np.maximum(finish - arrival, 0.0)
        tokens = {k: a.astype(np.int64) for k, a in (("prompt", prompt), ("cached", cached), ("generated", generated))}
        names = [user_names(u) for u in user.tolist()]
        users = [u for u, _, _ in names]
        seqs = range(self.seq + 1, self.seq + n + 1)
        self.seq += n
        columns: dict[str, list[Any]] = {
            "seq": list(seqs),
            "request_id": [f"twin-{k}" for k in seqs],
            "started_at": arrival.tolist(),
            "user": users,
            "tenant": [t for _, t, _ in names],
            "model": [self.model] * n,
            "endpoint": [e for _, _, e in names],
            "stream": [True] * n,
            "status": [200] * n,
            "outcome": ["ok"] * n,
            "prompt_tokens": tokens["prompt"].tolist(),
            "cached_prompt_tokens": tokens["cached"].tolist(),
            "generated_tokens": tokens["generated"].tolist(),
            "ttft_seconds": ttft.tolist(),
            "itl_mean_seconds": _none_for_nan(itl),
            "itl_max_seconds": [None] * n,
            "decode_tokens_per_second": _none_for_nan(np.divide(1.0, itl)),
            "e2e_seconds": e2e.tolist(),
            "usage_reported": [True] * n,
            "slo_ttft_seconds": [None] * n,
            "slo_itl_seconds": [None] * n,
        }
        if tuple(columns) != RECORD_KEYS:
            raise AssertionError(f"the twin's records are not RequestRecord's: {list(columns)} vs {RECORD_KEYS}")
        if n:
            self._batches.append(columns)
        self._forget(self.seq - self.keep + 1)
        self.metrics.observe_ok(users, tokens["prompt"], tokens["cached"], tokens["generated"], ttft, itl, e2e)

    def __len__(self) -> int:
        """The records kept."""
        return self.seq - self.oldest + 1

    def _forget(self, oldest: int) -> None:
        """Keep the records from seq `oldest` on."""
        while self._batches and self.oldest < oldest:
            first = self._batches[0]
            drop = min(oldest - self.oldest, len(first["seq"]))
            if drop == len(first["seq"]):
                self._batches.popleft()
            else:
                self._batches[0] = {k: col[drop:] for k, col in first.items()}
            self.oldest += drop

    def _fields(self, first: int, stop: int) -> dict[str, list[Any]]:
        """The columns of the records with seq in [first, stop)."""
        out: dict[str, list[Any]] = {k: [] for k in RECORD_KEYS}
        for batch in self._batches:
            at = batch["seq"][0]
            lo, hi = max(first - at, 0), min(stop - at, len(batch["seq"]))
            if lo < hi:
                for k, col in batch.items():
                    out[k] += col[lo:hi]
        return out

    def page(self, after: int, limit: int) -> dict[str, object]:
        """The feed's page: the records with seq > after that are kept, at most `limit`."""
        first = max(after + 1, self.oldest)
        rows = records_of(self._fields(first, first + limit))
        return {
            "schema": SCHEMA,
            "log_id": self.log_id,
            "oldest": self.oldest if len(self) else None,
            "records": rows,
            "next": rows[-1]["seq"] if rows else after,
            "more": first + limit <= self.seq,
        }

    def column_page(self, after: int) -> ColumnPage:
        """Every record with seq > after that is kept, as columns (for the fast-forward)."""
        first = max(after + 1, self.oldest)
        fields = self._fields(first, self.seq + 1)
        page = {"schema": SCHEMA, "log_id": self.log_id, "oldest": self.oldest if len(self) else None}
        return ColumnPage(page, fields=fields, next=max(self.seq, after), more=False)

    def render(self) -> str:
        return generate_latest(self.registry).decode()


@functools.cache
def user_names(u: int) -> tuple[str, str, str]:
    """The twin's user `u`: its user and tenant names and the endpoint it calls."""
    return f"user-{u:04d}", f"tenant-{u // USERS_PER_TENANT:02d}", "chat/completions" if u % 10 < 7 else "completions"


def _none_for_nan(a: np.ndarray) -> list[float | None]:
    return [None if v != v else v for v in a.tolist()]
