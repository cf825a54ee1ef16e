"""The roofline's fixed side: what one GPU can do at most, and the precision a served model runs at.

A GPU sheet (TOML; warehouse/gpu_sheets/default.toml is the default) gives per GPU model its dense
peak FLOP/s per precision, its HBM bandwidth and its memory, each value with its source, and per
served model the precision its GEMMs run at, which its MFU is measured against (docs/definitions.md,
Roofline). The achieved side is vLLM's estimated FLOPs and bytes, read per engine by
warehouse/sql/roofline_engines.sql. Every mistake in a sheet is refused with its file, the line of
its entry and the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from moemeter.contract.errors import MoemeterError
from warehouse.sheets import entry_at, known, lines, load_toml, read_sheet

PRECISIONS = ("fp4", "fp8", "bf16")
"""Narrowest first. A GPU without a peak for a model's precision is measured against the next wider
one it has (FP4 experts run as FP8 on Hopper)."""
PEAK_KEYS = {p: f"dense_{p}_flops_per_second" for p in PRECISIONS}
BANDWIDTH, MEMORY = "hbm_bytes_per_second", "memory_bytes"
VALUE_KEYS = (*PEAK_KEYS.values(), BANDWIDTH, MEMORY)
PLAUSIBLE = {"flops": (1e12, 1e18), BANDWIDTH: (1e11, 1e15), MEMORY: (1e9, 1e13)}
"""Per-GPU ranges a value must lie in: outside, it is a unit slip (15 for 15 PFLOP/s, 8e15 for 8 TB/s)."""
ANY_MODEL = "*"


class GpuSheetError(MoemeterError, ValueError):
    """A GPU sheet that cannot be used, or a GPU model or served model it has no entry for; the
    message names the file, the entry's line and the key."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's roofs."""

    model: str
    """As dcgm-exporter's `modelName` label names it, e.g. "NVIDIA GB300"."""
    peaks: dict[str, float] = field(hash=False)
    """Dense tensor-core peak per precision of PRECISIONS it has, FLOP/s."""
    hbm_bytes_per_second: float
    """Peak HBM bandwidth, bytes/s."""
    memory_bytes: float
    """HBM capacity, bytes."""
    sources: dict[str, str] = field(hash=False)
    """Where each value comes from, by its key in the sheet."""
    aliases: tuple[str, ...] = ()
    """Other names dcgm-exporter gives the same part."""

    def peak(self, precision: str) -> float | None:
        """Dense peak FLOP/s at `precision`; None where the GPU has no tensor cores for it."""
        return self.peaks.get(precision)

    def ridge(self, precision: str) -> float | None:
        """Arithmetic intensity (FLOP/byte) where the compute roof meets the bandwidth roof."""
        peak = self.peak(precision)
        return None if peak is None else peak / self.hbm_bytes_per_second

    def names(self) -> tuple[str, ...]:
        return (self.model, *self.aliases)


@dataclass(frozen=True)
class ModelPrecision:
    name: str
    """A served model as vLLM's `model_name` label names it, or "*" for any other."""
    precision: str
    """The precision of PRECISIONS its GEMMs run at."""
    source: str
    """Why: the checkpoint's format, a serving recipe."""


@dataclass(frozen=True)
class Assumed:
    """What one model's MFU on one GPU is measured against."""

    precision: str
    """The precision whose peak is the denominator."""
    peak_flops_per_second: float
    model_precision: str
    """The precision the sheet says the model runs at (`precision` differs where the GPU lacks it)."""
    reason: str


@dataclass(frozen=True)
class GpuSheet:
    name: str
    origin: str
    """The file it was read from, for messages."""
    gpus: tuple[GpuSpec, ...]
    models: tuple[ModelPrecision, ...]

    def find(self, model: str) -> GpuSpec | None:
        """The entry dcgm-exporter's `modelName` `model` names (case and outer spaces aside)."""
        key = model.strip().casefold()
        return next((g for g in self.gpus if key in {n.casefold() for n in g.names()}), None)

    def gpu(self, model: str) -> GpuSpec:
        found = self.find(model)
        if found is None:
            have = ", ".join(repr(g.model) for g in self.gpus)
            raise GpuSheetError(
                f"{self.origin}: no [[gpu]] entry for GPU model {model!r} (dcgm-exporter's modelName); "
                f"it has {have}: add an entry with its peaks and their sources"
            )
        return found

    def model_precision(self, served: str | None) -> ModelPrecision:
        """The entry for `served` (vLLM's model_name), else the "*" entry."""
        exact = next((m for m in self.models if served is not None and m.name == served), None)
        fallback = next((m for m in self.models if m.name == ANY_MODEL), None)
        found = exact or fallback
        if found is None:
            raise GpuSheetError(f"{self.origin}: no [[model]] entry for {served!r} and no {ANY_MODEL!r} entry")
        return found

    def assumed(self, served: str | None, gpu: GpuSpec, precision: str | None = None) -> Assumed:
        """The precision and peak `served`'s MFU on `gpu` is measured against: `precision` when one is
        asked for, else the sheet's for the model; where the GPU has no peak for it, the next wider
        precision it has."""
        entry = self.model_precision(served)
        wanted = precision or entry.precision
        if wanted not in PRECISIONS:
            raise GpuSheetError(f"unknown precision {wanted!r}; precisions are {', '.join(PRECISIONS)}")
        for p in PRECISIONS[PRECISIONS.index(wanted) :]:
            peak = gpu.peak(p)
            if peak is not None:
                reason = entry.source if precision is None else f"{p.upper()} asked for"
                if p != wanted:
                    reason = f"{gpu.model} has no {wanted.upper()} tensor cores: its {p.upper()} peak. " + reason
                return Assumed(p, peak, entry.precision, reason)
        raise GpuSheetError(f"{self.origin}: {gpu.model} has no peak at {wanted.upper()} or any wider precision")


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise GpuSheetError(f"{where}: {key} must be a finite number above 0, got {value!r}")
    low, high = PLAUSIBLE["flops" if key in PEAK_KEYS.values() else key]
    if not low <= value <= high:
        unit = "FLOP/s" if key in PEAK_KEYS.values() else "bytes/s" if key == BANDWIDTH else "bytes"
        raise GpuSheetError(
            f"{where}: {key} = {value:g} is outside {low:g}..{high:g} {unit} per GPU; write the value in "
            f"{unit} (15 PFLOP/s is 15.0e15, 8 TB/s is 8.0e12)"
        )
    return float(value)


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise GpuSheetError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value.strip()


