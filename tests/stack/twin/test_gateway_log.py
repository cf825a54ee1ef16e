"""The twin's gateway log as the warehouse reads it across a restart of the twin."""

from __future__ import annotations

from datetime import datetime

import duckdb
import numpy as np

from stack.twin.gateway_log import TwinGatewayLog
from warehouse.db import apply_migrations
from warehouse.requests import RequestIngestor


def one_request(log: TwinGatewayLog, user: int) -> None:
    t = 1_796_000_000.0
    a = np.array
    log.add(a([user]), a([t]), a([t + 0.1]), a([t + 1.0]), a([100]), a([50]), a([20]), a([0.005]))


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


def test_a_page_holds_the_records_after_the_cursor_that_the_log_still_keeps():
    log = TwinGatewayLog(seed=0, model="m", keep=10)
    for u in range(25):
        one_request(log, u)  # records 16..25 kept
    for after in (0, 10, 15, 16, 20, 24, 25):
        for limit in (1, 3, 10, 50):
            page = log.page(after, limit)
            seqs = [r["seq"] for r in page["records"]]  # type: ignore[attr-defined]
            want = [s for s in range(max(after + 1, 16), 26)][:limit]
            assert seqs == want, (after, limit)
            assert page["oldest"] == 16 and page["next"] == (want[-1] if want else after)
            assert page["more"] == (max(after + 1, 16) + limit <= 25)
