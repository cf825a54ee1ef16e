"""CPU overhead page data on a warehouse seeded from the twin's step-phase families, checked
against the twin's own [overhead] profile; and the page itself (AppTest)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import duckdb
import pytest

from collectors.parse import PageCache
from dashboard.data import overhead as data
from dashboard.data.live import Window
from moemeter.contract import TargetInfo
from stack.twin.config import load_profile
from stack.twin.exposition import render_step_phases, render_vllm
from stack.twin.model import RackModel
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.ingest import Ingestor, ScrapeBatch

T0 = datetime(2026, 11, 30, 12, 0, 0)
PREFILL = TargetInfo("prefill-0", "http://twin/prefill-0/metrics", "prefill", 2, "twin:test")
DECODE = TargetInfo("decode-0", "http://twin/decode-0/metrics", "decode", 64, "twin:test")


def seed(con: duckdb.DuckDBPyConnection, overhead, start: datetime, minutes: float = 2.0) -> RackModel:  # type: ignore[no-untyped-def]
    p = dataclasses.replace(load_profile("deepseek-v4.1-flash").with_workload(agents=400), overhead=overhead)
    m = RackModel(p, seed=3, start=start.timestamp() - 30, tick=0.5)  # 0.5 s ticks: 5x faster
    ing, caches = Ingestor(), {t.name: PageCache() for t in (PREFILL, DECODE)}  # as a collector keeps them
    for k in range(int(minutes * 12) + 1):
        m.advance(start.timestamp() + 5 * k)
        ts = start + timedelta(seconds=5 * k)
        for target, inst in ((PREFILL, m.prefill[0]), (DECODE, m.decode[0])):
            page = render_vllm(inst, p) + render_step_phases(inst, p.model.name)
            ing.write(con, ScrapeBatch(target, ts, True, 0.01, caches[target.name].parse(page.encode())))
    return m


@pytest.fixture(scope="module")
def seeded():
    con = duckdb.connect()
    apply_migrations(con)
    base = load_profile("deepseek-v4.1-flash").overhead
    seed(con, base, T0)
    slower = dataclasses.replace(base, schedule_fraction=base.schedule_fraction * 2)  # the "deploy"
    seed(con, slower, T0 + timedelta(minutes=10))
    return LocalQuery(con), base, slower


def test_phases_per_step_follow_the_profile(seeded):
    q, base, _ = seeded
    w = Window(T0, T0 + timedelta(minutes=2), 30)
    table = data.per_step(data.step_time(q, w))
    assert set(table["pool"]) == {"prefill", "decode"}
    whole = data.per_step(data.step_time(q, w).assign(bucket=0), by=("pool",)).set_index("pool")
    for pool in ("prefill", "decode"):
        r = whole.loc[pool]
        assert r["schedule"] / r["wall"] == pytest.approx(base.schedule_fraction, rel=1e-6)
        assert r["forward"] / r["wall"] == pytest.approx(base.forward_fraction(), rel=1e-6)
        assert r["overhead"] == pytest.approx(r["wall"] - r["forward"])
        assert r["idle_fraction"] == pytest.approx(1 - base.forward_fraction(), rel=1e-6)
        assert r["other"] == pytest.approx(0.0, abs=1e-9)  # the twin's phases fill the step
    long = data.long_phases(table[table["pool"] == "decode"])
    assert set(long["phase"]) == {*data.PHASES, "other"}


def test_before_after_shows_the_change(seeded):
    q, base, slower = seeded
    table = data.compare(q, (T0, T0 + timedelta(minutes=2)), (T0 + timedelta(minutes=10), T0 + timedelta(minutes=12)))
    sched = table[(table["pool"] == "decode") & (table["phase"] == "schedule")].iloc[0]
    # Twice the share of a step; the step itself is the same workload, so close to +100%.
    assert 80 < sched["change_pct"] < 120
    assert list(table[table["pool"] == "decode"]["phase"])[:2] == ["schedule", "prepare_inputs"]


def test_api_server_delay_is_ttft_minus_queue_and_prefill(seeded):
    q, _, _ = seeded
    d = data.api_server_delay(q, Window(T0, T0 + timedelta(minutes=2), 30))
    assert len(d) and (d["api_delay_ms"] >= 0).all()
    assert (d["ttft_ms"] >= d["queue_ms"] + d["prefill_ms"] - 1e-6).all()
    assert (d["api_output_ms"] > 0).all()


def test_empty_windows_give_empty_tables(seeded):
    q, _, _ = seeded
    w = Window(T0 - timedelta(days=1), T0 - timedelta(hours=23), 30)
    assert data.per_step(data.step_time(q, w)).empty
    assert data.api_server_delay(q, w).empty
    assert data.compare(q, (w.start, w.end), (w.start, w.end)).empty
