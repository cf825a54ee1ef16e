"""The fleet's cost: each rack's own cost report, read from the lake, and their totals.

A rack's report is the one its own warehouse gives (warehouse/cost.py over the rack's view of the
lake, warehouse/lake.py). The fleet's line adds the racks' lines as they are printed, in cents and
whole tokens, so the fleet's total is the sum of the racks' to the cent; its $/M figures divide
those sums (docs/definitions.md), the cost each rack charges on the report's basis.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .cost import CostReport


def _per_mtok(cost: float, tokens: float) -> float | None:
    return round(cost / (tokens / 1e6), 4) if tokens > 0 else None


@dataclass
class FleetCost:
    start: datetime
    end: datetime
    racks: dict[str, CostReport]
    missing: dict[str, str] = field(default_factory=dict)
    """Racks with nothing counted in the window, and why."""

    def fleet(self) -> dict[str, Any]:
        """The racks' lines added up (cents and whole tokens, as each rack's report prints them)."""
        lines = [r.as_json() for r in self.racks.values()]

        def total(*path: str) -> float:
            out = 0.0
            for d in lines:
                v: Any = d
                for p in path:
                    v = v[p]
                out += v or 0
            return out

        cents = {
            k: round(total(*path) * 100)
            for k, path in {
                "prefill_cost": ("pools", "prefill", "cost_usd"),
                "decode_cost": ("pools", "decode", "cost_usd"),
                "cost": ("total", "cost_usd"),
                "prefill_idle": ("pools", "prefill", "idle_cost_usd"),
                "decode_idle": ("pools", "decode", "idle_cost_usd"),
                "prefill_charged": ("pools", "prefill", "charged_usd"),
                "decode_charged": ("pools", "decode", "charged_usd"),
                "charged": ("total", "charged_usd"),
                "cache_savings": ("total", "cache_savings_usd"),
            }.items()
        }
        computed = int(total("pools", "prefill", "computed_prompt_tokens"))
        prompt = int(total("pools", "prefill", "prompt_tokens"))
        generated = int(total("pools", "decode", "generated_tokens"))
        revenues = [d["total"]["revenue_usd"] for d in lines]
        revenue = None if any(v is None for v in revenues) else round(sum(revenues) * 100)
        return {
            "racks": len(lines),
            "gpus": int(total("pools", "prefill", "gpus") + total("pools", "decode", "gpus")),
            "gpu_hours": round(total("pools", "prefill", "gpu_hours") + total("pools", "decode", "gpu_hours"), 6),
            "cost_usd": cents["cost"] / 100,
            "prefill_cost_usd": cents["prefill_cost"] / 100,
            "decode_cost_usd": cents["decode_cost"] / 100,
            "idle_cost_usd": (cents["prefill_idle"] + cents["decode_idle"]) / 100,
            "prompt_tokens": prompt,
            "cached_prompt_tokens": int(total("pools", "prefill", "cached_prompt_tokens")),
            "computed_prompt_tokens": computed,
            "generated_tokens": generated,
            "basis": lines[0]["basis"] if lines else None,
            "charged_usd": cents["charged"] / 100,
            "cache_savings_usd": cents["cache_savings"] / 100,
            "usd_per_mtok_input": _per_mtok(cents["prefill_charged"] / 100, computed),
            "usd_per_mtok_output": _per_mtok(cents["decode_charged"] / 100, generated),
            "usd_per_mtok_blended": _per_mtok(cents["charged"] / 100, prompt + generated),
            "revenue_usd": None if revenue is None else revenue / 100,
            "margin_usd": None if revenue is None else (revenue - cents["cost"]) / 100,
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "window": {"from": self.start.isoformat() + "Z", "to": self.end.isoformat() + "Z"},
            "fleet": self.fleet(),
            "racks": {name: r.as_json() for name, r in self.racks.items()},
            "racks_without_data": self.missing,
        }

    def as_csv(self) -> str:
        """A row per rack and one for the fleet."""
        out = io.StringIO()
        w = csv.writer(out)
        cols = ["gpu_hours", "cost_usd", "idle_cost_usd", "computed_prompt_tokens", "cached_prompt_tokens"]
        cols += ["generated_tokens", "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended"]
        w.writerow(["rack", *cols])
        for name, r in self.racks.items():
            w.writerow([name, *(_rack_line(r)[c] for c in cols)])
        f = self.fleet()
        w.writerow(["fleet", *(f[c] for c in cols)])
        return out.getvalue()

    def as_text(self) -> str:
        def usd(v: float | None, per: str = "") -> str:
            return "n/a" if v is None else f"${v:,.{4 if per else 2}f}{per}"

        lines = [f"{self.start.isoformat()}Z .. {self.end.isoformat()}Z, {len(self.racks)} racks"]
        rows = [(name, _rack_line(r)) for name, r in self.racks.items()] + [("fleet", self.fleet())]
        for name, d in rows:
            lines.append(
                f"{name:<16} {d['gpu_hours']:>10,.2f} GPU-h {usd(d['cost_usd']):>14} (idle {usd(d['idle_cost_usd'])})  "
                f"{usd(d['usd_per_mtok_input'], '/M in'):>16} {usd(d['usd_per_mtok_output'], '/M out'):>17} "
                f"{usd(d['usd_per_mtok_blended'], '/M blended'):>21}"
            )
        lines += [f"{name:<16} no data: {why}" for name, why in self.missing.items()]
        return "\n".join(lines)


def _rack_line(r: CostReport) -> dict[str, Any]:
    """One rack's report as the fleet's line reads it."""
    d = r.as_json()
    pf, dc, t = d["pools"]["prefill"], d["pools"]["decode"], d["total"]
    return {
        "gpu_hours": round(pf["gpu_hours"] + dc["gpu_hours"], 6),
        "cost_usd": t["cost_usd"],
        "idle_cost_usd": round(pf["idle_cost_usd"] + dc["idle_cost_usd"], 2),
        "computed_prompt_tokens": pf["computed_prompt_tokens"],
        "cached_prompt_tokens": pf["cached_prompt_tokens"],
        "generated_tokens": dc["generated_tokens"],
        "usd_per_mtok_input": pf["usd_per_mtok_input"],
        "usd_per_mtok_output": dc["usd_per_mtok_output"],
        "usd_per_mtok_blended": t["usd_per_mtok_blended"],
    }
