"""FOCUS 1.2 cost and usage rows (docs/definitions.md, FOCUS export): what `moemeter report focus`
writes for a FinOps tool, from the same cost model as `report cost`.

Per charge period (the price sheet's GPU step: the hour unless a GPU price changes inside one) and
pool, the pool's reserved GPU time is three kinds of rows, busy, idle and unobserved (the scrape
intervals in which the engines' token counters moved, did not, and the time no interval covered;
docs/definitions.md, Cost bases), each at the GPU-hour price in force then; their BilledCost adds
up to `report cost`'s pool cost. By tenant or user, the busy rows are split by the "tokens" method
(share of computed prompt tokens in the prefill pool, of generated tokens in the decode pool, of the
requests that finished in its hour); on the allocation basis the idle and unobserved rows are
split the same way, each split its own row; on the usage basis they stay unallocated. Token rows
(cache hit, computed input, output) carry the tokens as ConsumedQuantity at no cost: the GPU rows
carry the cost. FOCUS 1.3's Allocated* columns are written as `x_Allocated*`
until the validator knows 1.3.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from moemeter.contract import POOLS, computed_tokens
from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import user_of_tenant

from .cost import METHOD, OBSERVED, NoData, Pools, check_basis, pool_tokens, price_sheet, user_tokens
from .prices import GpuPrice, PriceSheet
from .read import HOUR, Query, by_step, floor, steps

VERSION = "1.2"
BY = ("pool", "tenant", "user")
CURRENCY = "USD"
SERVICE_CATEGORY = "AI and Machine Learning"
SERVICE_SUBCATEGORY = "Generative AI"
SERVICE_NAME = "LLM inference (vLLM, prefill/decode disaggregated)"
PUBLISHER = "vLLM"
PROVIDER = "Self-hosted"
UNPRICED = "no price of the sheet in force"
"""The source of the $0 price a GPU row takes where the sheet has none yet (its first price starts
later): the GPU-hours stay on the rows, as `report cost` counts them."""
RESOURCE_TYPE = "GPU Pool"
GPU_UNIT = "GPU-Hours"
TOKEN_UNIT = "Tokens"
TOKEN_KINDS = {
    # SkuId: (pool, SkuMeter, what it counts)
    "tokens-input-cache-hit": ("prefill", "Input Tokens (Cache Hit)", "cached prompt tokens"),
    "tokens-input-computed": ("prefill", "Input Tokens (Computed)", "computed prompt tokens"),
    "tokens-output": ("decode", "Output Tokens", "generated tokens"),
}
METHOD_DETAILS = {
    "prefill": "share of the computed prompt tokens of the requests that finished in the charge period's hour",
    "decode": "share of the generated tokens of the requests that finished in the charge period's hour",
}

APPLICABILITY = (
    "USAGE_MEASUREMENT_SUPPORTED",  # ConsumedQuantity and ConsumedUnit: GPU-hours and tokens
    "UNIT_PRICING_SUPPORTED",  # ListUnitPrice and ContractedUnitPrice: the GPU-hour price in force
    "TAGGING_SUPPORTED",  # Tags: rack, pool, cost basis, tenant, user
    "RESOURCE_TYPE_ASSIGNMENT_SUPPORTED",  # ResourceType: "GPU Pool"
    "BILLING_BASED_ON_PROVISIONED_RESOURCES_SUPPORTED",  # ResourceId: a rack's pool
    "ACCOUNT_NAMING_SUPPORTED",  # BillingAccountName: the rack
    "PUBLIC_PRICE_LIST_SUPPORTED",  # ListUnitPrice: the price sheet, the rate every tenant is charged at
)
"""The FOCUS 1.2 applicability criteria the export meets (focus-validator's
--applicability-criteria); docs/definitions.md, FOCUS export, says why the others do not apply."""

COLUMNS = [
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
    "SkuPriceId",
    "Tags",
    "x_CostBasis",
    "x_Pool",
    "x_UsageKind",
    "x_AllocatedMethodId",
    "x_AllocatedMethodDetails",
    "x_AllocatedResourceId",
    "x_AllocatedResourceName",
    "x_AllocatedRatio",
    "x_AllocatedTags",
    "x_CacheSavings",
]
"""FOCUS 1.2's columns in moemeter's export, then its own (x_: the 1.3 allocation columns, the cost
basis, the pool, busy/idle/tokens and the cache savings of a cache-hit row)."""


class FocusError(MoemeterError, ValueError):
    """An export that cannot be written: the message says why; nothing is written."""


@dataclass(frozen=True)
class Export:
    rack: str
    basis: str
    by: str
    sheet: str
    provider: str = PROVIDER


def focus_rows(
    q: Query,
    pools: Pools,
    start: datetime,
    end: datetime,
    rack: str,
    sheet: PriceSheet | None = None,
    basis: str = "allocation",
    by: str = "tenant",
    provider: str = PROVIDER,
) -> pd.DataFrame:
    """The FOCUS rows of [start, end), in COLUMNS, ordered by charge period, pool, kind and the
    allocation. Raises NoData where the window holds no token counters (as `report cost`)."""
    if end <= start:
        raise FocusError(f"the window must end after it starts ({start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M})")
    if by not in BY:
        raise FocusError(f"unknown --by {by!r}: one of {', '.join(BY)}")
    check_basis(basis)
    check_provider(provider)
    sheet = price_sheet(q, sheet)
    if not any(pools.get(role) for role in POOLS):
        raise FocusError("the targets file names no prefill or decode target: no pool to cost")
    step = timedelta(seconds=sheet.step_seconds(tokens=False))
    tokens = pool_tokens(q, pools, start, end, step.total_seconds())
    if tokens.empty:
        raise NoData(
            f"no token counters stored for the pools between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC"
        )
    by_bucket = by_step(tokens)
    ex = Export(rack, basis, by, sheet.name, provider)
    rows: list[dict[str, Any]] = []
    hourly: dict[datetime, pd.DataFrame] = {}
    for t, a, b in steps(start, end, step):
        counted = by_bucket.get(t)
        shares = None
        if by != "pool":  # the hour's shares: a charge period shorter than an hour splits by its hour's
            hour = floor(a, HOUR)
            if hour not in hourly:
                span = (max(hour, start), min(hour + HOUR, end))
                hourly[hour] = _shares(q, *span, by)
                rows += _token_rows(ex, *span, None, hourly[hour])  # the hour's requests' tokens, once
            shares = hourly[hour]
        else:
            rows += _token_rows(ex, a, b, counted, None)
        for pool in POOLS:
            gpus = sum(g for _, g in pools.get(pool, []))
            observed = {
                k: float(getattr(counted, f"{pool}_{k}_gpu_seconds")) / 3600 if counted else 0.0 for k in OBSERVED
            }
            rows += _gpu_rows(ex, sheet, pool, gpus, a, b, observed, shares)
    return with_cache_savings(pd.DataFrame(rows, columns=COLUMNS))


def _shares(q: Query, a: datetime, b: datetime, by: str) -> pd.DataFrame:
    """Per tenant (or tenant and user): tokens of the requests that finished in [a, b) and each one's
    share of the prefill pool (computed prompt tokens) and of the decode pool (generated tokens)."""
    users = user_tokens(q, a, b)
    keys = ["tenant"] if by == "tenant" else ["tenant", "user"]
    cols = ["requests", "prompt_tokens", "cached_prompt_tokens", "generated_tokens"]
    g = users.groupby(keys, as_index=False)[cols].sum() if len(users) else users.reindex(columns=keys + cols)
    g["computed_prompt_tokens"] = computed_tokens(g["prompt_tokens"], g["cached_prompt_tokens"])
    for pool, col in (("prefill", "computed_prompt_tokens"), ("decode", "generated_tokens")):
        total = float(g[col].sum())
        g[f"{pool}_share"] = g[col] / total if total > 0 else 0.0
    return g.sort_values(keys).reset_index(drop=True)


def _gpu_rows(
    ex: Export,
    sheet: PriceSheet,
    pool: str,
    gpus: int,
    a: datetime,
    b: datetime,
    observed: dict[str, float],
    shares: pd.DataFrame | None,
) -> list[dict[str, Any]]:
    """The pool's busy, idle and unobserved GPU time in [a, b) (`observed`: its busy and idle
    GPU-hours) at the price in force then: a row each, or one per tenant (user) where allocated."""
    out = []
    segments = sheet.gpu_segments(pool, a, b) or [(a, b, GpuPrice(a, pool, 0.0, UNPRICED))]
    for s, e, price in segments:  # a step has one price, or none: the sheet's steps end where prices change
        hours = gpus * (e - s).total_seconds() / 3600
        busy, idle = (min(hours, observed[k] * (e - s) / (b - a)) for k in OBSERVED)
        quantities = {"busy": busy, "idle": min(idle, hours - busy), "unobserved": max(hours - busy - idle, 0.0)}
        for kind, qty in quantities.items():
            if qty <= 0:
                continue
            allocated = shares is not None and (kind == "busy" or ex.basis == "allocation")
            split = shares[shares[f"{pool}_share"] > 0] if allocated and shares is not None else None
            if split is None or split.empty:
                note = "" if not allocated else "; no request finished in its hour: not allocated"
                out.append(_gpu_row(ex, pool, s, e, price, kind, qty, None, note))
                continue
            for r in split.itertuples():
                out.append(_gpu_row(ex, pool, s, e, price, kind, qty * getattr(r, f"{pool}_share"), r, ""))
    return out


def _gpu_row(
    ex: Export, pool: str, s: datetime, e: datetime, price: GpuPrice, kind: str, qty: float, alloc: Any, note: str
) -> dict[str, Any]:
    cost = qty * price.usd_per_gpu_hour
    what = {
        "busy": "busy (token counters moved)",
        "idle": "idle (token counters did not move)",
        "unobserved": "unobserved (no scrape interval covered it)",
    }[kind]
    if price.source == UNPRICED:
        note += "; no price of the sheet in force: at $0"
    row = _common(ex, pool, s, e)
    row.update(
        {
            "BilledCost": cost,
            "ChargeDescription": f"GPU time of the {pool} pool, {what}{_to(alloc)}{note}",
            "ConsumedQuantity": qty,
            "ConsumedUnit": GPU_UNIT,
            "ContractedCost": cost,
            "EffectiveCost": cost,
            "ListCost": cost,
            "ListUnitPrice": price.usd_per_gpu_hour,
            "PricingCurrencyContractedUnitPrice": price.usd_per_gpu_hour,
            "PricingCurrencyEffectiveCost": cost,
            "PricingCurrencyListUnitPrice": price.usd_per_gpu_hour,
            "PricingQuantity": qty,
            "PricingUnit": GPU_UNIT,
            "SkuId": f"gpu-hour-{pool}",
            "SkuMeter": "GPU Time",
            "SkuPriceDetails": json.dumps({"x_PriceSheet": ex.sheet, "x_Effective": _iso(price.effective)}),
            "SkuPriceId": f"gpu-hour-{pool}@{'unpriced' if price.source == UNPRICED else _iso(price.effective)}",
            "x_UsageKind": kind,
        }
    )
    return _allocated(row, ex, pool, alloc)


def _token_rows(
    ex: Export, a: datetime, b: datetime, counted: Any, shares: pd.DataFrame | None
) -> list[dict[str, Any]]:
    """Tokens of [a, b) per kind: the pools' counters (by pool, per charge period), or the requests
    that finished in it (per tenant or user, [a, b) the hour), at no cost; a cache-hit row carries
    what its tokens would have cost computed (x_CacheSavings), on the export's basis."""
    out: list[dict[str, Any]] = []
    if shares is None:
        if counted is None:
            return out
        prompt, cached, gen = (float(getattr(counted, c)) for c in ("prompt", "cached", "generated"))
        lines = [
            (None, {"tokens-input-cache-hit": cached, "tokens-input-computed": prompt - cached, "tokens-output": gen})
        ]
    else:
        lines = [
            (
                r,
                {
                    "tokens-input-cache-hit": float(r.cached_prompt_tokens),
                    "tokens-input-computed": float(r.computed_prompt_tokens),
                    "tokens-output": float(r.generated_tokens),
                },
            )
            for r in shares.itertuples()
        ]
    for alloc, kinds in lines:
        for sku, qty in kinds.items():
            if qty <= 0:
                continue
            pool, meter, what = TOKEN_KINDS[sku]
            row = _common(ex, pool, a, b)
            row.update(
                {
                    "BilledCost": 0.0,
                    "ChargeDescription": f"{what[0].upper()}{what[1:]} of the {pool} pool{_to(alloc)}; "
                    "their cost is on the GPU rows",
                    "ConsumedQuantity": qty,
                    "ConsumedUnit": TOKEN_UNIT,
                    "ContractedCost": 0.0,
                    "EffectiveCost": 0.0,
                    "ListCost": 0.0,
                    "ListUnitPrice": 0.0,
                    "PricingCurrencyContractedUnitPrice": 0.0,
                    "PricingCurrencyEffectiveCost": 0.0,
                    "PricingCurrencyListUnitPrice": 0.0,
                    "PricingQuantity": qty,
                    "PricingUnit": TOKEN_UNIT,
                    "SkuId": sku,
                    "SkuMeter": meter,
                    "SkuPriceDetails": json.dumps({"x_CostOn": f"gpu-hour-{pool}"}),
                    "SkuPriceId": f"{sku}@gpu-time",
                    "x_UsageKind": "tokens",
                }
            )
            out.append(_allocated(row, ex, pool, alloc))
    return out


