"""Window presets are values: every picker lists keys of one table, and no page or benchmark
spells a label (a label is what a person reads; code holds the key)."""

from __future__ import annotations

import ast
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
    for key in ("today", "yesterday", "week", "custom"):
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
