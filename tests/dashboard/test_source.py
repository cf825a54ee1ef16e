"""The banners every page shows while the warehouse cannot write or rounds fail, from GET /health."""

from __future__ import annotations

from dashboard.source import api_health, collector_warning, starting_note, writer_warning


def test_no_banner_while_writes_succeed_or_the_api_is_silent():
    assert writer_warning({"ok": True, "failed_writes": 0}) is None
    assert writer_warning(None) is None and collector_warning(None) is None
    assert collector_warning({"ok": True, "rounds": 3, "rounds_failed": 1}) is None
    assert api_health.__wrapped__("http://127.0.0.1:9") is None  # nothing listens: no banner, no crash


def test_while_the_stack_starts_pages_say_so():
    assert starting_note({"ok": True, "starting": "", "rounds": 4}) is None and starting_note(None) is None
    note = starting_note({"ok": True, "starting": "waiting for the targets file t.json: ...", "rounds": 0})
    assert note is not None and note.startswith("Starting:") and "t.json" in note and "vLLM" in note


def test_collector_banner_says_since_when_and_why():
    text = collector_warning(
        {
            "ok": False,
            "failing_since": "2026-11-30T13:00:00+00:00",
            "rounds_failed": 4,
            "last_error": "OverflowError: int too big to convert",
        }
    )
    assert text is not None and "13:00:00" in text and "4 failed" in text and "OverflowError" in text


def test_banner_says_why_since_when_and_what_is_lost():
    text = writer_warning(
        {
            "ok": False,
            "problem": "disk full",
            "since": "2026-11-30T13:00:00+00:00",
            "failed_writes": 7,
            "last_write": "2026-11-30T12:59:55+00:00",
            "error": "No space left on device",
        }
    )
    assert text is not None
    assert "disk full" in text and "7 rounds lost" in text and "12:59:55" in text and "No space left" in text


def test_each_query_failure_reads_as_its_cause_and_what_to_do():
    import httpx

    from dashboard.source import api_error_message
    from warehouse.api import ApiUnreachable
    from warehouse.readonly import QueryBusy, QueryError, QueryRefused, QueryTimeout, QueryTooLarge

    url = "http://127.0.0.1:9"
    said = {
        cls.__name__: api_error_message(cls("why"), url)
        for cls in (ApiUnreachable, QueryTimeout, QueryTooLarge, QueryBusy, QueryRefused, QueryError)
    }
    assert said["ApiUnreachable"] == f"Cannot reach the warehouse query API at {url}: why"
    assert "took too long" in said["QueryTimeout"] and "shorter range" in said["QueryTimeout"]
    assert "more than the warehouse sends" in said["QueryTooLarge"]
    assert "busy" in said["QueryBusy"] and "refused" in said["QueryRefused"]
    assert said["QueryError"] == f"The warehouse query API at {url} failed: why"
    assert "Cannot reach" in api_error_message(httpx.ConnectError("refused"), url)
    assert all("why" in text for text in said.values())
