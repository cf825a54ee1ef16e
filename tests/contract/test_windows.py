"""Window presets are values: every picker lists keys of one table, and no page or benchmark
spells a label (a label is what a person reads; code holds the key)."""

from __future__ import annotations

import ast
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from moemeter.contract import windows

ROOT = Path(__file__).parents[2]


def test_every_offered_key_is_a_preset_and_every_label_is_one_presets():
    for offer in (windows.RECENT, windows.CALENDAR, windows.FLEET):
        assert all(k in windows.PRESETS for k in offer)
    labels = [p.label for p in windows.PRESETS.values()]
    assert len(set(labels)) == len(labels)


def test_rolling_presets_have_spans_in_order_and_calendar_ones_refuse_one():
    spans = [windows.span(k) for k in windows.RECENT]
    assert spans == sorted(spans) and spans[0].total_seconds() == 300
    for key in ("today", "yesterday", "week", "month", "last_month", "custom"):
        with pytest.raises(ValueError, match=key):
            windows.span(key)


@pytest.mark.parametrize("top", ["dashboard", "benchmarks"])
def test_no_page_or_benchmark_spells_a_label(top):
    labels = {p.label for p in windows.PRESETS.values()}
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
        for path in sorted((ROOT / top).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in labels
    ]
    assert found == []


def test_calendar_presets_are_whole_utc_days_and_months_or_so_far():
    latest = datetime(2027, 1, 1, 0, 0, 30)  # a month, a year, a day, just turned
    assert windows.calendar("today", latest) == (datetime(2027, 1, 1), latest + timedelta(seconds=1))
    assert windows.calendar("yesterday", latest) == (datetime(2026, 12, 31), datetime(2027, 1, 1))
    assert windows.calendar("week", latest) == (datetime(2026, 12, 25), datetime(2027, 1, 1))
    assert windows.calendar("month", latest) == (datetime(2027, 1, 1), latest + timedelta(seconds=1))
    assert windows.calendar("last_month", latest) == (datetime(2026, 12, 1), datetime(2027, 1, 1))
    march = datetime(2028, 3, 31, 23, 59)  # after a leap February
    assert windows.calendar("last_month", march) == (datetime(2028, 2, 1), datetime(2028, 3, 1))
    assert windows.calendar("month", march)[0] == datetime(2028, 3, 1)
    for key in ("24h", "custom", "30d"):
        with pytest.raises(ValueError, match=key):
            windows.calendar(key, latest)