def with_cache_savings(rows: pd.DataFrame) -> pd.DataFrame:
    """x_CacheSavings on every cache-hit row: its tokens at the $/M computed input of its hour (and
    tenant or user): what the prefill pool charged it on the basis in the hour, over its computed
    prompt tokens."""
    if rows.empty:
        return rows
    key = ["hour", "x_AllocatedResourceId"]  # a tenant's token rows span the hour, its GPU rows its periods
    rows = rows.assign(hour=rows["ChargePeriodStart"].str[:13])
    prefill = rows[(rows["x_Pool"] == "prefill")].fillna({"x_AllocatedResourceId": ""})
    gpu = prefill["x_UsageKind"] != "tokens"
    if (rows["x_CostBasis"] == "usage").any():  # the usage basis charges busy time only
        gpu = prefill["x_UsageKind"] == "busy"
    charged = prefill[gpu].groupby(key)["BilledCost"].sum()
    computed = prefill[prefill["SkuId"] == "tokens-input-computed"].groupby(key)["ConsumedQuantity"].sum()
    hits = rows["SkuId"] == "tokens-input-cache-hit"
    ids = rows.loc[hits, key].fillna({"x_AllocatedResourceId": ""})
    rate = [
        (charged.get(k, 0.0) / computed[k]) if computed.get(k, 0.0) > 0 else 0.0
        for k in zip(ids["hour"], ids["x_AllocatedResourceId"])
    ]
    out = rows.drop(columns="hour")
    out.loc[hits, "x_CacheSavings"] = out.loc[hits, "ConsumedQuantity"].to_numpy() * rate
    return out


