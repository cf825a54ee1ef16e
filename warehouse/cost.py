"""The cost model (docs/definitions.md): GPU-hours and cost per pool at a price sheet,
$/M input, output and blended tokens, idle cost, revenue at token prices, per-user allocation.

Token counts are sums of counter increases (Prometheus increase() rules, applied at ingest), read
from the finest table that still holds each part of the window: whole hours already rolled up
from `increments_1h`, whole minutes from `increments_1m`, the rest from raw `increments`. The
pieces never overlap, so totals reconcile exactly with the raw counters. Queries go through a
`Query` callable (a DuckDB cursor or the query API), so the CLI and the Cost page share them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from .prices import STORED_GPU_SQL, STORED_TOKENS_SQL, PriceSheet, default_sheet, stored_sheet
from .requests import HOURLY

Query = Callable[[str, list[Any] | None], pd.DataFrame]
METHOD = "tokens"  # per-user allocation: share of computed prompt tokens (prefill), of generated tokens (decode)
HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)


class NoData(LookupError):
    """The window holds no token counters for the pools: say so, never print zeros."""


def _ceil(t: datetime, unit: timedelta) -> datetime:
    f = _floor(t, unit)
    return f if f == t else f + unit


def _floor(t: datetime, unit: timedelta) -> datetime:
    return t.replace(minute=0 if unit == HOUR else t.minute, second=0, microsecond=0)


def segments(
    start: datetime, end: datetime, through_1m: datetime | None, through_1h: datetime | None
) -> list[tuple[str, datetime, datetime]]:
    """Cover [start, end) with (table, from, to) pieces that do not overlap: whole rolled-up hours
    from the hourly table, whole rolled-up minutes around them from the minute table, raw elsewhere."""
    out: list[tuple[str, datetime, datetime]] = []

    def raw(a: datetime, b: datetime) -> None:
        if a < b:
            out.append(("increments", a, b))

    def minutes(a: datetime, b: datetime) -> None:
        if a >= b:
            return
        m0, m1 = _ceil(a, MINUTE), min(_floor(b, MINUTE), through_1m or a)
        if m0 < m1:
            raw(a, m0)
            out.append(("increments_1m", m0, m1))
            raw(m1, b)
        else:
            raw(a, b)

    h0, h1 = _ceil(start, HOUR), min(_floor(end, HOUR), through_1h or start)
    if h0 < h1:
        minutes(start, h0)
        out.append(("increments_1h", h0, h1))
        minutes(h1, end)
    else:
        minutes(start, end)
    return out


def rollup_through(q: Query) -> tuple[datetime | None, datetime | None]:
    df = q("SELECT name, through FROM rollup_state", None)
    d = {r.name: pd.Timestamp(r.through).to_pydatetime() for r in df.itertuples()}
    return d.get("1m"), d.get("1h")


TOKENS_SQL = """
SELECT i.ts,
       coalesce(sum(i.delta) FILTER (WHERE s.metric = 'vllm:prompt_tokens_total' AND list_contains(?, s.target)), 0) AS prompt,
       coalesce(sum(i.delta) FILTER (WHERE s.metric = 'vllm:prompt_tokens_by_source_total'
                AND json_extract_string(s.labels, '$.source') = 'local_cache_hit' AND list_contains(?, s.target)), 0) AS cached,
       coalesce(sum(i.delta) FILTER (WHERE s.metric = 'vllm:generation_tokens_total' AND list_contains(?, s.target)), 0) AS generated,
       max(i.seconds) FILTER (WHERE s.metric = 'vllm:prompt_tokens_total' AND list_contains(?, s.target)) AS prefill_seconds,
       max(i.seconds) FILTER (WHERE s.metric = 'vllm:generation_tokens_total' AND list_contains(?, s.target)) AS decode_seconds
FROM {table} i JOIN series s USING (series_id)
WHERE i.ts >= ? AND i.ts < ?
  AND s.metric IN ('vllm:prompt_tokens_total', 'vllm:prompt_tokens_by_source_total', 'vllm:generation_tokens_total')
