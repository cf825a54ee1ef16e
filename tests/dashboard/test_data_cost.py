"""Where the Cost page's daily statement starts (the statement itself: tests/warehouse/test_cost.py,
the page: tests/integration/test_cost_page.py)."""

from __future__ import annotations

from datetime import datetime

from dashboard.data.cost import statement_from

FIRST = datetime(2026, 12, 4, 6, 1, 46)  # the day file's first scrape
END = datetime(2026, 12, 5, 6, 1, 46, 1)


def test_a_preset_windows_statement_counts_its_first_day_from_when_the_rack_was_first_seen():
    """'Last 24 h' over a day of history starts after the first scrape, but its statement's first
    day starts at midnight: six hours nobody observed, which are not charged."""
    assert statement_from(datetime(2026, 12, 4, 6, 1, 46, 1), END, FIRST, explicit=False) == FIRST
    assert statement_from(datetime(2026, 12, 4), END, FIRST, explicit=False) == FIRST  # 'Today' on a new install


def test_otherwise_the_statement_counts_whole_days():
    midnight = datetime(2026, 12, 4)
    assert statement_from(datetime(2026, 12, 4, 6, 1, 46, 1), END, FIRST, explicit=True) == midnight  # the reader's
    assert statement_from(datetime(2026, 12, 4, 12), END, datetime(2026, 12, 3, 23), explicit=False) == midnight
    assert statement_from(datetime(2026, 12, 4, 12), END, None, explicit=False) == midnight
    assert statement_from(datetime(2026, 12, 4, 12), datetime(2026, 12, 4, 13), datetime(2026, 12, 4, 14), False) == (
        midnight  # first seen after the window: nothing to move
    )
