"""The gateway's latency histograms bucket as prometheus_client's own Histogram does."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Histogram

from moemeter.contract import FAMILIES
from moemeter.contract.requests import TTFT_BUCKETS
from stack.gateway.metrics import _Hist


def test_values_fall_in_the_buckets_prometheus_client_puts_them_in():
    # every bound itself, either side of it, and the ends
    values = [v for b in TTFT_BUCKETS for v in (b, math.nextafter(b, 0), math.nextafter(b, math.inf))]
    values += [0.0, -1.0, 1e9, math.inf]
    ours = _Hist(TTFT_BUCKETS)
    theirs = Histogram("h", "h", buckets=TTFT_BUCKETS, registry=CollectorRegistry())
    for v in values:
        ours.observe(v)
        theirs.observe(v)
    [fam] = theirs.collect()
    expected = {s.labels["le"]: s.value for s in fam.samples if s.name == "h_bucket"}
    got = {
        s.labels["le"]: s.value
        for s in ours.family(FAMILIES["moemeter_gateway_ttft_seconds"]).samples
        if s.name.endswith("_bucket")
    }
    assert got == expected
