"""Price sheets: GPU $/hour per pool and token prices for revenue, versioned by effective time.

A sheet is a TOML file (warehouse/price_sheets/default.toml is the default, with its source cited).
Loading one into the warehouse only adds versions: an entry whose (pool, effective) is already
stored with another price is refused, so past reports never change. Every mistake is refused
with the line of the entry it is in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time
from importlib import resources
from math import gcd
from pathlib import Path
from typing import Any

import duckdb

from moemeter.contract.errors import MoemeterError
from warehouse.sheets import entry_at, known, lines, load_toml, read_sheet, when

from .sql import sql

POOLS = ("prefill", "decode", "*")
TOKEN_PRICES = ("usd_per_mtok_input_cache_hit", "usd_per_mtok_input_cache_miss", "usd_per_mtok_output")
_WINDOW = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)-([01]\d|2[0-3]):([0-5]\d)$")


class PriceSheetError(MoemeterError, ValueError):
    """A price sheet that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class GpuPrice:
    effective: datetime  # UTC, naive
    pool: str
    usd_per_gpu_hour: float
    source: str


@dataclass(frozen=True)
class TokenPrice:
    effective: datetime
    usd_per_mtok_input_cache_hit: float
    usd_per_mtok_input_cache_miss: float
    usd_per_mtok_output: float
    off_peak_utc: str | None = None  # "HH:MM-HH:MM" (UTC), may wrap midnight
    off_peak: tuple[float, float, float] | None = None  # hit, miss, output during off-peak hours
    source: str = ""

    def off_peak_at(self, t: time) -> bool:
        if not self.off_peak_utc:
            return False
        a, b = (time.fromisoformat(x) for x in self.off_peak_utc.split("-"))
        return a <= t < b if a <= b else (t >= a or t < b)

    def prices_at(self, t: time) -> tuple[float, float, float]:
        """(cache hit, cache miss, output) in USD per million tokens at time of day `t` (UTC)."""
        if self.off_peak is not None and self.off_peak_at(t):
            return self.off_peak
        return self.usd_per_mtok_input_cache_hit, self.usd_per_mtok_input_cache_miss, self.usd_per_mtok_output


@dataclass(frozen=True)
class PriceSheet:
    name: str
    gpu: tuple[GpuPrice, ...]
    tokens: tuple[TokenPrice, ...]

    def gpu_segments(self, pool: str, start: datetime, end: datetime) -> list[tuple[datetime, datetime, GpuPrice]]:
        """The prices in effect for `pool` over [start, end), as (from, to, price) pieces. A pool's own
        entries win over `*` entries of the same or an earlier effective time."""
        entries = sorted((p for p in self.gpu if p.pool in (pool, "*")), key=lambda p: (p.effective, p.pool == pool))
        out = []
        for i, p in enumerate(entries):
            nxt = entries[i + 1].effective if i + 1 < len(entries) else end
            a, b = max(p.effective, start), min(nxt, end)
            if a < b:
                out.append((a, b, p))
        return out

    def gpu_cost(self, pool: str, gpus: int, start: datetime, end: datetime) -> float:
        """USD for `gpus` GPUs of `pool` over [start, end), each piece at the price in effect then."""
        return sum(
            gpus * (b - a).total_seconds() / 3600 * p.usd_per_gpu_hour
            for a, b, p in self.gpu_segments(pool, start, end)
        )

    def step_seconds(self, tokens: bool = True) -> int:
        """The longest step, dividing an hour and at least a minute, on whose edges every price of the
        sheet starts or changes (effective times, off-peak hours): within one step prices are constant.
        `tokens=False`: the GPU prices' edges only (what costs GPUs; token prices value revenue)."""
        step = 3600
        for effective in [p.effective for p in self.gpu] + [p.effective for p in self.tokens if tokens]:
            step = gcd(step, int((effective - datetime(1970, 1, 1)).total_seconds()) % 3600)
        for t in self.tokens if tokens else ():
            for hhmm in (t.off_peak_utc or "").replace("-", " ").split():
                step = gcd(step, int(hhmm[3:]) * 60)
        return max(step, 60)

    def token_price_at(self, t: datetime) -> TokenPrice | None:
        current = None
        for p in sorted(self.tokens, key=lambda p: p.effective):
            if p.effective <= t:
                current = p
        return current


def _price(entry: dict[str, Any], key: str, where: str) -> float:
    v = entry.get(key)
    if v is None:
        raise PriceSheetError(f"{where}: {key} is missing")
    if not isinstance(v, int | float) or isinstance(v, bool) or v != v or v < 0 or v == float("inf"):
        raise PriceSheetError(f"{where}: {key} must be a finite number >= 0, got {v!r}")
    return float(v)


