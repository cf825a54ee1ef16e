"""The bench's month is the day's whole hours end to end, trimmed as retention trims: every copy
counts the tokens and GPU-hours the day counts, whether its raw rows are kept or only its rollups."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta

import duckdb
import pytest

from benchmarks import month
from collectors.parse import parse_page
from tests.warehouse.test_read import DECODE, PREFILL, decode_page, histogram, numbers, prefill_page
from warehouse.api import LocalQuery
from warehouse.db import apply_migrations
from warehouse.ingest import Ingestor, ScrapeBatch

FIRST, LAST = datetime(2026, 11, 28, 0, 10, 20), datetime(2026, 11, 28, 6, 50, 20)
START, END = datetime(2026, 11, 28, 1), datetime(2026, 11, 28, 6)  # the whole hours copied
PERIOD = END - START


def day(path, first=FIRST, last=LAST) -> None:
    """Scrapes every 5 minutes of a prefill and a decode instance, counters at constant rates."""
    con = duckdb.connect(str(path))
    apply_migrations(con)
    ing, t = Ingestor(clock=lambda: datetime(2027, 1, 1)), first
    while t <= last:
        s = (t - first).total_seconds()
        page = prefill_page(10_000 * s, 2_000 * s) + histogram("prefill", s)
        ing.write_all(
            con,
            [
                ScrapeBatch(PREFILL, t, True, 0.01, parse_page(page.encode())),
                ScrapeBatch(DECODE, t, True, 0.01, parse_page(decode_page(4_000 * s).encode())),
            ],
        )
        t += timedelta(minutes=5)
    con.close()


def tokens(q: LocalQuery, window: tuple[datetime, datetime]) -> dict[str, float]:
    n = numbers(q, window)
    n.pop("revenue")  # peak and off-peak prices follow the clock, which the copies do not
    return n


def test_every_copy_counts_what_the_day_counts_with_raw_rows_or_with_rollups_alone(tmp_path):
    path = tmp_path / "m.duckdb"
    day(path)
    rows = month.extend(path, days=3)
    q = LocalQuery(duckdb.connect(str(path), read_only=True))
    inside = (START + timedelta(minutes=40), START + timedelta(hours=4, minutes=10))
    want = tokens(q, inside)
    assert want["generated"] == pytest.approx(4_000 * 3.5 * 3600)
    copies = int(timedelta(days=3) / PERIOD)
    for k in range(1, copies + 1):
        shifted = (inside[0] - k * PERIOD, inside[1] - k * PERIOD)
        assert tokens(q, shifted) == pytest.approx(want, rel=1e-9), f"copy {k}, from {shifted[0]}"
    oldest = dict(
        q("SELECT 'raw', min(ts) FROM increments UNION ALL SELECT 'minutes', min(ts) FROM increments_1m").values
    )
    assert LAST - timedelta(days=2) <= oldest["raw"] < LAST - timedelta(days=2) + PERIOD  # retention's raw days
    assert LAST - timedelta(days=3) - PERIOD < oldest["minutes"] <= LAST - timedelta(days=3)
    seen = q(
        "SELECT any_value(t.first_seen) = min(s.ts) AS ok FROM targets t JOIN scrapes s ON s.target = t.name GROUP BY t.name"
    )
    assert seen.ok.all()  # the page's pools are the targets seen in its window
    assert rows["scrapes"] == q("SELECT count(*) FROM scrapes").iloc[0, 0] > 2 * 12 * 24 * 3 * 0.9


def test_the_partial_first_hour_is_dropped_not_copied_over_the_first_whole_one(tmp_path):
    path = tmp_path / "m.duckdb"
    day(path)
    month.extend(path, days=1)
    q = LocalQuery(duckdb.connect(str(path), read_only=True))
    per_target = q("SELECT target, ts, count(*) AS n FROM scrapes GROUP BY ALL HAVING n > 1")
    assert per_target.empty  # no two scrapes of a target at one time
    # the first copy fills the hours before the first whole one, and the day's own partial hour is gone
    assert (
        q("SELECT count(*) FROM scrapes WHERE ts >= $s AND ts < $e", {"s": START - PERIOD, "e": START}).iloc[0, 0]
        == 2 * 60
    )


@pytest.mark.parametrize(
    ("first", "last", "error"),
    [(None, None, "no scrapes"), (FIRST, FIRST + timedelta(minutes=45), "no whole hour")],
)
def test_a_file_with_no_whole_hour_of_scrapes_is_refused_and_left_as_it_was(tmp_path, first, last, error):
    path = tmp_path / "m.duckdb"
    if first is None:
        apply_migrations(con := duckdb.connect(str(path)))
        con.close()
    else:
        day(path, first, last)
    before = path.read_bytes()
    with pytest.raises(SystemExit, match=error):
        month.extend(path)
    assert path.read_bytes() == before


def test_a_month_that_would_not_fit_on_the_disk_is_refused_before_a_row_is_copied(tmp_path, monkeypatch):
    path = tmp_path / "m.duckdb"
    day(path)
    before = path.read_bytes()
    full = shutil.disk_usage(tmp_path)._replace(free=len(before) * 3)  # a fake: a full disk is not provoked here
    monkeypatch.setattr(month.shutil, "disk_usage", lambda _: full)
    with pytest.raises(SystemExit, match=r"needs about .* GB free in .*, which has 0 GB"):
        month.extend(path)
    assert path.read_bytes() == before
