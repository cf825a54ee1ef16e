"""SLO attainment, goodput, error budget, burn rates and $/M good tokens (docs/definitions.md, "SLOs").

Counts come from the gateway's request records through warehouse/sql/requests_slo_windows.sql: a
window's whole hours from the hourly SLO sums, its whole minutes around them from the per-minute
sums (and the records not rolled up into either yet), its edges from the records, and a report's
windows, which end together, in one read. So a report is exact as far back as the hourly sums go,
and as fine as the records where they are kept. Each class is read at the version in effect at the window's end for its objective and
period. A figure with nothing under it (no request held to a class) is None, never 0 or NaN.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from moemeter.contract.errors import MoemeterError

from .alerts import AlertRules
from .cost import NoData, Pools, allocate, cost_report, stored_pools
from .prices import PriceSheet
from .read import HOUR, MINUTE, Query, ceil, floor, request_hours, run
from .slo import SloClass, SloSheet, slo_params, stored_slo_sheet
from .sql import text as sql_text

BURN_WINDOWS = {"5m": timedelta(minutes=5), "30m": timedelta(minutes=30), "1h": HOUR, "6h": timedelta(hours=6)}
"""The multi-window burn rates of Google's SRE workbook: page on 1 h and 5 min, ticket on 6 h and 30 min."""
GROUPS = {"class": ["class"], "tenant": ["class", "tenant"]}
COUNTS = ["requests", "held", "met", "failed", "missed_ttft", "missed_itl", "missed_e2e"]
TOKENS = ["prompt_tokens", "cached_prompt_tokens", "generated_tokens", "good_prompt_tokens", "good_generated_tokens"]


class NoSloSheet(MoemeterError, LookupError):
    """The warehouse holds no SLO sheet (it is stored with the first request records)."""


WINDOWS_PER_READ = len(set(re.findall(r"\$edges_starts\[(\d+)\]", sql_text("requests_slo_windows"))))
"""The windows warehouse/sql/requests_slo_windows.sql reads at once: its slots, a scan for each one's
start edge (8)."""
WINDOW_BOUNDS = {  # requests_slo_windows.sql's list parameters, each of slo_window's bound of a window
    "edges_starts": "edges_start",
    "minutes_froms": "minutes_from",
    "finished_froms": "finished_from",
    "finished_untils": "finished_until",
    "minutes_untils": "minutes_until",
}


def slo_sums(q: Query, start: datetime, end: datetime) -> pd.DataFrame:
    """Per finishing hour, class and tenant: the requests_slo_1h sums of the requests that finished
    in [start, end)."""
    return slo_sums_ending(q, [start], end)[0]


def slo_sums_ending(q: Query, starts: Sequence[datetime], end: datetime) -> list[pd.DataFrame]:
    """slo_sums(q, start, end) for each of `starts` (each before `end`), read together: up to
    WINDOWS_PER_READ windows in one statement, each request record judged once."""
    distinct = sorted(set(starts))
    sums: dict[datetime, pd.DataFrame] = {}
    for i in range(0, len(distinct), WINDOWS_PER_READ):
        group = distinct[i : i + WINDOWS_PER_READ]
        bounds = [slo_window(start, end) for start in group]
        lists = {name: [b[bound] for b in bounds] for name, bound in WINDOW_BOUNDS.items()}
        df = run(q, "requests_slo_windows", {**lists, "edges_end": end, "server_faults": bounds[0]["server_faults"]})
        for k, start in enumerate(group, 1):
            sums[start] = df[df["k"] == k].drop(columns="k").reset_index(drop=True)
    return [sums[start] for start in starts]


def slo_window(start: datetime, end: datetime, hours: bool = True, minutes: bool = True) -> dict[str, Any]:
    """The parameters of requests_slo.sql (and slo_over_time.sql) for the requests that finished in
    [start, end): its whole hours from the hourly sums, the whole minutes around them from the
    per-minute sums, and the seconds left at either edge from the records. They nest: start <=
    minutes_from <= finished_from <= finished_until <= minutes_until <= end. `hours=False`: none
    from the hourly sums (a read in steps shorter than an hour); `minutes=False`: none from the
    per-minute sums either (steps shorter than a minute)."""
    m0, m1 = ceil(start, MINUTE), floor(end, MINUTE)
    if not minutes or m0 >= m1:  # no whole minute: the records alone
        m0 = m1 = start
    h0, h1 = ceil(start, HOUR), floor(end, HOUR)
    if not hours or h0 >= h1:  # no whole hour: the minutes alone
        h0 = h1 = m0
    return {**request_hours(h0, h1), **slo_params(start, end, (m0, m1))}


def stored_sheet(q: Query) -> SloSheet:
    sheet = stored_slo_sheet(
        list(run(q, "slo_stored_classes").itertuples(index=False)),
        list(run(q, "slo_stored_assignments").itertuples(index=False)),
    )
    if sheet is None:
        raise NoSloSheet("the warehouse holds no SLO sheet: `moemeter slo load SHEET.toml`, or ingest request records")
    return sheet


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _burn(missed: float, held: float, objective: float) -> float | None:
    """The share of held requests that missed, over the share the objective allows."""
    return missed / held / (1 - objective) if held else None


