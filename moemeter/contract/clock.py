"""The writer's clock, and how far past it a time from a source may lie. Imports nothing of ours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

MAX_AHEAD = timedelta(minutes=5)
"""How far past this host's clock a time from a source may lie (the clocks of a rack's hosts agree
within milliseconds under NTP; five minutes forgives a bad one). Anything later is refused: a
time from data never moves a watermark, retention or "now" past the clock."""


def utc_now() -> datetime:
    """Now, as every stored time is: naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def latest_allowed(now: datetime | None = None) -> datetime:
    """The latest time a source may give: `now` (this host's clock unless given) plus MAX_AHEAD."""
    return (now or utc_now()) + MAX_AHEAD
