"""Queries behind the Roofline page: how close each pool and engine runs to its GPU's roofs.

Achieved FLOP/s and bytes/s per GPU are the increases of vLLM's estimated FLOPs and bytes counters
over the seconds they covered (warehouse/sql/roofline_engines.sql); MFU and MBU divide them by the
GPU sheet's dense peak at the precision the model runs at and by its HBM bandwidth
(warehouse/roofline.py). docs/definitions.md (Roofline) says how each is computed and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moemeter.contract import POOLS
from warehouse.read import Query, Window, increases, run
from warehouse.roofline import PRECISIONS, GpuSheet, GpuSpec, default_sheet

from .live import counters

KEYS = ["role", "target", "engine"]
SHEET = default_sheet()
"""The GPU sheet the page measures against (warehouse/gpu_sheets/default.toml)."""
REJECTED_SHARE = "rejected_share"
"""The column with rejected drafts' share of an engine's decode compute over the window:
(draft tokens - accepted tokens) / (generated tokens + draft tokens - accepted tokens), from
vLLM's speculative-decoding counters; NaN (no speculative decoding), never 0, where the engine
exports none. MFU counts the rejected drafts' compute as work done: this says how much of it was."""


def engine_label(target: object, engine: object) -> str:
    return f"{target} · DP {engine}"


def engines(q: Query, w: Window) -> pd.DataFrame:
    """Per engine of both pools over the whole window (one row each): roofline_engines.sql's counts."""
    return _framed(increases(q, "roofline_engines", w.start, w.end, None))


def engines_over_time(q: Query, w: Window) -> pd.DataFrame:
    """The same per step of the window."""
    return _framed(counters(q, "roofline_engines", w))


def _framed(df: pd.DataFrame) -> pd.DataFrame:
    """Each engine's GPUs (its target's GPUs shared evenly among the target's engines, as idle
    GPU-hours count them) and label; rows in pool (prefill first), target and DP-rank order."""
    if df.empty:
        return df.assign(gpus=pd.Series(dtype=float), label=pd.Series(dtype=str))
    df = df.assign(bucket=pd.to_datetime(df["bucket"]), engine=df["engine"].astype(str))
    per_target = df.groupby("target")["engine"].transform("nunique")
    df["gpus"] = df["target_gpus"].astype(float) / per_target
    df["label"] = [engine_label(t, e) for t, e in zip(df["target"], df["engine"])]
    pool = df["role"].map({p: i for i, p in enumerate(POOLS)})
    rank = pd.to_numeric(df["engine"], errors="coerce")
    order = df.assign(_pool=pool, _rank=rank).sort_values(
        ["bucket", "_pool", "target", "_rank", "engine"], kind="stable"
    )
    return order.drop(columns=["_pool", "_rank"]).reset_index(drop=True)


# ---------------------------------------------------------------------- GPU models
def gpu_models(q: Query, w: Window) -> pd.DataFrame:
    """What the GPU exporters scraped in the window report: target, host, gpu_model, gpus."""
    return run(q, "roofline_gpu_models", {"start": w.start, "end": w.end})


@dataclass(frozen=True)
class PoolGpu:
    """The GPU a pool runs on, as the GPU exporters report it."""

    model: str | None
    """dcgm-exporter's modelName; None where no exporter reports one."""
    spec: GpuSpec | None
    """Its entry in the GPU sheet; None where the sheet has none."""
    how: str
    """How it was told: by the pool's hosts, or the rack's only model, or its commonest."""


