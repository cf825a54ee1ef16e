"""The gateway's /metrics: per-user totals with a bounded number of user labels, latency histograms.

Counters must never go down, so a user keeps the label it was given: the first `max_users` users
seen get their own label (in practice the busy ones: they arrive first), everyone after that is
counted under user="other". Exact per-user numbers are in the request feed, not here.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from moemeter.contract import FAMILIES, Family
from moemeter.contract.requests import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, RequestRecord

OTHER = "other"
MAX_USER_LABELS = 50
"""Users with their own /metrics label (`gateway --max-user-labels`); the rest are counted as OTHER."""


class _Hist:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # the first bucket whose bound is at least the value (NaN in +Inf)
        i = bisect_left(self.bounds, value) if value == value else len(self.bounds)
        self.counts[i] += 1
        self.sum += value

    def observe_many(self, values: np.ndarray) -> None:
        """observe() for each value: the same buckets (searchsorted's left side is bisect_left's; a
        NaN sorts past every bound), the sum in one addition."""
        for i, n in enumerate(np.bincount(np.searchsorted(self.bounds, values), minlength=len(self.counts))):
            self.counts[i] += int(n)
        self.sum += float(values.sum())

    def family(self, f: Family) -> HistogramMetricFamily:
        cum, buckets = 0, []
        for b, c in zip((*self.bounds, float("inf")), self.counts):
            cum += c
            buckets.append(("+Inf" if b == float("inf") else repr(b), cum))
        return HistogramMetricFamily(f.name, f.help, buckets=buckets, sum_value=self.sum)


class GatewayMetrics(Collector):
    def __init__(self, max_users: int = MAX_USER_LABELS) -> None:
        self.max_users = max_users
        self._labels: dict[str, str] = {}
        self.requests: dict[tuple[str, str], int] = defaultdict(int)  # (user label, outcome)
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)  # (user label, kind)
        self.errors: dict[str, int] = defaultdict(int)
        self.ttft = _Hist(TTFT_BUCKETS)
        self.itl = _Hist(ITL_BUCKETS)
        self.e2e = _Hist(E2E_BUCKETS)
        self.in_flight = 0
        self.records_pending = lambda: 0

    def user_label(self, user: str) -> str:
        label = self._labels.get(user)
        if label is None:
            label = user if len(self._labels) < self.max_users else OTHER
            if label != OTHER:
                self._labels[user] = label
        return label

    def observe(self, r: RequestRecord) -> None:
        u = self.user_label(r.user)
        self.requests[(u, r.outcome)] += 1
        self.tokens[(u, "prompt")] += r.prompt_tokens
        self.tokens[(u, "cached_prompt")] += r.cached_prompt_tokens or 0
        self.tokens[(u, "generation")] += r.generated_tokens
        if r.outcome != "ok":
            self.errors[r.outcome] += 1
        if r.ttft_seconds is not None:
            self.ttft.observe(r.ttft_seconds)
        if r.itl_mean_seconds is not None:
            self.itl.observe(r.itl_mean_seconds)
        self.e2e.observe(r.e2e_seconds)

    def observe_ok(
        self,
        users: list[str],
        prompt: np.ndarray,
        cached: np.ndarray,
        generated: np.ndarray,
        ttft: np.ndarray,
        itl: np.ndarray,
        e2e: np.ndarray,
    ) -> None:
        """observe() for a batch of requests that all ended "ok" with a TTFT (the twin's: tens of
        thousands a minute); `itl` NaN where a request had none. The same counters and buckets;
        each sum is added once, not request by request."""
        first_seen = list(dict.fromkeys(users))  # labels go to users in the order they are first seen
        labels = [self.user_label(u) for u in first_seen]
        index = {u: i for i, u in enumerate(first_seen)}
        which = np.fromiter((index[u] for u in users), dtype=np.int64, count=len(users))
        n = len(first_seen)
        per_user = {
            "requests": np.bincount(which, minlength=n),
            "prompt": np.bincount(which, prompt, minlength=n),
            "cached_prompt": np.bincount(which, cached, minlength=n),
            "generation": np.bincount(which, generated, minlength=n),
        }
        for i, u in enumerate(labels):
            self.requests[(u, "ok")] += int(per_user["requests"][i])
            for kind in ("prompt", "cached_prompt", "generation"):
                self.tokens[(u, kind)] += int(per_user[kind][i])
        self.ttft.observe_many(ttft)
        self.itl.observe_many(itl[~np.isnan(itl)])
        self.e2e.observe_many(e2e)

    def collect(self) -> Iterator[Metric]:
        """The families of moemeter/contract/families.py whose source is the gateway, with their HELP."""
        req = _counter("moemeter_gateway_requests_total")
        for (u, outcome), n in sorted(self.requests.items()):
            req.add_metric([outcome, u], n)  # the contract's label order: outcome, user
        yield req
        for kind in ("prompt", "cached_prompt", "generation"):
            fam = _counter(f"moemeter_gateway_{kind}_tokens_total")
            for (u, k), n in sorted(self.tokens.items()):
                if k == kind:
                    fam.add_metric([u], n)
            yield fam
        err = _counter("moemeter_gateway_errors_total")
        for cls, n in sorted(self.errors.items()):
            err.add_metric([cls], n)
        yield err
        yield self.ttft.family(FAMILIES["moemeter_gateway_ttft_seconds"])
        yield self.itl.family(FAMILIES["moemeter_gateway_itl_mean_seconds"])
        yield self.e2e.family(FAMILIES["moemeter_gateway_request_duration_seconds"])
        yield _gauge("moemeter_gateway_in_flight_requests", self.in_flight)
        yield _gauge("moemeter_gateway_records_pending", self.records_pending())


def _counter(name: str) -> CounterMetricFamily:
    f = FAMILIES[name]
    return CounterMetricFamily(f.base, f.help, labels=list(f.labels))


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, FAMILIES[name].help, value)
