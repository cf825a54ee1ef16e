"""Queries behind the SLO page: the report `moemeter report slo` prints, attainment over time, and the
rack's operating point (tokens/s per GPU against per-user tokens/s) per step.

Windows up to RAW_SECONDS read attainment per step: steps of whole minutes from the per-minute SLO
sums, shorter ones from the records; longer windows per hour from the hourly SLO sums
(warehouse/goodput.py), as the Users page does.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd

from warehouse.alerts import AlertRules
from warehouse.goodput import SloReport, slo_reports, slo_sums, slo_window
from warehouse.read import ceil, floor, run

from . import cost, live, spec, users
from .live import Query, Window

__all__ = [
    "AlertRules",
    "SloReport",
    "observed",
    "reports",
    "attainment_over_time",
    "budget_over_time",
    "operating_points",
]


def observed(q: Query, w: Window) -> Window:
    """The window from the rack's first scrape when that is later than its start: unobserved time is
    neither cost nor seconds of goodput (docs/definitions.md, "Unobserved time")."""
    first = cost.first_count(q)
    return Window(first, w.end, w.step_seconds) if first is not None and w.start < first < w.end else w


def reports(q: Query, w: Window) -> tuple[SloReport, SloReport]:
    """The window's report per class and per tenant (`moemeter report slo [--by tenant]`)."""
    r = slo_reports(q, w.start, w.end, by=("class", "tenant"))
    return r["class"], r["tenant"]


def attainment_over_time(q: Query, w: Window, report: SloReport | None = None) -> pd.DataFrame:
    """bucket, class, held, met, attainment (None where nothing was held). In hours, from the hourly
    sums that `report` read, where it is the window's (one read fewer), else read here."""
    if users.hourly(w):
        sums = report.sums if report is not None and (report.start, report.end) == (w.start, w.end) else None
        df = (sums if sums is not None else slo_sums(q, w.start, w.end)).rename(columns={"ts": "bucket"})
        df = df.groupby(["bucket", "class"], as_index=False)[["held", "met"]].sum() if len(df) else df
    else:  # no hours: steps of whole minutes from the per-minute sums, any other from every record
        window = slo_window(w.start, w.end, hours=False, minutes=w.step_seconds % 60 == 0)
        df = run(q, "slo_over_time", {**window, "step_us": w.step_seconds * 1_000_000})
    if df.empty:
        return pd.DataFrame(columns=["bucket", "class", "held", "met", "attainment"])
    df = df[df["held"] > 0].copy()
    df["attainment"] = df["met"] / df["held"]
    return df[["bucket", "class", "held", "met", "attainment"]].reset_index(drop=True)


EMPTY_SUMS = pd.DataFrame({"ts": pd.Series(dtype="datetime64[ns]"), "class": [], "held": [], "met": []})


def budget_over_time(q: Query, w: Window, report: SloReport) -> pd.DataFrame:
    """ts, class, budget_left: each class's error budget left over its period (docs/definitions.md,
    SLOs) as it stood at each whole hour of the window, from the hourly SLO sums, and at the
    window's end (the report's own figure). A class's objective and period are its version in
    effect at the window's end. None where nothing was held over the period. The hourly sums are
    those the report read with it, where it is the window's."""
    hour = timedelta(hours=1)
    rows: list[tuple[object, str, float | None]] = []
    if report.classes:
        longest = timedelta(days=max(c.period_days for c in report.classes.values()))
        sums = report.history if (report.start, report.end) == (w.start, w.end) else None
        if sums is None:
            sums = slo_sums(q, floor(w.start, hour) - longest, w.end)
        hourly = sums.groupby(["ts", "class"], as_index=False)[["held", "met"]].sum() if len(sums) else EMPTY_SUMS
        hourly = hourly.assign(ts=pd.to_datetime(hourly["ts"]))
        points = pd.date_range(ceil(w.start, hour), w.end, freq="h", inclusive="left")
        for name, c in sorted(report.classes.items()):
            mine = hourly[hourly["class"] == name].sort_values("ts")
            ts = mine["ts"].to_numpy()
            # the sums over [t - period, t): those of the hours before t less those before t - period
            held, met = ([0, *np.cumsum(mine[k].to_numpy(dtype="int64"))] for k in ("held", "met"))
            upto = ts.searchsorted(points.to_numpy())
            since = ts.searchsorted((points - timedelta(days=c.period_days)).to_numpy())
            for t, i, j in zip(points, upto, since, strict=True):
                n = int(held[i] - held[j])
                missed = n - int(met[i] - met[j])
                rows.append((t, name, 1 - missed / ((1 - c.objective) * n) if n else None))
    for r in report.rows.to_dict("records"):
        if r["class"] in report.classes:
            rows.append((pd.Timestamp(w.end), r["class"], r["budget_left"]))
    out = pd.DataFrame(rows, columns=["ts", "class", "budget_left"])
    out["budget_left"] = out["budget_left"].astype(object).where(out["budget_left"].notna(), None)
    return out


def operating_points(q: Query, w: Window) -> pd.DataFrame:
    """bucket, tps_per_gpu (the rack's logical tokens/s per GPU), tps_per_user (P90 per-user tokens/s):
    one point per step that has both; acceptance_length, the decode pool's mean acceptance length
    in the step (NaN without a draft path: per-user speed is acceptance length over step time)."""
    gpus = live.pool_gpus(live.targets(q, w))
    rack = live.tokens_per_gpu(live.token_rates(q, w), gpus)
    rack = rack[rack["series"] == "rack logical"][["bucket", "value"]].rename(columns={"value": "tps_per_gpu"})
    per_user = users.tps_over_time(q, w)[["bucket", "tps_p90"]].rename(columns={"tps_p90": "tps_per_user"})
    if rack.empty or per_user.empty:
        return pd.DataFrame(columns=["bucket", "tps_per_gpu", "tps_per_user", "acceptance_length"])
    rack["bucket"], per_user["bucket"] = pd.to_datetime(rack["bucket"]), pd.to_datetime(per_user["bucket"])
    drafted = spec.drafting(q, w).over_time("pool", positions=False)
    drafted = drafted.loc[drafted["role"] == "decode", ["bucket", "mean_acceptance_length"]]
    drafted = drafted.rename(columns={"mean_acceptance_length": "acceptance_length"})
    drafted["bucket"] = pd.to_datetime(drafted["bucket"])
    out = rack.merge(per_user, on="bucket").merge(drafted, on="bucket", how="left")
    return out[(out["tps_per_gpu"] > 0) & (out["tps_per_user"] > 0)].sort_values("bucket").reset_index(drop=True)