def _common(ex: Export, pool: str, a: datetime, b: datetime) -> dict[str, Any]:
    month = a.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (month + timedelta(days=32)).replace(day=1)
    return {
        "BillingAccountId": ex.rack,
        "BillingAccountName": ex.rack,
        "BillingCurrency": CURRENCY,
        "BillingPeriodEnd": _iso(nxt),
        "BillingPeriodStart": _iso(month),
        "ChargeCategory": "Usage",
        "ChargeClass": None,
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodEnd": _iso(b),
        "ChargePeriodStart": _iso(a),
        "InvoiceId": f"{ex.rack}-{month:%Y-%m}",
        "InvoiceIssuerName": ex.provider,
        "ProviderName": ex.provider,
        "PublisherName": PUBLISHER,
        "ResourceId": f"{ex.rack}/{pool}",
        "ResourceName": f"{pool} pool of {ex.rack}",
        "ResourceType": RESOURCE_TYPE,
        "ServiceCategory": SERVICE_CATEGORY,
        "ServiceName": SERVICE_NAME,
        "ServiceSubcategory": SERVICE_SUBCATEGORY,
        "Tags": json.dumps({"x_rack": ex.rack, "x_pool": pool, "x_cost_basis": ex.basis}),
        "x_CostBasis": ex.basis,
        "x_Pool": pool,
        "x_CacheSavings": None,
    }