GROUP BY ALL
"""
COLUMNS = ["ts", "prompt", "cached", "generated", "prefill_seconds", "decode_seconds"]


def pool_tokens(q: Query, prefill: list[str], decode: list[str], start: datetime, end: datetime) -> pd.DataFrame:
    """One row per scrape (per minute or hour where only rollups hold the data): prefill-pool prompt and
    cached prompt tokens, decode-pool generated tokens, and the interval each pool's counters covered."""
    through_1m, through_1h = rollup_through(q)
    parts = [
        q(TOKENS_SQL.format(table=t), [prefill, prefill, decode, prefill, decode, a, b])
        for t, a, b in segments(start, end, through_1m, through_1h)
    ]
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts).sort_values("ts").reset_index(drop=True)[COLUMNS]


def price_sheet(q: Query, override: PriceSheet | None = None) -> PriceSheet:
    """The sheet given, else every version stored in the warehouse, else the default sheet."""
    if override is not None:
        return override
    stored = stored_sheet(
        list(q(STORED_GPU_SQL, None).itertuples(index=False)), list(q(STORED_TOKENS_SQL, None).itertuples(index=False))
    )
    return stored or default_sheet()


@dataclass
class PoolCost:
    gpus: int
    gpu_hours: float
    cost_usd: float
    idle_gpu_hours: float
    idle_cost_usd: float
    tokens_per_second_per_gpu: float


@dataclass
class CostReport:
    start: datetime
    end: datetime
    sheet: PriceSheet
    prefill: PoolCost
    decode: PoolCost
    prompt_tokens: float
    cached_prompt_tokens: float
    generated_tokens: float
    revenue_usd: float | None
    users: pd.DataFrame = field(default_factory=pd.DataFrame)
    first_count: datetime | None = None  # start of the first scrape interval in the window that counted tokens
    last_count: datetime | None = None  # the last scrape in the window that counted tokens

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600

    @property
    def computed_prompt_tokens(self) -> float:
        return self.prompt_tokens - self.cached_prompt_tokens

    @property
    def cost_usd(self) -> float:
        return self.prefill.cost_usd + self.decode.cost_usd

    def per_mtok(self, cost: float, tokens: float) -> float | None:
        return cost / (tokens / 1e6) if tokens > 0 else None

    def as_json(self) -> dict[str, Any]:
        gpu_sources = sorted({p.source for p in self.sheet.gpu})
        out: dict[str, Any] = {
            "window": {
                "from": self.start.isoformat() + "Z",
                "to": self.end.isoformat() + "Z",
                "hours": round(self.hours, 6),
                "first_count": _iso(self.first_count),
                "last_count": _iso(self.last_count),
            },
            "method": METHOD,
            "price_sheet": {"name": self.sheet.name, "gpu_price_sources": gpu_sources},
            "pools": {
                "prefill": {
                    "gpus": self.prefill.gpus,
                    "gpu_hours": round(self.prefill.gpu_hours, 6),
                    "cost_usd": _cents(self.prefill.cost_usd),
                    "prompt_tokens": int(self.prompt_tokens),
                    "cached_prompt_tokens": int(self.cached_prompt_tokens),
                    "computed_prompt_tokens": int(self.computed_prompt_tokens),
                    "usd_per_mtok_input": _usd(self.per_mtok(self.prefill.cost_usd, self.computed_prompt_tokens)),
                    "idle_gpu_hours": round(self.prefill.idle_gpu_hours, 6),
                    "idle_cost_usd": _cents(self.prefill.idle_cost_usd),
                    "tokens_per_second_per_gpu": round(self.prefill.tokens_per_second_per_gpu, 3),
                },
                "decode": {
                    "gpus": self.decode.gpus,
                    "gpu_hours": round(self.decode.gpu_hours, 6),
                    "cost_usd": _cents(self.decode.cost_usd),
                    "generated_tokens": int(self.generated_tokens),
                    "usd_per_mtok_output": _usd(self.per_mtok(self.decode.cost_usd, self.generated_tokens)),
                    "idle_gpu_hours": round(self.decode.idle_gpu_hours, 6),
                    "idle_cost_usd": _cents(self.decode.idle_cost_usd),
                    "tokens_per_second_per_gpu": round(self.decode.tokens_per_second_per_gpu, 3),
                },
            },
            "total": {
                "cost_usd": _cents(self.cost_usd),
                "tokens": int(self.prompt_tokens + self.generated_tokens),
                "usd_per_mtok_blended": _usd(self.per_mtok(self.cost_usd, self.prompt_tokens + self.generated_tokens)),
                "revenue_usd": _cents(self.revenue_usd) if self.revenue_usd is not None else None,
                "margin_usd": _cents(self.revenue_usd - self.cost_usd) if self.revenue_usd is not None else None,
            },
            "users": [
                {
                    "user": r["user"],
                    "requests": int(r["requests"]),
                    "prompt_tokens": int(r["prompt_tokens"]),
                    "cached_prompt_tokens": int(r["cached_prompt_tokens"]),
                    "computed_prompt_tokens": int(r["computed_prompt_tokens"]),
                    "generated_tokens": int(r["generated_tokens"]),
                    "cost_usd": _cents(r["cost_usd"]),
                }
                for r in self.users.to_dict("records")
            ],
        }
        return out


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() + "Z" if t is not None else None


