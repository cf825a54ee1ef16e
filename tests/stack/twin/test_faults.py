"""The twin's named faults: each shows where it was put, and only there."""

from __future__ import annotations

import numpy as np
import pytest

from stack.twin.config import load_profile
from stack.twin.faults import Fault, FaultError
from stack.twin.model import RackModel
from warehouse.alerts import AlertRules

STRAGGLER, FAILING, SATURATED = 7, 5, 3


@pytest.fixture(scope="module")
def sick():
    """90 s of the rack with one straggler, one engine whose transfers fail and one full KV cache,
    sampled once a second after 30 s of warm-up."""
    faults = tuple(
        Fault.parse(s)
        for s in (
            f"straggler:decode-0:{STRAGGLER}",
            f"nixl-failures:decode-0:{FAILING}",
            f"kv-saturated:decode-0:{SATURATED}",
        )
    )
    m = RackModel(load_profile("deepseek-v4.1-flash"), seed=3, start=0.0, faults=faults)
    waiting, usage = [], []
    for t in range(30, 120):
        m.advance(float(t))
        waiting.append(m.decode[0].gauges["waiting"].copy())
        usage.append(m.decode[0].gauges["kv_cache_usage"].copy())
    return m, np.array(waiting).mean(axis=0), np.array(usage).min(axis=0), np.array(usage).max(axis=0)


def others(values: np.ndarray, engine: int) -> np.ndarray:
    return np.delete(values, engine)


def test_a_straggler_keeps_requests_waiting_for_their_kv_while_the_pool_keeps_pace(sick):
    """...by the alert pack's measure (warehouse/rules.py: mean waiting over time, against the pool's median)."""
    _, waiting, _, _ = sick
    rules = AlertRules()
    assert waiting[STRAGGLER] >= rules.straggler_min_waiting
    assert waiting[STRAGGLER] > rules.straggler_factor * np.median(waiting)
    assert others(waiting, STRAGGLER).max() < rules.straggler_min_waiting / 4


def test_failed_transfers_are_counted_on_the_failing_engine_only(sick):
    m, _, _, _ = sick
    failed = m.decode[0].counters["nixl_failed_transfers"]
    assert np.flatnonzero(failed).tolist() == [FAILING]
    assert failed[FAILING] == int(failed[FAILING])  # whole transfers
    assert all(p.counters["nixl_failed_transfers"].sum() == 0 for p in m.prefill)


def test_a_saturated_engine_runs_full_and_preempts_alone(sick):
    m, _, low, high = sick
    assert low[SATURATED] == 1.0
    assert others(high, SATURATED).max() < 0.95
    preempted = m.decode[0].counters["num_preemptions"]
    assert np.flatnonzero(preempted).tolist() == [SATURATED]
    assert preempted[SATURATED] == int(preempted[SATURATED]) > 0


def test_a_rack_without_faults_neither_fails_nor_preempts():
    m = RackModel(load_profile("deepseek-v4.1-flash"), seed=3, start=0.0)
    m.advance(40.0)
    assert m.decode[0].counters["nixl_failed_transfers"].sum() == 0
    assert m.decode[0].counters["num_preemptions"].sum() == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("slow:decode-0", "KIND one of straggler, nixl-failures, kv-saturated, draft-collapse"),
        ("straggler", "expected KIND:INSTANCE"),
        ("straggler:decode-0:x", "a whole number"),
    ],
)
def test_malformed_faults_are_refused(spec, message):
    with pytest.raises(FaultError, match=message):
        Fault.parse(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("straggler:decode-9", "no decode instance 'decode-9'"), ("straggler:decode-0:64", "engines 0..63")],
)
def test_faults_off_the_rack_are_refused(spec, message):
    with pytest.raises(FaultError, match=message):
        RackModel(load_profile("deepseek-v4.1-flash"), seed=3, start=0.0, faults=(Fault.parse(spec),))
