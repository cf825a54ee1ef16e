"""Small helpers shared by the pages' controls."""

from __future__ import annotations

from datetime import date, datetime, timedelta


def day_span(picked: object, fallback: date) -> tuple[datetime, datetime]:
    """Whole UTC days from a date-range picker's value: [first day 00:00, last day + 1 day).

    While someone is choosing, `st.date_input` returns a tuple of one date (only the start picked),
    or none; a lone date or nothing falls back sensibly instead of failing the page.
    """
    days = [d for d in (picked if isinstance(picked, tuple | list) else [picked]) if isinstance(d, date)]
    first, last = (days[0], days[-1]) if days else (fallback, fallback)
    first, last = min(first, last), max(first, last)
    return datetime.combine(first, datetime.min.time()), datetime.combine(last, datetime.min.time()) + timedelta(days=1)