def _allocated(row: dict[str, Any], ex: Export, pool: str, alloc: Any) -> dict[str, Any]:
    """The x_Allocated* columns (FOCUS 1.3's split cost allocation) of a row split to a tenant or user."""
    if alloc is None:
        row.update({c: None for c in COLUMNS if c.startswith("x_Allocated")})
        return row
    tags = {"tenant": alloc.tenant} if ex.by == "tenant" else {"tenant": alloc.tenant, "user": alloc.user}
    ident = allocation_id(alloc.tenant) if ex.by == "tenant" else allocation_id(alloc.tenant, alloc.user)
    row.update(
        {
            "x_AllocatedMethodId": METHOD,
            "x_AllocatedMethodDetails": json.dumps({"pool": pool, "share": METHOD_DETAILS[pool], "basis": ex.basis}),
            "x_AllocatedResourceId": inert(ident),
            "x_AllocatedResourceName": inert(
                user_of_tenant(alloc.user, alloc.tenant) if ex.by == "user" else alloc.tenant
            ),
            "x_AllocatedRatio": float(getattr(alloc, f"{pool}_share")),
            "x_AllocatedTags": json.dumps(tags),
        }
    )
    row["Tags"] = json.dumps({**json.loads(row["Tags"]), **{f"x_{k}": v for k, v in tags.items()}})
    return row


