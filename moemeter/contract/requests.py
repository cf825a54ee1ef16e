"""A request as the gateway records it, the feed's schema, which outcomes are the server's fault,
the latency histograms' buckets, and how a user of a tenant is named: read by the gateway that
writes records and by the warehouse that stores and reports them."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

SCHEMA = "moemeter.requests/1"
SERVER_FAULTS = frozenset(
    {
        "upstream_timeout",
        "upstream_unavailable",
        "upstream_error",
        "upstream_5xx",
        "upstream_dropped",
        "upstream_stream_error",
        "gateway_error",
        "overloaded",
    }
)
"""Outcomes that are the server side's failure, not the client's: they count against availability
(the gateway turning requests away when it is full is one). A refused request (bad JSON, unknown
model, no key, a malformed SLO header), an upstream 4xx and a client that went away do not."""


@dataclass
class RequestRecord:
    """One request as the gateway saw it. Times are seconds; `started_at` is epoch seconds."""

    request_id: str  # the X-Request-Id the gateway set and passed upstream
    started_at: float
    user: str  # a user of `tenant`: the request's `user` field, else the tenant's name
    tenant: str  # the API key's tenant, else "anonymous"
    model: str
    endpoint: str  # "completions" | "chat/completions"
    stream: bool
    status: int  # HTTP status the client got (499: the client went away)
    outcome: str  # "ok", or the error class
    prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None  # upstream's prompt_tokens_details.cached_tokens, when it says
    generated_tokens: int = 0
    ttft_seconds: float | None = None  # request received -> first token chunk (streams only)
    itl_mean_seconds: float | None = None  # (last token - first token) / (generated - 1), streams only
    itl_max_seconds: float | None = None  # the longest gap between token chunks
    decode_tokens_per_second: float | None = None  # 1 / itl_mean_seconds
    e2e_seconds: float = 0.0
    usage_reported: bool = False  # token counts came from the upstream's usage, not from counting chunks
    slo_ttft_seconds: float | None = None  # the request's own TTFT target (x-slo-ttft-ms), when it set one
    slo_itl_seconds: float | None = None  # its own mean inter-token latency target (x-slo-tpot-ms)

    def to_json(self) -> dict[str, object]:
        # asdict() without its deep copy (every field is a plain value; a dataclass without slots
        # holds exactly its fields in its __dict__, in their order): the twin's fast-forward spent
        # 40% of its time in asdict(), and 5% in a dict built field by field
        return dict(self.__dict__)


RECORD_KEYS = ("seq", *(f.name for f in fields(RequestRecord)))
"""A feed record's keys, in order: its sequence number, then RequestRecord's fields."""


class ColumnPage(dict[str, object]):
    """A feed page made in the process that stores it (the fast-forward's twin): its records as
    columns, one list per key of RECORD_KEYS under "fields", instead of a list of records under
    "records". The warehouse reads it with the same checks as records; a page read from the network
    is never one (JSON gives plain dicts)."""


def records_of(fields: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The records whose fields these columns are, each a dict with the columns' keys in order."""
    return [dict(zip(fields, row, strict=True)) for row in zip(*fields.values(), strict=True)]


TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""The gateway's latency histograms' bucket bounds, seconds (its /metrics and the alert pack's
quantiles read the same)."""

ANONYMOUS = "anonymous"
"""The tenant of requests without a key; no key may be given it."""


def user_of_tenant(user: str, tenant: str) -> str:
    """How reports, pages and messages name a user of a tenant ("alice of acme"): users of one name
    in two tenants are two users."""
    return f"{user} of {tenant}"
