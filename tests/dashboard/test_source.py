"""The banner every page shows while the warehouse cannot write, from GET /health."""

from __future__ import annotations

from dashboard.source import writer_health, writer_warning


def test_no_banner_while_writes_succeed_or_the_api_is_silent():
    assert writer_warning({"ok": True, "failed_writes": 0}) is None
    assert writer_warning(None) is None
    assert writer_health.__wrapped__("http://127.0.0.1:9") is None  # nothing listens: no banner, no crash


def test_banner_says_why_since_when_and_what_is_lost():
    text = writer_warning({"ok": False, "problem": "disk full", "since": "2026-11-30T13:00:00+00:00",
                           "failed_writes": 7, "last_write": "2026-11-30T12:59:55+00:00",
                           "error": "No space left on device"})  # fmt: skip
    assert text is not None
    assert "disk full" in text and "7 rounds lost" in text and "12:59:55" in text and "No space left" in text
