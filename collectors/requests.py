"""Read the metering gateways' request feeds (GET <gateway>/moemeter/requests?after=SEQ).

Pages are only fetched here; the warehouse stores them together with the new cursor, in the
same transaction as the round's scrapes, so nothing is stored twice or skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from moemeter.contract import TargetInfo
from warehouse.requests import Cursor

from .experts import endpoint_url
from .scrape import Fetch, ScrapeError

FEED_PATH = "/moemeter/requests"
PAGE_LIMIT = 5000


@dataclass
class FeedResult:
    target: TargetInfo
    pages: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


async def fetch_feed(
    target: TargetInfo, cursor: Cursor | None, fetch: Fetch, timeout: float, max_pages: int = 20
) -> FeedResult:
    """Pages after the cursor, at most `max_pages` of PAGE_LIMIT records (the rest next round)."""
    out = FeedResult(target)
    log_id, after = (cursor.log_id, cursor.seq) if cursor else (None, 0)
    for _ in range(max_pages):
        url = f"{endpoint_url(target, FEED_PATH)}?after={after}&limit={PAGE_LIMIT}"
        try:
            resp = await fetch(url, timeout)
        except ScrapeError as exc:
            out.error = str(exc)
            return out
        if resp.status != 200:
            out.error = f"HTTP {resp.status} from {FEED_PATH}"
            return out
        try:
            page = json.loads(resp.body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            out.error = f"feed page is not JSON: {exc}"
            return out
        if not isinstance(page, dict):
            out.error = "feed page is not a JSON object"
            return out
        if log_id is not None and page.get("log_id") != log_id and after > 0:
            log_id, after = page.get("log_id"), 0  # a new log: read it from its start
            continue
        log_id = page.get("log_id")
        out.pages.append(page)
        nxt = page.get("next")
        if not page.get("more") or not isinstance(nxt, int) or nxt <= after:
            return out
        after = nxt
    return out