@dataclass
class SloReport:
    start: datetime
    end: datetime
    by: str
    rows: pd.DataFrame  # one per class (or class and tenant), the columns of `COLUMNS`
    cost_usd: float | None  # the pools' cost over the window; None without pools or token counters
    good_tokens: int
    cost_note: str = ""
    classes: dict[str, SloClass] = field(default_factory=dict)
    sums: pd.DataFrame | None = None  # the window's slo_sums, that the report's rows are summed from
    history: pd.DataFrame | None = None  # slo_sums from the window's first hour less the longest period

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def usd_per_mtok_good(self) -> float | None:
        """The rack's: the pools' whole cost over the tokens of the requests that met their targets."""
        return self.cost_usd / (self.good_tokens / 1e6) if self.cost_usd is not None and self.good_tokens else None

    def as_json(self) -> dict[str, Any]:
        return {
            "window": {
                "from": self.start.isoformat() + "Z",
                "to": self.end.isoformat() + "Z",
                "hours": round(self.seconds / 3600, 6),
            },
            "by": self.by,
            "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 2),
            "cost_note": self.cost_note,
            "good_tokens": self.good_tokens,
            "usd_per_mtok_good": _round(self.usd_per_mtok_good),
            "rows": [{k: _plain(v) for k, v in r.items()} for r in self.rows.to_dict("records")],
        }

    def as_csv(self) -> str:
        out = io.StringIO()
        w = csv.writer(out)
        w.writerow(list(self.rows.columns))
        for r in self.as_json()["rows"]:
            w.writerow(["" if v is None else v for v in r.values()])
        return out.getvalue()

    def as_text(self) -> str:
        d = self.as_json()

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{100 * v:.2f}%"

        def num(v: float | None, fmt: str = ".2f") -> str:
            return "n/a" if v is None else format(v, fmt)

        usd = d["usd_per_mtok_good"]
        lines = [
            f"{d['window']['from']} .. {d['window']['to']} ({d['window']['hours']:g} h); "
            + (
                f"pools' cost ${d['cost_usd']:,.2f}, {d['good_tokens']:,} good tokens, "
                + (f"${usd:,.4f}/M good tokens" if usd is not None else "no good token: no $/M good tokens")
                if d["cost_usd"] is not None
                else f"no cost: {d['cost_note']}"
            )
        ]
        for r in d["rows"]:
            who = r["class"] or "(no class in effect)"
            if self.by == "tenant":
                who += f" / {r['tenant']}"
            lines.append(
                f"{who:<32} {r['requests']:>9,} held {r['met']:>9,} met  attainment {pct(r['attainment']):>8} "
                f"(objective {pct(r['objective'])})  goodput {num(r['goodput_rps'], '.3f')} req/s "
                f"{num(r['goodput_tps'], ',.1f')} tok/s  ${num(r['usd_per_mtok_good'], ',.4f')}/M good  "
                f"budget left {pct(r['budget_left'])}  burn 1h {num(r['burn_1h'])} 6h {num(r['burn_6h'])}"
            )
        if not d["rows"]:
            lines.append("no SLO class is in effect and no request finished in the window")
        return "\n".join(lines)


COLUMNS = [
    "class",
    "tenant",
    "requests",  # held to the class's objective
    "met",
    "attainment",
    "objective",
    "failed",
    "missed_ttft",
    "missed_itl",
    "missed_e2e",
    "goodput_rps",
    "goodput_tps",
    "good_tokens",
    "cost_usd",
    "usd_per_mtok_good",
    "budget_left",
    "burn_5m",
    "burn_30m",
    "burn_1h",
    "burn_6h",
    "burning",  # "page" (fast burn), "ticket" (slow burn) or ""
]


def _round(v: float | None, digits: int = 6) -> float | None:
    return None if v is None else round(v, digits)


def _plain(v: Any) -> Any:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def slo_report(
    q: Query,
    start: datetime,
    end: datetime,
    pools: Pools | None = None,
    prices: PriceSheet | None = None,
    by: str = "class",
) -> SloReport:
    """`pools`: the targets file's pools; None: the prefill and decode targets the warehouse saw."""
    return slo_reports(q, start, end, pools, prices, (by,))[by]


