"""The cost model (docs/definitions.md): GPU-hours and cost per pool at a price sheet,
$/M input, output and blended tokens, idle cost, revenue at token prices, per-user allocation.

Token counts and idle seconds are counter increases (Prometheus increase() rules, applied at
ingest) read through warehouse/read.py: each interval counts by the share of it inside the window,
whichever tables serve it, so windows that split a day add up to the day, to the token and the
cent. Revenue and idle cost are summed per step of the price sheet (`PriceSheet.step_seconds`),
inside which every price is constant. Queries go through a `Query` callable (a DuckDB cursor or
the query API), so the CLI and the Cost page share them.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from moemeter.contract import POOLS, computed_tokens
from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import user_of_tenant

from .prices import PriceSheet, default_sheet, stored_sheet
from .read import HOUR, Query, by_step, floor, increases, request_window, run, steps, timestamp

METHOD = "tokens"  # per-user allocation: share of computed prompt tokens (prefill), of generated tokens (decode)
BASES = ("allocation", "usage")
"""Cost bases (docs/definitions.md, Cost bases): "allocation" charges every reserved GPU-hour to
the tokens and users that ran; "usage" charges them only the busy GPU-hours (scrape intervals in
which the engines' token counters moved) and leaves idle and unobserved time lines of their own.
The bill (a pool's cost) is the same on both."""
OBSERVED = ("busy", "idle")
"""The GPU time the engines' token counters observed, per scrape interval: it moved, or it did not
(docs/definitions.md, Cost bases); the rest of a pool's reserved time is unobserved."""
Pools = dict[str, list[tuple[str, int]]]
"""{"prefill": [(target, gpus), ...], "decode": [...]}: the targets of each pool and their GPUs."""


class NoData(MoemeterError, LookupError):
    """The window holds no token counters for the pools: say so, never print zeros."""


def pool_tokens(q: Query, pools: Pools, start: datetime, end: datetime, step_seconds: float | None) -> pd.DataFrame:
    """Per step of the window (epoch-aligned; None: the whole window in one row), through the read
    layer: prefill-pool prompt and cached prompt tokens, decode-pool generated tokens, and each pool's
    idle GPU-seconds. No row for a step that no counter interval reaches."""
    members = [(n, role, g) for role in POOLS for n, g in pools.get(role, [])]
    params = {
        "targets": [n for n, _, _ in members],
        "roles": [r for _, r, _ in members],
        "gpus": [float(g) for _, _, g in members],
    }
    # the rows a rack's copy in the lake holds too, so that the two give the same report to the bit
    return increases(q, "pool_tokens", start, end, step_seconds, params, sixes=False)


def stored_pools(q: Query, start: datetime, end: datetime) -> Pools:
    """The pools of the prefill and decode targets the warehouse saw in the window (role and GPUs,
    as the targets file gave them)."""
    df = run(q, "pools_in", {"start": start, "end": end})
    return {role: [(r.name, int(r.gpus)) for r in df[df.role == role].itertuples()] for role in POOLS}


def price_sheet(q: Query, override: PriceSheet | None = None) -> PriceSheet:
    """The sheet given, else every version stored in the warehouse, else the default sheet."""
    if override is not None:
        return override
    stored = stored_sheet(
        list(run(q, "prices_stored_gpu").itertuples(index=False)),
        list(run(q, "prices_stored_tokens").itertuples(index=False)),
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
    busy_gpu_hours: float = 0.0
    busy_cost_usd: float = 0.0

    @property
    def unobserved_gpu_hours(self) -> float:
        """Reserved GPU-hours no scrape interval covered: neither busy nor idle."""
        return max(self.gpu_hours - self.busy_gpu_hours - self.idle_gpu_hours, 0.0)

    def charged(self, basis: str) -> float:
        """What the pool's tokens and users are charged on `basis`: the whole cost, or its busy part."""
        return self.cost_usd if basis == "allocation" else self.busy_cost_usd


def check_basis(basis: str) -> str:
    if basis not in BASES:
        raise ValueError(f"unknown cost basis {basis!r}: one of {', '.join(BASES)}")
    return basis


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
    tokens: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The window's `pool_tokens` in the sheet's steps (`step_seconds`), the rows it was costed from."""
    step_seconds: int = 3600  # of `tokens`' steps
    basis: str = "allocation"

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600

    @property
    def computed_prompt_tokens(self) -> float:
        return computed_tokens(self.prompt_tokens, self.cached_prompt_tokens)

    @property
    def cost_usd(self) -> float:
        return self.prefill.cost_usd + self.decode.cost_usd

    @property
    def charged_usd(self) -> float:
        """What the tokens and users are charged on the report's basis."""
        return self.prefill.charged(self.basis) + self.decode.charged(self.basis)

    @property
    def cache_savings_usd(self) -> float:
        """What the cached prompt tokens would have cost computed: at the $/M input of the basis."""
        computed = self.computed_prompt_tokens
        return self.cached_prompt_tokens * self.prefill.charged(self.basis) / computed if computed > 0 else 0.0

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
            "basis": self.basis,
            "price_sheet": {"name": self.sheet.name, "gpu_price_sources": gpu_sources},
            "pools": {
                "prefill": {
                    "gpus": self.prefill.gpus,
                    "gpu_hours": round(self.prefill.gpu_hours, 6),
                    "cost_usd": _cents(self.prefill.cost_usd),
                    "prompt_tokens": _count(self.prompt_tokens),
                    "cached_prompt_tokens": _count(self.cached_prompt_tokens),
                    "computed_prompt_tokens": _count(self.computed_prompt_tokens),
                    "usd_per_mtok_input": _usd(
                        self.per_mtok(self.prefill.charged(self.basis), self.computed_prompt_tokens)
                    ),
                    "busy_gpu_hours": round(self.prefill.busy_gpu_hours, 6),
                    "unobserved_gpu_hours": round(self.prefill.unobserved_gpu_hours, 6),
                    "idle_gpu_hours": round(self.prefill.idle_gpu_hours, 6),
                    "idle_cost_usd": _cents(self.prefill.idle_cost_usd),
                    "charged_usd": _cents(self.prefill.charged(self.basis)),
                    "cache_savings_usd": _cents(self.cache_savings_usd),
                    "tokens_per_second_per_gpu": round(self.prefill.tokens_per_second_per_gpu, 3),
                },
                "decode": {
                    "gpus": self.decode.gpus,
                    "gpu_hours": round(self.decode.gpu_hours, 6),
                    "cost_usd": _cents(self.decode.cost_usd),
                    "generated_tokens": _count(self.generated_tokens),
                    "usd_per_mtok_output": _usd(self.per_mtok(self.decode.charged(self.basis), self.generated_tokens)),
                    "busy_gpu_hours": round(self.decode.busy_gpu_hours, 6),
                    "unobserved_gpu_hours": round(self.decode.unobserved_gpu_hours, 6),
                    "idle_gpu_hours": round(self.decode.idle_gpu_hours, 6),
                    "idle_cost_usd": _cents(self.decode.idle_cost_usd),
                    "charged_usd": _cents(self.decode.charged(self.basis)),
                    "tokens_per_second_per_gpu": round(self.decode.tokens_per_second_per_gpu, 3),
                },
            },
            "total": {
                "cost_usd": _cents(self.cost_usd),
                "tokens": _count(self.prompt_tokens + self.generated_tokens),
                "usd_per_mtok_blended": _usd(
                    self.per_mtok(self.charged_usd, self.prompt_tokens + self.generated_tokens)
                ),
                "charged_usd": _cents(self.charged_usd),
                "uncharged_usd": _cents(self.cost_usd - self.charged_usd),
                "cache_savings_usd": _cents(self.cache_savings_usd),
                "revenue_usd": _cents(self.revenue_usd) if self.revenue_usd is not None else None,
                "margin_usd": _cents(self.revenue_usd - self.cost_usd) if self.revenue_usd is not None else None,
            },
            "users": [
                {
                    "tenant": r["tenant"],
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

    def as_csv(self) -> str:
        """`moemeter report cost --csv`: a row per pool, the total, and a row per user (its tenant last)."""
        data, out = self.as_json(), io.StringIO()
        w = csv.writer(out)
        w.writerow(
            [
                "kind",
                "name",
                "gpus",
                "gpu_hours",
                "cost_usd",
                "prompt_tokens",
                "cached_prompt_tokens",
                "generated_tokens",
                "usd_per_mtok",
                "tenant",
            ]
        )
        pf, dc, tot = data["pools"]["prefill"], data["pools"]["decode"], data["total"]
        w.writerow(
            [
                "pool",
                "prefill",
                pf["gpus"],
                pf["gpu_hours"],
                pf["cost_usd"],
                pf["prompt_tokens"],
                pf["cached_prompt_tokens"],
                "",
                pf["usd_per_mtok_input"],
            ]
        )
        w.writerow(
            [
                "pool",
                "decode",
                dc["gpus"],
                dc["gpu_hours"],
                dc["cost_usd"],
                "",
                "",
                dc["generated_tokens"],
                dc["usd_per_mtok_output"],
            ]
        )
        w.writerow(
            [
                "total",
                "",
                pf["gpus"] + dc["gpus"],
                round(pf["gpu_hours"] + dc["gpu_hours"], 6),
                tot["cost_usd"],
                pf["prompt_tokens"],
                pf["cached_prompt_tokens"],
                dc["generated_tokens"],
                tot["usd_per_mtok_blended"],
            ]
        )
        for u in data["users"]:
            w.writerow(
                [
                    "user",
                    u["user"],
                    "",
                    "",
                    u["cost_usd"],
                    u["prompt_tokens"],
                    u["cached_prompt_tokens"],
                    u["generated_tokens"],
                    "",
                    u["tenant"],
                ]
            )
        return out.getvalue()

    def as_text(self) -> str:
        """`moemeter report cost`: the window, each pool, the total, the top 20 users."""
        d = self.as_json()

        def usd(v: float | None, per: str = "") -> str:
            return "n/a (no tokens)" if v is None else f"${v:,.{4 if per else 2}f}{per}"

        w, pf, dc, t = d["window"], d["pools"]["prefill"], d["pools"]["decode"], d["total"]
        lines = [
            f"{w['from']} .. {w['to']} ({w['hours']:g} h; tokens counted {w['first_count']} .. {w['last_count']}); price sheet "
            f"{d['price_sheet']['name']}; per-user method: {d['method']}; cost basis: {d['basis']}",
            f"prefill  {pf['gpus']:>4} GPUs {pf['gpu_hours']:>10,.2f} GPU-h {usd(pf['cost_usd']):>14}  "
            f"{pf['computed_prompt_tokens']:>15,} computed + {pf['cached_prompt_tokens']:,} cached prompt tokens  "
            f"{usd(pf['usd_per_mtok_input'], '/M input')}  idle {usd(pf['idle_cost_usd'])}  "
            f"cache savings {usd(pf['cache_savings_usd'])}",
            f"decode   {dc['gpus']:>4} GPUs {dc['gpu_hours']:>10,.2f} GPU-h {usd(dc['cost_usd']):>14}  "
            f"{dc['generated_tokens']:>15,} generated tokens  {usd(dc['usd_per_mtok_output'], '/M output')}  "
            f"idle {usd(dc['idle_cost_usd'])}",
            f"total    {usd(t['cost_usd'])}  {t['tokens']:,} tokens  {usd(t['usd_per_mtok_blended'], '/M blended')}"
            + (
                f"  revenue {usd(t['revenue_usd'])}  margin {usd(t['margin_usd'])}"
                if t["revenue_usd"] is not None
                else ""
            ),
        ]
        if d["basis"] == "usage":
            lines.append(
                f"usage basis: {usd(t['charged_usd'])} of busy GPU time charged to tokens and users, "
                f"{usd(t['uncharged_usd'])} of idle and unobserved GPU time to nobody"
            )
        if d["users"]:
            lines.append("users (top 20 by cost; each user of its tenant):")
            lines += [
                f"  {user_of_tenant(u['user'], u['tenant']):<44} {usd(u['cost_usd']):>12}  {u['prompt_tokens']:>12,} prompt  "
                f"{u['generated_tokens']:>10,} generated"
                for u in d["users"][:20]
            ]
        return "\n".join(lines)


def _iso(t: datetime | None) -> str | None:
    return t.isoformat() + "Z" if t is not None else None


def _count(v: float) -> int:
    """A token count to the token: a window's share of an interval it cuts is a fraction of one."""
    return int(round(v))


def _cents(v: float) -> float:
    return round(v, 2) + 0.0


def _usd(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) else round(v, 6)


def _pool_cost(
    sheet: PriceSheet, pool: str, gpus: int, start: datetime, end: datetime, tokens: pd.DataFrame, step: timedelta
) -> PoolCost:
    """Reserved GPU-hours and cost over the whole window; idle and busy GPU-hours and their cost
    summed per step of the sheet, at the price in effect in that step."""
    hours = dict.fromkeys(OBSERVED, 0.0)
    costs = dict.fromkeys(OBSERVED, 0.0)
    stepped = by_step(tokens)
    for t, a, b in steps(start, end, step):
        if (r := stepped.get(t)) is None:
            continue
        price = sheet.gpu_cost(pool, 1, a, b) / ((b - a) / HOUR)
        for kind in hours:
            seconds = float(getattr(r, f"{pool}_{kind}_gpu_seconds"))
            hours[kind] += seconds / 3600
            costs[kind] += seconds / 3600 * price
    window = (end - start).total_seconds()
    counted = float(tokens["prompt" if pool == "prefill" else "generated"].sum())
    tps = counted / (window * gpus) if gpus and window else 0.0
    cost = sheet.gpu_cost(pool, gpus, start, end)
    return PoolCost(gpus, gpus * window / 3600, cost, hours["idle"], costs["idle"], tps, hours["busy"], costs["busy"])


def revenue(sheet: PriceSheet, tokens: pd.DataFrame, start: datetime) -> float | None:
    """Tokens valued at the token price in effect in the step that counted them (peak or off-peak)."""
    if not sheet.tokens:
        return None
    total = 0.0
    for r in tokens.itertuples():
        t = max(pd.Timestamp(r.bucket).to_pydatetime(), start)
        price = sheet.token_price_at(t)
        if price is None:
            continue
        hit, miss, out = price.prices_at(t.time())
        total += (r.cached * hit + (r.prompt - r.cached) * miss + r.generated * out) / 1e6
    return total


def user_tokens(q: Query, start: datetime, end: datetime) -> pd.DataFrame:
    """Per user (tenant and user: a user is named within its tenant): requests, prompt, cached prompt and generated tokens of the requests that finished
    in the window (its whole hours from the hourly sums, the edges from the records)."""
    return run(q, "cost_users", {"start": start, "end": end, **request_window(start, end)})


def allocate(users: pd.DataFrame, prefill_cost: float, decode_cost: float) -> pd.DataFrame:
    """Method "tokens": a user's share of prefill cost is their share of computed prompt tokens
    (prompt - cached), of decode cost their share of generated tokens."""
    if users.empty:
        return users.assign(computed_prompt_tokens=[], cost_usd=[])
    u = users.copy()
    u["computed_prompt_tokens"] = computed_tokens(u["prompt_tokens"], u["cached_prompt_tokens"])
    comp, gen = u["computed_prompt_tokens"].sum(), u["generated_tokens"].sum()
    u["cost_usd"] = ((u["computed_prompt_tokens"] / comp * prefill_cost) if comp else 0.0) + (
        (u["generated_tokens"] / gen * decode_cost) if gen else 0.0
    )
    keys = [k for k in ("tenant", "user") if k in u]
    return u.sort_values(["cost_usd", *keys], ascending=[False, *[True] * len(keys)]).reset_index(drop=True)


def cost_report(
    q: Query,
    pools: Pools,
    start: datetime,
    end: datetime,
    sheet: PriceSheet | None = None,
    revenue_too: bool = True,
    basis: str = "allocation",
    users_too: bool = True,
) -> CostReport:
    """`pools`: {"prefill": [(target, gpus), ...], "decode": [...]} from the targets file.
    `revenue_too=False`: no revenue (None), and tokens counted in the GPU prices' steps only (a
    sheet's off-peak half hours would otherwise read a week of minute rows for a week's cost).
    `users_too=False`: no per-user allocation (`users` empty), for a caller that wants the pools' cost."""
    if end <= start:
        raise ValueError(f"the window must end after it starts ({start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M})")
    check_basis(basis)
    sheet = price_sheet(q, sheet)
    _check_pools(pools)
    step = sheet.step_seconds(tokens=revenue_too)
    tokens = pool_tokens(q, pools, start, end, step)
    return _costed(q, pools, start, end, sheet, step, tokens, revenue_too, basis, users_too)


def _check_pools(pools: Pools) -> list[tuple[str, int]]:
    """The pools' targets and GPUs; an error when there is none to cost."""
    members = [m for role in POOLS for m in pools.get(role, [])]
    if not members:
        raise ValueError("the targets file names no prefill or decode target: no pool to cost")
    return members


def _costed(
    q: Query,
    pools: Pools,
    start: datetime,
    end: datetime,
    sheet: PriceSheet,
    step: int,
    tokens: pd.DataFrame,
    revenue_too: bool = True,
    basis: str = "allocation",
    users_too: bool = True,
) -> CostReport:
    """The report of [start, end) from its `pool_tokens` in steps of `step` seconds (the sheet's);
    `users_too=False`: `users` empty, the request hours not read (a daily statement's row and the
    SLO report's cost show no per-user split)."""
    pf, dc = pools.get("prefill", []), pools.get("decode", [])
    if tokens.empty:
        raise NoData(
            f"no token counters stored for the pools between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC"
        )
    width = timedelta(seconds=step)
    prefill = _pool_cost(sheet, "prefill", sum(g for _, g in pf), start, end, tokens, width)
    decode = _pool_cost(sheet, "decode", sum(g for _, g in dc), start, end, tokens, width)
    held = user_tokens(q, start, end) if users_too else pd.DataFrame()
    users = allocate(held, prefill.charged(basis), decode.charged(basis))
    seen = run(q, "counted", {"start": start, "end": end, "targets": [n for n, _ in pf + dc]})
    first, last = (timestamp(seen[c].iloc[0]) if len(seen) else None for c in ("first_count", "last_count"))
    return CostReport(
        start,
        end,
        sheet,
        prefill,
        decode,
        float(tokens["prompt"].sum()),
        float(tokens["cached"].sum()),
        float(tokens["generated"].sum()),
        revenue(sheet, tokens, start) if revenue_too else None,
        users,
        first,
        last,
        tokens,
        step,
        basis,
    )


def rebucket(tokens: pd.DataFrame, step: timedelta) -> pd.DataFrame:
    """`pool_tokens` rows summed into the epoch-aligned steps of `step`, a multiple of theirs: what
    `pool_tokens` gives in steps of `step` over the same window (each of its steps holds whole steps
    of theirs, the first and last cut at the same edges), without reading the counters again."""
    if tokens.empty:
        return tokens
    steps = pd.to_datetime(tokens["bucket"]).dt.floor(step)
    return tokens.drop(columns="bucket").groupby(steps.rename("bucket")).sum().reset_index()


def daily_statement(
    q: Query,
    pools: dict[str, list[tuple[str, int]]],
    start: datetime,
    end: datetime,
    sheet: PriceSheet | None = None,
    basis: str = "allocation",
) -> pd.DataFrame:
    """One row per UTC day, in the form DeepSeek published for its inference service: GPUs in
    service (average and peak, from the scrapes that found them up), GPU-hours, cost, input tokens
    and their cache-hit share, output tokens, $/M on the cost `basis`, idle cost, cache savings,
    revenue at the token price sheet, margin."""
    check_basis(basis)
    sheet = price_sheet(q, sheet)
    members = _check_pools(pools)
    # every day's tokens in one read: the sheet's steps divide an hour, so none straddles midnight,
    # and a day's steps are those a read of that day alone gives
    step = sheet.step_seconds()
    rows: list[dict[str, Any]] = []
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    if day >= end:
        return pd.DataFrame(rows)
    tokens = pool_tokens(q, pools, start, end, step)
    targets, gpus = [n for n, _ in members], [x for _, x in members]
    in_service = run(q, "cost_gpus_in_service", {"targets": targets, "gpus": gpus, "start": start, "end": end})
    while day < end:
        a, b = max(day, start), min(day + timedelta(days=1), end)
        mine = tokens[(tokens["bucket"] >= floor(a, timedelta(seconds=step))) & (tokens["bucket"] < b)]
        try:
            r = _costed(q, pools, a, b, sheet, step, mine.reset_index(drop=True), basis=basis, users_too=False)
        except NoData:
            rows.append({"day": day.date().isoformat(), "note": "no data"})
            day += timedelta(days=1)
            continue
        g = in_service[(in_service["ts"] >= a) & (in_service["ts"] < b)]
        rev = r.revenue_usd
        rows.append(
            {
                "day": day.date().isoformat(),
                "gpus_avg": round(float(g.gpus.mean()), 2) if len(g) else None,
                "gpus_peak": int(g.gpus.max()) if len(g) else None,
                "gpu_hours": round(r.prefill.gpu_hours + r.decode.gpu_hours, 3),
                "cost_usd": _cents(r.cost_usd),
                "input_tokens": _count(r.prompt_tokens),
                "cache_hit_share": round(r.cached_prompt_tokens / r.prompt_tokens, 4) if r.prompt_tokens else None,
                "output_tokens": _count(r.generated_tokens),
                "usd_per_mtok_input": _usd(r.per_mtok(r.prefill.charged(basis), r.computed_prompt_tokens)),
                "usd_per_mtok_output": _usd(r.per_mtok(r.decode.charged(basis), r.generated_tokens)),
                "idle_cost_usd": _cents(r.prefill.idle_cost_usd + r.decode.idle_cost_usd),
                "cache_savings_usd": _cents(r.cache_savings_usd),
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
    """Per step (epoch-aligned, as `pool_tokens` gave them, the first and last cut to the window):
    GPU-hours and cost of each pool, its tokens, and $/M input, output and blended (None where a
    pool counted no tokens: never a division by zero)."""
    by_bucket = by_step(tokens)
    rows = []
    for t, a, u in steps(start, end, step):
        r = by_bucket.get(t)
        prompt, cached, gen = (
            float(getattr(r, c)) if r is not None else 0.0 for c in ("prompt", "cached", "generated")
        )
        pc = sheet.gpu_cost("prefill", gpus["prefill"], a, u)
        dc = sheet.gpu_cost("decode", gpus["decode"], a, u)
        hours = (u - a).total_seconds() / 3600
        rows.append(
            {
                "bucket": a,
                "prefill_gpu_hours": gpus["prefill"] * hours,
                "decode_gpu_hours": gpus["decode"] * hours,
                "prefill_cost_usd": pc,
                "decode_cost_usd": dc,
                "prompt_tokens": prompt,
                "cached_prompt_tokens": cached,
                "generated_tokens": gen,
                "observed": r is not None,
                "usd_per_mtok_input": pc / ((prompt - cached) / 1e6) if prompt - cached > 0 else None,
                "usd_per_mtok_output": dc / (gen / 1e6) if gen > 0 else None,
                "usd_per_mtok_blended": (pc + dc) / ((prompt + gen) / 1e6) if prompt + gen > 0 else None,
            }
        )
    return pd.DataFrame(rows)


def with_gpu_price(sheet: PriceSheet, usd_per_gpu_hour: float) -> PriceSheet:
    """What-if: the same sheet with one GPU-hour price for every pool, all the time."""
    from .prices import GpuPrice

    return PriceSheet(
        f"{sheet.name} (what-if ${usd_per_gpu_hour:g}/GPU-hour)",
        (GpuPrice(datetime(1970, 1, 1), "*", usd_per_gpu_hour, "what-if on the Cost page"),),
        sheet.tokens,
    )