def _gpu(entry: Any, where: str) -> GpuSpec:
    if not isinstance(entry, dict):
        raise GpuSheetError(f"{where}: an entry is a table of keys, got {entry!r}")
    known(entry, {"model", "aliases", "sources", *VALUE_KEYS}, where, GpuSheetError)
    model = _text(entry.get("model"), "model", where)
    where = f"{where}, {model}"
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list):
        raise GpuSheetError(f"{where}: aliases must be a list of names, got {aliases!r}")
    values = {k: _number(entry[k], k, where) for k in VALUE_KEYS if k in entry}
    for k in (BANDWIDTH, MEMORY):
        if k not in values:
            raise GpuSheetError(f"{where}: {k} is missing")
    peaks = {p: values[k] for p, k in PEAK_KEYS.items() if k in values}
    if not peaks:
        raise GpuSheetError(f"{where}: no dense peak: give one of {', '.join(PEAK_KEYS.values())}")
    given = [p for p in PRECISIONS if p in peaks]
    for narrow, wide in zip(given, given[1:]):
        if peaks[narrow] < peaks[wide]:
            raise GpuSheetError(
                f"{where}: {PEAK_KEYS[narrow]} ({peaks[narrow]:g}) is below {PEAK_KEYS[wide]} ({peaks[wide]:g}): "
                "a narrower type computes at least as fast; a sparse figure beside a dense one?"
            )
    sources = entry.get("sources")
    if not isinstance(sources, dict):
        raise GpuSheetError(f"{where}: sources is missing: a [gpu.sources] table naming each value's source")
    for k in values:
        if k not in sources:
            raise GpuSheetError(f"{where}: {k} has no source (sources.{k}: say where the figure comes from)")
        _text(sources[k], f"sources.{k}", where)
    stray = sorted(set(sources) - set(values))
    if stray:
        raise GpuSheetError(f"{where}: sources for values the entry does not give: {stray}")
    names = tuple(_text(a, "aliases", where) for a in aliases)
    return GpuSpec(model, peaks, values[BANDWIDTH], values[MEMORY], {k: sources[k].strip() for k in values}, names)


def _model(entry: Any, where: str) -> ModelPrecision:
    if not isinstance(entry, dict):
        raise GpuSheetError(f"{where}: an entry is a table of keys, got {entry!r}")
    known(entry, {"name", "precision", "source"}, where, GpuSheetError)
    name = _text(entry.get("name"), "name", where)
    precision = entry.get("precision")
    if precision not in PRECISIONS:
        raise GpuSheetError(f"{where}, {name}: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not entry.get("source"):
        raise GpuSheetError(f"{where}, {name}: source is missing (say why the model runs at {precision})")
    return ModelPrecision(name, precision, _text(entry.get("source"), "source", f"{where}, {name}"))


def parse_sheet(text: str, origin: str = "GPU sheet") -> GpuSheet:
    data = load_toml(text, origin, GpuSheetError)
    unknown = set(data) - {"name", "gpu", "model"}
    if unknown:
        raise GpuSheetError(f"{origin}: unknown keys {sorted(unknown)}; a sheet has name, [[gpu]] and [[model]]")
    for table in ("gpu", "model"):
        if not isinstance(data.get(table, []), list):
            raise GpuSheetError(f"{origin}: {table} must be an array of tables ([[{table}]])")
    gpu_lines, model_lines = lines(text, "gpu"), lines(text, "model")
    gpus: list[GpuSpec] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(data.get("gpu", [])):
        where = entry_at(origin, "gpu", gpu_lines, i)
        spec = _gpu(entry, where)
        for n in spec.names():
            if n.casefold() in seen:
                raise GpuSheetError(f"{where}: {n!r} already names an earlier [[gpu]] entry ({seen[n.casefold()]!r})")
            seen[n.casefold()] = spec.model
        gpus.append(spec)
    models: list[ModelPrecision] = []
    for i, entry in enumerate(data.get("model", [])):
        where = entry_at(origin, "model", model_lines, i)
        m = _model(entry, where)
        if any(o.name == m.name for o in models):
            raise GpuSheetError(f"{where}: a second entry for model {m.name!r}")
        models.append(m)
    if not gpus:
        raise GpuSheetError(f"{origin}: no [[gpu]] entries")
    return GpuSheet(str(data.get("name", Path(origin).stem)), origin, tuple(gpus), tuple(models))


def load_sheet(path: str | Path) -> GpuSheet:
    return parse_sheet(read_sheet(path, "GPU sheet", GpuSheetError), str(Path(path)))


def default_sheet() -> GpuSheet:
    text = resources.files("warehouse").joinpath("gpu_sheets/default.toml").read_text()
    return parse_sheet(text, "warehouse/gpu_sheets/default.toml")