def _cents(v: float) -> float:
    return round(v + 0.0, 2)


def _usd(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else round(v, 6)


def _pool_cost(
    sheet: PriceSheet,
    pool: str,
    gpus: int,
    start: datetime,
    end: datetime,
    tokens: pd.Series,
    seconds: pd.Series,
    at: pd.Series,
) -> PoolCost:
    """Reserved GPU-hours and cost over the whole window; idle = the scrape intervals in which the
    pool's token counters did not move, priced at the price in effect then."""
    cost = sheet.gpu_cost(pool, gpus, start, end)
    idle_hours = idle_cost = 0.0
    for t, n, sec in zip(at, tokens, seconds):
        if n == 0 and pd.notna(sec) and sec > 0:
            b = pd.Timestamp(t).to_pydatetime()
            a = b - timedelta(seconds=float(sec))
            idle_hours += gpus * float(sec) / 3600
            idle_cost += sheet.gpu_cost(pool, gpus, a, b)
    window = (end - start).total_seconds()
    tps = float(tokens.sum()) / (window * gpus) if gpus and window else 0.0
    return PoolCost(gpus, gpus * window / 3600, cost, idle_hours, idle_cost, tps)


def revenue(sheet: PriceSheet, tokens: pd.DataFrame) -> float | None:
    """Tokens valued at the token price in effect when they were counted (peak or off-peak by the scrape
    time; by the minute or hour start where only rollups hold them)."""
    if not sheet.tokens:
        return None
    total = 0.0
    for r in tokens.itertuples():
        t = pd.Timestamp(r.ts).to_pydatetime()
        price = sheet.token_price_at(t)
        if price is None:
            continue
        hit, miss, out = price.prices_at(t.time())
        total += (r.cached * hit + (r.prompt - r.cached) * miss + r.generated * out) / 1e6
    return total


# Per user, the requests that finished in [start, end): its whole hours [h0, h1) from the hourly
# sums plus the records not rolled up yet (the Users page's `hourly`), the edges from the records.
USERS_SQL = f"""
WITH {HOURLY}
SELECT user_id AS user, sum(requests)::BIGINT AS requests, sum(prompt_tokens)::BIGINT AS prompt_tokens,
       sum(cached_prompt_tokens)::BIGINT AS cached_prompt_tokens, sum(generated_tokens)::BIGINT AS generated_tokens
FROM (SELECT user_id, requests, prompt_tokens, cached_prompt_tokens, generated_tokens FROM hourly
      UNION ALL
      SELECT user_id, 1, prompt_tokens, coalesce(cached_prompt_tokens, 0), generated_tokens FROM requests
      WHERE finished_at >= ? AND finished_at < ? OR finished_at >= ? AND finished_at < ?)
GROUP BY user_id ORDER BY user_id
"""


def user_tokens(q: Query, start: datetime, end: datetime) -> pd.DataFrame:
    """Per user: requests, prompt, cached prompt and generated tokens of the requests that finished
    in the window."""
    h0, h1 = _ceil(start, HOUR), _floor(end, HOUR)
    if h0 >= h1:  # no whole hour: all from the records
        h0 = h1 = start
    return q(USERS_SQL, [h0, h1, h0, h1, start, h0, h1, end])


def allocate(users: pd.DataFrame, prefill_cost: float, decode_cost: float) -> pd.DataFrame:
    """Method "tokens": a user's share of prefill cost is their share of computed prompt tokens
    (prompt - cached), of decode cost their share of generated tokens."""
    if users.empty:
        return users.assign(computed_prompt_tokens=[], cost_usd=[])
    u = users.copy()
    u["computed_prompt_tokens"] = u["prompt_tokens"] - u["cached_prompt_tokens"]
    comp, gen = u["computed_prompt_tokens"].sum(), u["generated_tokens"].sum()
    u["cost_usd"] = ((u["computed_prompt_tokens"] / comp * prefill_cost) if comp else 0.0) + (
        (u["generated_tokens"] / gen * decode_cost) if gen else 0.0
    )
    return u.sort_values(["cost_usd", "user"], ascending=[False, True]).reset_index(drop=True)


def cost_report(
    q: Query, pools: dict[str, list[tuple[str, int]]], start: datetime, end: datetime, sheet: PriceSheet | None = None
) -> CostReport:
    """`pools`: {"prefill": [(target, gpus), ...], "decode": [...]} from the targets file."""
    if end <= start:
        raise ValueError(f"the window must end after it starts ({start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M})")
    sheet = price_sheet(q, sheet)
    pf, dc = pools.get("prefill", []), pools.get("decode", [])
    if not pf and not dc:
        raise ValueError("the targets file names no prefill or decode target: no pool to cost")
    tokens = pool_tokens(q, [n for n, _ in pf], [n for n, _ in dc], start, end)
    if tokens.empty:
        raise NoData(
            f"no token counters stored for the pools between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC"
        )
    pgpus, dgpus = sum(g for _, g in pf), sum(g for _, g in dc)
    prefill = _pool_cost(sheet, "prefill", pgpus, start, end, tokens["prompt"], tokens["prefill_seconds"], tokens["ts"])
    decode = _pool_cost(sheet, "decode", dgpus, start, end, tokens["generated"], tokens["decode_seconds"], tokens["ts"])
    users = allocate(user_tokens(q, start, end), prefill.cost_usd, decode.cost_usd)
    covered = tokens[["prefill_seconds", "decode_seconds"]].max(axis=1).fillna(0.0)
    first = (pd.to_datetime(tokens["ts"]) - pd.to_timedelta(covered, unit="s")).min().floor("us").to_pydatetime()
    last = pd.Timestamp(tokens["ts"].iloc[-1]).to_pydatetime()
    return CostReport(
        start,
        end,
        sheet,
        prefill,
        decode,
        float(tokens["prompt"].sum()),
        float(tokens["cached"].sum()),
        float(tokens["generated"].sum()),
        revenue(sheet, tokens),
        users,
        first,
        last,
    )


GPUS_IN_SERVICE_SQL = """
SELECT ts, sum(CASE WHEN up THEN g.gpus ELSE 0 END) AS gpus
FROM scrapes JOIN (SELECT unnest(?) AS target, unnest(?) AS gpus) g USING (target)
WHERE ts >= ? AND ts < ? GROUP BY ts
"""


def daily_statement(
    q: Query, pools: dict[str, list[tuple[str, int]]], start: datetime, end: datetime, sheet: PriceSheet | None = None
) -> pd.DataFrame:
    """One row per UTC day, in the form DeepSeek published for its inference service: GPUs in
    service (average and peak, from the scrapes that found them up), GPU-hours, cost, input tokens
    and their cache-hit share, output tokens, revenue at the token price sheet, margin."""
    sheet = price_sheet(q, sheet)
    members = [(n, g) for role in ("prefill", "decode") for n, g in pools.get(role, [])]
    rows: list[dict[str, Any]] = []
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    while day < end:
        a, b = max(day, start), min(day + timedelta(days=1), end)
        try:
            r = cost_report(q, pools, a, b, sheet)
        except NoData:
            rows.append({"day": day.date().isoformat(), "note": "no data"})
            day += timedelta(days=1)
            continue
        g = q(GPUS_IN_SERVICE_SQL, [[n for n, _ in members], [x for _, x in members], a, b])
        rev = r.revenue_usd
        rows.append(
            {
                "day": day.date().isoformat(),
                "gpus_avg": round(float(g.gpus.mean()), 2) if len(g) else None,
                "gpus_peak": int(g.gpus.max()) if len(g) else None,
                "gpu_hours": round(r.prefill.gpu_hours + r.decode.gpu_hours, 3),
                "cost_usd": _cents(r.cost_usd),
                "input_tokens": int(r.prompt_tokens),
                "cache_hit_share": round(r.cached_prompt_tokens / r.prompt_tokens, 4) if r.prompt_tokens else None,
                "output_tokens": int(r.generated_tokens),
                "usd_per_mtok_input": _usd(r.per_mtok(r.prefill.cost_usd, r.computed_prompt_tokens)),
                "usd_per_mtok_output": _usd(r.per_mtok(r.decode.cost_usd, r.generated_tokens)),
                "revenue_usd": _cents(rev) if rev is not None else None,
                "margin_usd": _cents(rev - r.cost_usd) if rev is not None else None,
                "margin_pct": round(100 * (rev - r.cost_usd) / rev, 2) if rev else None,
                "note": "",
            }
        )
        day += timedelta(days=1)
    return pd.DataFrame(rows)


def cost_over_time(
    tokens: pd.DataFrame, gpus: dict[str, int], sheet: PriceSheet, start: datetime, end: datetime, step: timedelta
) -> pd.DataFrame:
    """Per step: GPU-hours and cost of each pool, its tokens, and $/M input, output and blended
    (None where a pool counted no tokens: never a division by zero)."""
    rows = []
    t = start
    ts = pd.to_datetime(tokens["ts"]) if len(tokens) else pd.Series([], dtype="datetime64[ns]")
    while t < end:
        u = min(t + step, end)
        sel = tokens[(ts >= t) & (ts < u)] if len(tokens) else tokens
        pc = sheet.gpu_cost("prefill", gpus["prefill"], t, u)
        dc = sheet.gpu_cost("decode", gpus["decode"], t, u)
        prompt, cached, gen = (float(sel[c].sum()) if len(sel) else 0.0 for c in ("prompt", "cached", "generated"))
        hours = (u - t).total_seconds() / 3600
        rows.append(
            {
                "bucket": t,
                "prefill_gpu_hours": gpus["prefill"] * hours,
                "decode_gpu_hours": gpus["decode"] * hours,
                "prefill_cost_usd": pc,
                "decode_cost_usd": dc,
                "prompt_tokens": prompt,
                "cached_prompt_tokens": cached,
                "generated_tokens": gen,
                "observed": bool(len(sel)),
                "usd_per_mtok_input": pc / ((prompt - cached) / 1e6) if prompt - cached > 0 else None,
                "usd_per_mtok_output": dc / (gen / 1e6) if gen > 0 else None,
                "usd_per_mtok_blended": (pc + dc) / ((prompt + gen) / 1e6) if prompt + gen > 0 else None,
            }
        )
        t = u
    return pd.DataFrame(rows)


def with_gpu_price(sheet: PriceSheet, usd_per_gpu_hour: float) -> PriceSheet:
    """What-if: the same sheet with one GPU-hour price for every pool, all the time."""
    from .prices import GpuPrice

    return PriceSheet(
        f"{sheet.name} (what-if ${usd_per_gpu_hour:g}/GPU-hour)",
        (GpuPrice(datetime(1970, 1, 1), "*", usd_per_gpu_hour, "what-if on the Cost page"),),
        sheet.tokens,
    )
