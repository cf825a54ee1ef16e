"""The sick rack's faults and times (tests/dashboard/conftest.py builds it)."""

from __future__ import annotations

from datetime import datetime, timedelta

T0 = datetime(2026, 11, 30, 12, 0, 0)
START = 1_000_000.0  # twin epoch seconds at T0
STRAGGLER, FAILING, SATURATED, COLLAPSED = "7", "5", "3", "11"
FAULTS = (
    f"straggler:decode-0:{STRAGGLER}",
    f"nixl-failures:decode-0:{FAILING}",
    f"kv-saturated:decode-0:{SATURATED}",
    f"draft-collapse:decode-0:{COLLAPSED}",
)
ROUNDS = 49  # 8 minutes of scrapes every 10 s
LATEST = T0 + timedelta(seconds=10 * (ROUNDS - 1))