def parse_sheet(text: str, origin: str = "price sheet") -> PriceSheet:
    data = load_toml(text, origin, PriceSheetError)
    name = data.get("name", Path(origin).stem)
    gpu_lines, token_lines = lines(text, "gpu"), lines(text, "tokens")
    gpus: list[GpuPrice] = []
    for i, entry in enumerate(data.get("gpu", [])):
        where = entry_at(origin, "gpu", gpu_lines, i)
        known(entry, {"effective", "pool", "usd_per_gpu_hour", "source"}, where, PriceSheetError)
        pool = entry.get("pool", "*")
        if pool not in POOLS:
            raise PriceSheetError(f"{where}: unknown pool {pool!r}; pools are prefill, decode and * (every GPU)")
        p = GpuPrice(
            when(entry.get("effective"), where, PriceSheetError),
            pool,
            _price(entry, "usd_per_gpu_hour", where),
            str(entry.get("source") or ""),
        )
        if not p.source:
            raise PriceSheetError(f"{where}: source is missing (say where the price comes from)")
        clash = next((q for q in gpus if q.pool == p.pool and q.effective == p.effective), None)
        if clash is not None:
            raise PriceSheetError(
                f"{where}: a second price for pool {pool!r} effective {p.effective:%Y-%m-%d %H:%M} "
                f"(overlapping effective dates)"
            )
        gpus.append(p)
    tokens: list[TokenPrice] = []
    for i, entry in enumerate(data.get("tokens", [])):
        where = entry_at(origin, "tokens", token_lines, i)
        known(
            entry,
            {"effective", "off_peak_utc", "source", *TOKEN_PRICES, *("off_peak_" + k for k in TOKEN_PRICES)},
            where,
            PriceSheetError,
        )
        eff = when(entry.get("effective"), where, PriceSheetError)
        if any(t.effective == eff for t in tokens):
            raise PriceSheetError(
                f"{where}: a second token price effective {eff:%Y-%m-%d %H:%M} (overlapping effective dates)"
            )
        base = [_price(entry, k, where) for k in TOKEN_PRICES]
        window = entry.get("off_peak_utc")
        off: tuple[float, float, float] | None = None
        if window is not None:
            if not isinstance(window, str) or not _WINDOW.match(window):
                raise PriceSheetError(f"{where}: off_peak_utc must look like 16:30-00:30 (UTC), got {window!r}")
            hit, miss, out = (_price(entry, "off_peak_" + k, where) for k in TOKEN_PRICES)
            off = (hit, miss, out)
        tokens.append(
            TokenPrice(
                eff, base[0], base[1], base[2], off_peak_utc=window, off_peak=off, source=str(entry.get("source") or "")
            )
        )
    unknown = set(data) - {"name", "gpu", "tokens"}
    if unknown:
        raise PriceSheetError(f"{origin}: unknown keys {sorted(unknown)}; a sheet has name, [[gpu]] and [[tokens]]")
    if not gpus and not tokens:
        raise PriceSheetError(f"{origin}: no [[gpu]] or [[tokens]] entries")
    return PriceSheet(str(name), tuple(gpus), tuple(tokens))


def load_sheet(path: str | Path) -> PriceSheet:
    return parse_sheet(read_sheet(path, "price sheet", PriceSheetError), str(Path(path)))


def default_sheet() -> PriceSheet:
    text = resources.files("warehouse").joinpath("price_sheets/default.toml").read_text()
    return parse_sheet(text, "warehouse/price_sheets/default.toml")


def store_sheet(con: duckdb.DuckDBPyConnection, sheet: PriceSheet, now: datetime) -> int:
    """Add the sheet's entries to the warehouse; returns entries added. Refuses an entry that would
    change a stored price (same pool and effective time, another price)."""
    added = 0
    for g in sheet.gpu:
        row = con.execute(sql("prices_gpu_stored"), {"pool": g.pool, "effective": g.effective}).fetchall()
        if row and row[0][0] != g.usd_per_gpu_hour:
            raise PriceSheetError(
                f"{sheet.name}: pool {g.pool!r} already has ${row[0][0]}/GPU-hour from "
                f"{g.effective:%Y-%m-%d %H:%M}; prices are never edited in place: add an entry "
                f"with a later effective time"
            )
        if not row:
            con.execute(
                sql("prices_gpu_store"),
                {"effective": g.effective, "pool": g.pool, "usd_per_gpu_hour": g.usd_per_gpu_hour}
                | {"sheet": sheet.name, "source": g.source, "loaded_at": now},
            )
            added += 1
    for t in sheet.tokens:
        values = [t.usd_per_mtok_input_cache_hit, t.usd_per_mtok_input_cache_miss, t.usd_per_mtok_output]
        row = con.execute(sql("prices_tokens_stored"), {"effective": t.effective}).fetchall()
        if row and list(row[0]) != values:
            raise PriceSheetError(
                f"{sheet.name}: token prices effective {t.effective:%Y-%m-%d %H:%M} are already "
                f"stored with other values; add an entry with a later effective time"
            )
        if not row:
            off = list(t.off_peak) if t.off_peak else [None, None, None]
            prices = dict(zip(TOKEN_PRICES, values, strict=True))
            off_peak = {f"off_peak_{k}": v for k, v in zip(TOKEN_PRICES, off, strict=True)}
            con.execute(
                sql("prices_tokens_store"),
                {"effective": t.effective, **prices, "off_peak_utc": t.off_peak_utc, **off_peak}
                | {"sheet": sheet.name, "source": t.source, "loaded_at": now},
            )
            added += 1
    return added


def stored_sheet(rows_gpu: list[tuple[Any, ...]], rows_tokens: list[tuple[Any, ...]]) -> PriceSheet | None:
    """The sheet the warehouse holds (every version loaded), from its two tables' rows
    (warehouse/sql/prices_stored_gpu.sql and prices_stored_tokens.sql)."""
    if not rows_gpu and not rows_tokens:
        return None
    gpu = tuple(GpuPrice(r[0], r[1], float(r[2]), r[3]) for r in rows_gpu)
    tokens = tuple(
        TokenPrice(r[0], r[1], r[2], r[3], r[4], (r[5], r[6], r[7]) if r[4] else None, r[8]) for r in rows_tokens
    )
    return PriceSheet("warehouse", gpu, tokens)