def _to(alloc: Any) -> str:
    """Names stay out of the description (x_AllocatedResourceId carries them): FOCUS strings are ASCII
    (focus-validator's StringHandling), a user's name need not be."""
    return "" if alloc is None else f", allocated by {METHOD} to a {'user' if hasattr(alloc, 'user') else 'tenant'}"


def inert(text: str) -> str:
    """A cell a spreadsheet shows as text: a name from a request that starts like a formula (=, +,
    -, @, a tab or a carriage return) gets a leading apostrophe, as OWASP advises for CSV files."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def allocation_id(tenant: str, user: str | None = None) -> str:
    """x_AllocatedResourceId: the tenant, or tenant/user, each percent-encoded so that no two differ
    only by where a '/' falls (tenant "a/b" with user "c" against tenant "a" with user "b/c")."""
    from urllib.parse import quote

    return quote(tenant, safe="") if user is None else f"{quote(tenant, safe='')}/{quote(user, safe='')}"


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def check_provider(name: str) -> str:
    """ProviderName and InvoiceIssuerName: printable ASCII (FOCUS strings), not empty, and no cell a
    spreadsheet would run as a formula."""
    if not name or not all(" " <= c <= "~" for c in name) or name[0] in "=+-@" or len(name) > 200:
        raise FocusError(f"--provider {name!r}: use 1-200 printable ASCII characters, not starting with =, +, - or @")
    return name


def check_out(path: str) -> str:
    """A .csv or .parquet file in a directory that exists: checked before anything is read."""
    import os

    if not path.endswith((".csv", ".parquet")):
        raise FocusError(f"--out {path!r}: name a .csv or a .parquet file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FocusError(f"--out {path!r}: {parent} is not a directory")
    if os.path.isdir(path):
        raise FocusError(f"--out {path!r} is a directory")
    return path


def write(rows: pd.DataFrame, path: str) -> None:
    """CSV or Parquet by the file's suffix, whole or not at all: written beside the path, then
    renamed over it (a file already there is replaced only by a complete export)."""
    import os
    import tempfile

    path = os.path.realpath(check_out(path))  # through a link, to the file it names
    mask = os.umask(0)
    os.umask(mask)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".focus-", suffix=os.path.splitext(path)[1], dir=os.path.dirname(path))
    except OSError as exc:
        raise FocusError(f"--out {path}: cannot write there: {exc.strerror}") from exc
    os.close(fd)
    try:
        if path.endswith(".parquet"):
            rows.to_parquet(tmp, index=False)
        else:
            rows.to_csv(tmp, index=False)
        os.chmod(tmp, 0o666 & ~mask)  # as a file opened for writing would be, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException as exc:
        os.unlink(tmp)
        if isinstance(exc, OSError):
            raise FocusError(f"--out {path}: the export was not written: {exc.strerror or exc}") from exc
        raise
