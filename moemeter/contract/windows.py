"""The windows a page offers, as values: a key (what a picker, session state, a URL and the
benchmarks hold), a label (what a person reads) and a span. A page's picker lists keys and shows
labels (Streamlit's `format_func`); no code compares labels.

A rolling preset ends at the newest reading and spans `span`. A calendar preset (today, yesterday,
the seven whole days before today, this month so far, last month) has no fixed span: `calendar`
says where it starts and ends in UTC days. `custom` asks for dates.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Preset:
    key: str
    label: str
    span: timedelta | None = None
    """A rolling preset's length; None for a calendar one or custom."""


PRESETS: dict[str, Preset] = {
    p.key: p
    for p in (
        Preset("5m", "5 min", timedelta(minutes=5)),
        Preset("15m", "15 min", timedelta(minutes=15)),
        Preset("1h", "1 h", timedelta(hours=1)),
        Preset("6h", "6 h", timedelta(hours=6)),
        Preset("24h", "24 h", timedelta(hours=24)),
        Preset("7d", "7 d", timedelta(days=7)),
        Preset("30d", "30 d", timedelta(days=30)),
        Preset("yesterday", "Yesterday"),
        Preset("today", "Today"),
        Preset("week", "Last 7 days"),
        Preset("month", "This month"),
        Preset("last_month", "Last month"),
        Preset("custom", "Custom"),
    )
}
"""Every window any page or benchmark offers, by key."""

RECENT = ("5m", "15m", "1h", "6h", "24h", "7d", "30d")
"""The rolling spans the live pages offer (Live, Users, SLOs, Experts, CPU overhead, DP ranks)."""
CALENDAR = ("yesterday", "today", "24h", "week", "month", "last_month", "custom")
"""The finance windows the Cost page offers."""
FLEET = ("1h", "24h", "7d")
"""The spans the Fleet page offers."""


def label(key: str) -> str:
    """What a picker shows for `key` (its `format_func`)."""
    return PRESETS[key].label


def span(key: str) -> timedelta:
    """A rolling preset's length."""
    s = PRESETS[key].span
    if s is None:
        raise ValueError(f"the window {key!r} has no fixed span")
    return s


def calendar(key: str, latest: datetime) -> tuple[datetime, datetime]:
    """A calendar preset's [start, end) in UTC, the newest reading being `latest`: whole days and
    months before today's, or today's and this month's so far (through `latest`)."""
    today = latest.replace(hour=0, minute=0, second=0, microsecond=0)
    month = today.replace(day=1)
    through = latest + timedelta(seconds=1)  # the newest reading is inside
    spans = {
        "yesterday": (today - timedelta(days=1), today),
        "today": (today, through),
        "week": (today - timedelta(days=7), today),
        "month": (month, through),
        "last_month": ((month - timedelta(days=1)).replace(day=1), month),
    }
    if key not in spans:
        raise ValueError(f"the window {key!r} is not a calendar preset")
    return spans[key]