def pool_gpu(models: pd.DataFrame, targets: pd.DataFrame, role: str, sheet: GpuSheet = SHEET) -> PoolGpu:
    """The GPU model of pool `role`: the one the exporters on its targets' hosts report, else the
    rack's (the model most of the rack's GPUs are, where there are several)."""
    hosts = set(targets.loc[(targets["role"] == role) & targets["hostname"].notna(), "hostname"]) - {""}
    on_hosts = models[models["host"].isin(hosts)] if hosts else models.iloc[0:0]
    pick, how = (on_hosts, "on the pool's hosts") if len(on_hosts) else (models, "the rack's GPUs")
    if pick.empty:
        return PoolGpu(None, None, "no GPU exporter reports a model")
    by_model = pick.groupby("gpu_model")["gpus"].sum().sort_values(ascending=False, kind="stable")
    model = str(by_model.index[0])
    if len(by_model) > 1:
        how += f", the commonest of {len(by_model)} models"
    return PoolGpu(model, sheet.find(model), how)


# ------------------------------------------------------------------------- measure
def measured(
    df: pd.DataFrame, gpus: dict[str, PoolGpu], precision: str | None = None, sheet: GpuSheet = SHEET
) -> pd.DataFrame:
    """Per row of engines() or engines_over_time(): flops_per_second and bytes_per_second (read +
    write) per GPU, intensity (FLOP/byte), the GPU model, the precision and peak its MFU is measured
    against (`precision`, else the sheet's for the model; the next wider where the GPU lacks it),
    mfu and mbu (0-1; NaN where the pool's GPU is not in the sheet or nothing was counted)."""
    out = df.copy()
    if out.empty:
        for c in ("flops_per_second", "bytes_per_second", "intensity", "peak_flops_per_second"):
            out[c] = pd.Series(dtype=float)
        return out.assign(gpu_model=pd.Series(dtype=str), precision=pd.Series(dtype=str), mfu=np.nan, mbu=np.nan)
    seconds = out["seconds"].where(out["seconds"] > 0)
    moved = out["read_bytes"].fillna(0) + out["write_bytes"].fillna(0)
    out["flops_per_second"] = out["flops"] / seconds
    out["bytes_per_second"] = moved / seconds
    out["intensity"] = out["flops"] / moved.where(moved > 0)
    rows: list[tuple[str | None, str | None, float, float]] = []  # GPU model, precision, peak, bandwidth
    for role, served in zip(out["role"], out["model_name"]):
        g = gpus.get(role)
        if g is None or g.spec is None:
            rows.append((g.model if g is not None else None, None, np.nan, np.nan))
            continue
        a = sheet.assumed(None if pd.isna(served) else str(served), g.spec, precision)
        rows.append((g.model, a.precision, a.peak_flops_per_second, g.spec.hbm_bytes_per_second))
    out["gpu_model"] = [r[0] for r in rows]
    out["precision"] = [r[1] for r in rows]
    out["peak_flops_per_second"] = pd.Series([r[2] for r in rows], index=out.index, dtype=float)
    out["hbm_bytes_per_second"] = pd.Series([r[3] for r in rows], index=out.index, dtype=float)
    out["mfu"] = out["flops_per_second"] / out["peak_flops_per_second"]
    out["mbu"] = out["bytes_per_second"] / out["hbm_bytes_per_second"]
    return out


