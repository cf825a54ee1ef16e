"""What fits the warehouse's columns, checked before a value is stored: text is valid UTF-8, a
count fits a BIGINT. The gateway cleans what it records with these, and the warehouse checks
what it is fed with them again (a feed may come from an older gateway, or anything else)."""

from __future__ import annotations

from typing import TypeGuard

MAX_COUNT = 2**63 - 1  # BIGINT's largest value; a larger token count is not a count
MAX_REQUEST_TOKENS = 2**31 - 1
"""The most tokens one request's prompt or output may count. A request's tokens fit its model's
context window (max_model_len), and the longest any served model has is DeepSeek-V4's 1,048,576:
this leaves 2,048 times that, and keeps sums safe: a BIGINT holds the sum of 2^32 such requests,
an hour of 1.2 million requests a second."""


def clean_text(text: str) -> str:
    """`text` as valid UTF-8: a lone surrogate (valid JSON: "\\ud800") becomes U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def is_count(value: object) -> TypeGuard[int]:
    """A non-negative integer (not a bool) that fits a BIGINT."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def is_token_count(value: object) -> TypeGuard[int]:
    """A count of one request's tokens: a non-negative integer of at most MAX_REQUEST_TOKENS."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_REQUEST_TOKENS