def slo_reports(
    q: Query,
    start: datetime,
    end: datetime,
    pools: Pools | None = None,
    prices: PriceSheet | None = None,
    by: tuple[str, ...] = ("class",),
) -> dict[str, SloReport]:
    """The report for each grouping in `by`, from one reading of the window, its burn windows and
    its classes' periods."""
    if end <= start:
        raise ValueError(f"the window must end after it starts ({start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M})")
    wrong = [b for b in by if b not in GROUPS]
    if wrong:
        raise ValueError(f"--by must be one of {', '.join(GROUPS)}, got {wrong[0]!r}")
    sheet = stored_sheet(q)
    classes = sheet.classes_at(end)
    days = sorted({c.period_days for c in classes.values()})
    # the window, its burn windows, its classes' periods, and the history a budget over time needs
    history = floor(start, HOUR) - timedelta(days=max(days, default=0))
    starts = [start, *(end - width for width in BURN_WINDOWS.values()), *(end - timedelta(days=d) for d in days)]
    window, *rest, before = slo_sums_ending(q, [*starts, history], end)
    burns = dict(zip(BURN_WINDOWS, rest[: len(BURN_WINDOWS)], strict=True))
    periods = dict(zip(days, rest[len(BURN_WINDOWS) :], strict=True))
    cost, note = None, ""
    try:
        pools = pools if pools is not None else stored_pools(q, start, end)
        if not any(pools.values()):
            raise NoData("no prefill or decode target was seen in the window")
        costed = cost_report(q, pools, start, end, prices, revenue_too=False, users_too=False)  # the pools' cost alone
        cost, pool_costs = costed.cost_usd, (costed.prefill.cost_usd, costed.decode.cost_usd)
    except NoData as exc:
        note, pool_costs = str(exc), None
    out = {}
    for b in by:
        rows = _rows(GROUPS[b], classes, window, burns, periods, pool_costs, (end - start).total_seconds())
        out[b] = SloReport(start, end, b, rows, cost, int(rows["good_tokens"].sum()), note, classes, window, before)
    return out


def _grouped(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=keys + COUNTS + TOKENS)
    return df.groupby(keys, as_index=False)[COUNTS + TOKENS].sum()


def _missed(df: pd.DataFrame, keys: list[str]) -> dict[tuple[Any, ...], tuple[int, int]]:
    """(missed, held) per group."""
    g = _grouped(df, keys)
    return {tuple(r[k] for k in keys): (int(r["held"]) - int(r["met"]), int(r["held"])) for _, r in g.iterrows()}


def _rows(
    keys: list[str],
    classes: dict[str, SloClass],
    window: pd.DataFrame,
    burns: dict[str, pd.DataFrame],
    periods: dict[float, pd.DataFrame],
    pool_costs: tuple[float, float] | None,
    seconds: float,
) -> pd.DataFrame:
    rows = _grouped(window, keys)
    if keys == ["class"]:  # every class in effect, with or without requests
        missing = [c for c in classes if c not in set(rows["class"])]
        rows = pd.concat([rows, pd.DataFrame({"class": missing})], ignore_index=True) if missing else rows
    for c in COUNTS + TOKENS:
        rows[c] = rows[c].fillna(0).astype("int64")
    if "tenant" not in rows:
        rows["tenant"] = None
    if pool_costs is None:
        rows["cost_usd"] = None
    else:
        shares = allocate(
            rows.assign(user=list(range(len(rows))))[
                ["user", "prompt_tokens", "cached_prompt_tokens", "generated_tokens"]
            ],
            *pool_costs,
        ).set_index("user")["cost_usd"]
        rows["cost_usd"] = [float(shares[i]) for i in range(len(rows))] if len(rows) else []
    rows["good_tokens"] = rows["good_prompt_tokens"] + rows["good_generated_tokens"]
    rows["objective"] = [classes[c].objective if c in classes else None for c in rows["class"]]
    rows["attainment"] = [_ratio(m, h) for m, h in zip(rows["met"], rows["held"])]
    rows["goodput_rps"] = [m / seconds if h else None for m, h in zip(rows["met"], rows["held"])]
    rows["goodput_tps"] = [g / seconds if h else None for g, h in zip(rows["good_tokens"], rows["held"])]
    rows["usd_per_mtok_good"] = [
        c / (g / 1e6) if c is not None and not pd.isna(c) and g else None
        for c, g in zip(rows["cost_usd"], rows["good_tokens"])
    ]
    key_of = [tuple(r[k] for k in keys) for _, r in rows.iterrows()]
    for name, df in burns.items():
        seen = _missed(df, keys)
        rows[f"burn_{name}"] = [
            _burn(*seen.get(k, (0, 0)), classes[k[0]].objective) if k[0] in classes else None for k in key_of
        ]
    spent = {days: _missed(df, keys) for days, df in periods.items()}
    budget: list[float | None] = []
    for k in key_of:
        version = classes.get(k[0])
        missed, held = spent[version.period_days].get(k, (0, 0)) if version else (0, 0)
        budget.append(1 - missed / ((1 - version.objective) * held) if version and held else None)
    rows["budget_left"] = budget
    rows["burning"] = [is_burning(r) for r in rows.to_dict("records")]
    rows["requests"] = rows["held"]
    rows = rows.sort_values(keys, kind="stable").reset_index(drop=True)[COLUMNS]
    return rows.astype(object).where(rows.notna(), None)


def is_burning(row: dict[str, Any], rules: AlertRules | None = None) -> str:
    """'page' (fast burn over 1 h and 5 min), 'ticket' (slow burn over 6 h and 30 min) or ''."""
    r = rules or AlertRules()

    def over(window: str, limit: float) -> bool:
        v = row.get(f"burn_{window}")
        return v is not None and v > limit

    if over("1h", r.burn_fast) and over("5m", r.burn_fast):
        return "page"
    if over("6h", r.burn_slow) and over("30m", r.burn_slow):
        return "ticket"
    return ""