def pools(engines_measured: pd.DataFrame) -> pd.DataFrame:
    """Per bucket and pool: its engines' flops_per_second, bytes_per_second, mfu and mbu averaged
    over its GPUs (each engine weighted by its GPUs), intensity of the sums, and the rejected
    drafts' share of the pool's decode compute (NaN where no engine speculates)."""
    cols = ["bucket", "role", "gpus", "flops_per_second", "bytes_per_second", "intensity", "mfu", "mbu"]
    if engines_measured.empty:
        return pd.DataFrame(columns=[*cols, "gpu_model", "precision", REJECTED_SHARE])
    e = engines_measured
    rows = []
    for (bucket, role), g in e.groupby(["bucket", "role"], sort=True):
        w = g["gpus"].where(g["flops_per_second"].notna())
        weight = w.sum()

        def mean(col: str, g: pd.DataFrame = g, w: pd.Series = w, weight: float = weight) -> float:
            return float((g[col] * w).sum(min_count=1) / weight) if weight > 0 else np.nan

        moved = (g["read_bytes"].fillna(0) + g["write_bytes"].fillna(0)).sum()
        draft, accepted = g["draft_tokens"].sum(min_count=1), g["accepted_tokens"].sum(min_count=1)
        wasted = draft - accepted
        denominator = g["generated"].sum(min_count=1) + wasted
        rows.append(
            {
                "bucket": bucket,
                "role": role,
                "gpus": float(g["gpus"].sum()),
                "flops_per_second": mean("flops_per_second"),
                "bytes_per_second": mean("bytes_per_second"),
                "intensity": float(g["flops"].sum() / moved) if moved > 0 else np.nan,
                "mfu": mean("mfu"),
                "mbu": mean("mbu"),
                "gpu_model": g["gpu_model"].dropna().iloc[0] if g["gpu_model"].notna().any() else None,
                "precision": g["precision"].dropna().iloc[0] if g["precision"].notna().any() else None,
                REJECTED_SHARE: float(wasted / denominator) if denominator > 0 else np.nan,
            }
        )
    out = pd.DataFrame(rows)
    order = {p: i for i, p in enumerate(POOLS)}
    return out.sort_values(["bucket", "role"], key=lambda c: c.map(order) if c.name == "role" else c).reset_index(
        drop=True
    )


def roofs(spec: GpuSpec, intensity: tuple[float, float], assumed: str | None = None) -> pd.DataFrame:
    """The GPU's roof lines over arithmetic intensity [low, high] (FLOP/byte), one per precision it
    has: min(peak, intensity x HBM bandwidth), with the ridge point on each; `assumed` marks the
    precision MFU is measured against. Columns: gpu_model, precision, assumed, intensity, flops_per_second."""
    low, high = intensity
    rows = []
    for p in PRECISIONS:
        peak, ridge = spec.peak(p), spec.ridge(p)
        if peak is None or ridge is None:
            continue
        xs = sorted({low, high, *([ridge] if low < ridge < high else [])})
        for x in xs:
            rows.append((spec.model, p, p == assumed, x, min(peak, x * spec.hbm_bytes_per_second)))
    return pd.DataFrame(rows, columns=["gpu_model", "precision", "assumed", "intensity", "flops_per_second"])


def all_roofs(gpus: dict[str, PoolGpu], assumed: dict[str, str], span: tuple[float, float]) -> pd.DataFrame:
    """roofs() of each GPU model the pools run on, once each; the precision a pool's MFU is
    measured against marked (`assumed`: pool -> precision)."""
    frames, seen = [], set()
    for role, g in gpus.items():
        if g.spec is None or g.spec.model in seen:
            continue
        seen.add(g.spec.model)
        frames.append(roofs(g.spec, span, assumed.get(role)))
    return pd.concat(frames, ignore_index=True) if frames else roofs_of_nothing()


def roofs_of_nothing() -> pd.DataFrame:
    return pd.DataFrame(columns=["gpu_model", "precision", "assumed", "intensity", "flops_per_second"])


def intensity_range(points: pd.DataFrame, specs: list[GpuSpec]) -> tuple[float, float]:
    """An x range holding every point and every ridge, a decade of margin either side."""
    xs = [v for v in points["intensity"].tolist() if v == v and v > 0] if len(points) else []
    xs += [r for s in specs for p in PRECISIONS if (r := s.ridge(p)) is not None]
    if not xs:
        return 1.0, 1e4
    return 10 ** np.floor(np.log10(min(xs)) - 1), 10 ** np.ceil(np.log10(max(xs)) + 1)


def estimates_missing(engines_measured: pd.DataFrame) -> bool:
    """vLLM counted no FLOPs at all: its estimates are off (vLLM starts them with --enable-mfu-metrics)."""
    return engines_measured.empty or not (engines_measured["flops"].fillna(0) > 0).any()
