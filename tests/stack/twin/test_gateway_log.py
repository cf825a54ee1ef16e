"""The twin's gateway log as the warehouse reads it across a restart of the twin."""

from __future__ import annotations

from datetime import datetime

import duckdb
import numpy as np
import pytest

from moemeter.contract.requests import ColumnPage, RequestRecord, records_of
from stack.gateway.metrics import GatewayMetrics
from stack.twin.gateway_log import TwinGatewayLog
from warehouse.db import apply_migrations
from warehouse.requests import RequestIngestor


def one_request(log: TwinGatewayLog, user: int, n: int = 1) -> None:
    """`n` requests of `user` (a batch, as the twin's finished requests of a tick come)."""
    t = np.full(n, 1_796_000_000.0)
    log.add(np.full(n, user), t, t + 0.1, t + 1.0, np.full(n, 100), np.full(n, 50), np.full(n, 20), np.full(n, 0.005))


def test_a_restarted_twin_is_a_new_log_and_none_of_its_records_is_skipped():
    """Same seed, records numbered from 1 again: with one fixed log id the warehouse's cursor (already
    past them) skipped the restarted twin's records."""
    con = duckdb.connect()
    apply_migrations(con)
    ing, now = RequestIngestor(), datetime(2026, 12, 1, 12)
    first = TwinGatewayLog(seed=0, model="m")
    for u in range(3):
        one_request(first, u)
    ing.write(con, "gateway", first.page(0, 100), now)
    restarted = TwinGatewayLog(seed=0, model="m")
    one_request(restarted, 7)
    assert restarted.log_id != first.log_id
    ing.write(con, "gateway", restarted.page(0, 100), now)
    users = [r[0] for r in con.execute("SELECT user_id FROM requests ORDER BY user_id").fetchall()]
    assert users == ["user-0000", "user-0001", "user-0002", "user-0007"]


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_a_page_holds_the_records_after_the_cursor_that_the_log_still_keeps(batch):
    log = TwinGatewayLog(seed=0, model="m", keep=10)
    assert log.page(0, 5) == {**log.page(0, 5), "oldest": None, "records": [], "next": 0, "more": False}
    for u in range(0, 25, batch):
        one_request(log, u, min(batch, 25 - u))  # records 16..25 kept
    assert len(log) == 10
    for after in (0, 10, 15, 16, 20, 24, 25, 30):
        for limit in (1, 3, 10, 50):
            page = log.page(after, limit)
            seqs = [r["seq"] for r in page["records"]]  # type: ignore[attr-defined]
            want = [s for s in range(max(after + 1, 16), 26)][:limit]
            assert seqs == want, (after, limit)
            assert page["oldest"] == 16 and page["next"] == (want[-1] if want else after)
            assert page["more"] == (max(after + 1, 16) + limit <= 25)
        # the fast-forward's page: every record kept after the cursor, as columns
        whole = log.page(after, 100)
        columns = log.column_page(after)
        assert type(columns) is ColumnPage and columns["more"] is False
        assert {k: v for k, v in columns.items() if k != "fields"} == {k: v for k, v in whole.items() if k != "records"}
        fields = columns["fields"]
        assert records_of(fields) == whole["records"]  # type: ignore[arg-type]


def test_a_batch_of_records_and_its_metrics_are_those_of_the_gateways_request_by_request_path():
    """The twin builds a minute's records column by column and counts them into the gateway's
    metrics at once: every record equals RequestRecord(...).to_json() with its seq, and every
    counter and bucket what GatewayMetrics.observe gives request by request (sums to 1e-12)."""
    rng = np.random.default_rng(7)
    n = 5_000
    user = rng.integers(0, 120, n)  # more users than the 50 labels: the rest are "other"
    arrival = 1_796_000_000.0 + rng.uniform(0, 60, n)
    first = arrival + rng.exponential(0.3, n)
    first[:3] = arrival[:3]  # a zero TTFT
    finish = first + rng.exponential(5.0, n)
    prompt = rng.integers(1, 9_000, n)
    cached = np.minimum(prompt, rng.integers(0, 9_000, n))
    generated = rng.integers(0, 800, n)
    generated[:10] = 1  # one token: no inter-token latency
    tpot = rng.exponential(0.02, n)
    tpot[10:20] = 0.0
    log = TwinGatewayLog(seed=0, model="m")
    log.add(user, arrival, first, finish, prompt, cached, generated, tpot)
    log.add(user[:7], arrival[:7], first[:7], finish[:7], prompt[:7], cached[:7], generated[:7], tpot[:7])

    referee = GatewayMetrics()
    want = []
    for k, i in enumerate([*range(n), *range(7)]):
        u, g, itl = int(user[i]), int(generated[i]), float(tpot[i])
        timed = g > 1 and itl > 0
        r = RequestRecord(
            request_id=f"twin-{k + 1}",
            started_at=float(arrival[i]),
            user=f"user-{u:04d}",
            tenant=f"tenant-{u // 15:02d}",
            model="m",
            endpoint="chat/completions" if u % 10 < 7 else "completions",
            stream=True,
            status=200,
            outcome="ok",
            prompt_tokens=int(prompt[i]),
            cached_prompt_tokens=int(cached[i]),
            generated_tokens=g,
            ttft_seconds=max(float(first[i]) - float(arrival[i]), 0.0),
            itl_mean_seconds=itl if timed else None,
            decode_tokens_per_second=1 / itl if timed else None,
            e2e_seconds=max(float(finish[i]) - float(arrival[i]), 0.0),
            usage_reported=True,
        )
        referee.observe(r)
        want.append({"seq": k + 1, **r.to_json()})
    got = log.page(0, 2 * n)["records"]
    assert got == want
    assert [list(r) for r in got[:1]] == [list(want[0])]  # the keys in the same order

    def samples(m: GatewayMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in m.collect() for s in f.samples}

    mine, theirs = samples(log.metrics), samples(referee)
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        if key[0].endswith("_sum"):
            assert mine[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert mine[key] == value, key
