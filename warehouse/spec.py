"""Speculative decoding: what a decode step buys, from vLLM's own spec-decode counters
(docs/definitions.md, Speculative decoding). Every figure is a ratio of the counters' increases over
one window, summed first and divided once, as vLLM's SpecDecodingLogging and `vllm bench serve` do,
so a window's figure equals theirs over the same span (tests/integration/test_localstack_spec.py).

- acceptance rate = accepted tokens / draft tokens
- mean acceptance length = 1 + accepted tokens / drafts (the bonus token included, vLLM's convention)
- acceptance at position i = drafts whose token i was accepted / drafts
- rejected drafts = draft tokens - accepted tokens; their share of decode compute =
  rejected / (generated + rejected): the positions the target model verified in vain among all it
  verified, an estimate on REJECTED_BASIS.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from .read import Query, increases

BY = ("pool", "instance", "engine")
"""What `moemeter report spec --by` groups a window's figures by."""
KEYS = {"pool": ["role"], "instance": ["role", "target"], "engine": ["role", "target", "engine"]}
COUNTS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
    "vllm:generation_tokens_total": "generated_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
FIGURES = ["acceptance_rate", "mean_acceptance_length", "rejected_tokens", "rejected_share"]
POSITIONS = 64
"""Draft positions read (labels 0..63): vLLM drafts a handful of tokens a step (the reference
launch 3); a page naming a position past it, or one that is not a whole number, is not read."""
REJECTED_BASIS = (
    "every position the target model verifies in a decode step costs the same share of the step "
    "(the drafts ride in the bonus token's forward pass); the draft stage's own passes are not in "
    "vLLM's counters and are left out"
)
"""What the rejected drafts' share of decode compute (and of $/M output) is estimated on."""


def counts(q: Query, start: datetime, end: datetime, step_seconds: float | None = None) -> pd.DataFrame:
    """warehouse/sql/spec_counts.sql over [start, end): long form, a row per step, target, engine,
    counter and position (step None: one step, the whole window)."""
    df = increases(q, "spec_counts", start, end, step_seconds, {"positions": POSITIONS})
    df["engine"] = df["engine"].astype(str)
    return df


def _safe(num: pd.Series, den: pd.Series) -> pd.Series:
    return num / den.where(den > 0)


def figures(long: pd.DataFrame, keys: list[str], positions: bool = True) -> pd.DataFrame:
    """The window's counts summed by `keys` and their ratios (module doc): columns drafts,
    draft_tokens, accepted_tokens, generated_tokens, FIGURES, and `position_rates` (a list per row,
    position 0 first; NaN at a position the row has no series for, as an engine drafting fewer
    tokens than another; None for every row with `positions=False`, which skips them: half the
    time of a day's steps per engine). No rows where nothing drafted."""
    columns = [*keys, *COUNTS.values(), *FIGURES, "position_rates"]
    if long.empty:
        return pd.DataFrame(columns=columns)
    known = long[long["metric"].isin(list(COUNTS))]
    wide = known.pivot_table(index=keys, columns="metric", values="delta", aggfunc="sum", fill_value=0.0)
    wide = wide.rename(columns=COUNTS).reindex(columns=list(COUNTS.values()), fill_value=0.0)
    wide = wide[wide["drafts"] > 0]
    wide["acceptance_rate"] = _safe(wide["accepted_tokens"], wide["draft_tokens"])
    wide["mean_acceptance_length"] = 1.0 + _safe(wide["accepted_tokens"], wide["drafts"])
    wide["rejected_tokens"] = (wide["draft_tokens"] - wide["accepted_tokens"]).clip(lower=0.0)
    wide["rejected_share"] = _safe(wide["rejected_tokens"], wide["generated_tokens"] + wide["rejected_tokens"])
    if not positions:
        wide["position_rates"] = None
        return wide.reset_index()[columns]
    per_pos = long[long["metric"] == PER_POSITION]
    by_pos = per_pos.pivot_table(index=keys, columns="position", values="delta", aggfunc="sum")
    drafted = range(int(per_pos["position"].max()) + 1) if len(per_pos) else range(0)
    by_pos = by_pos.reindex(index=wide.index, columns=drafted)  # list index = position; NaN: no such series
    rates = by_pos.to_numpy() / wide["drafts"].to_numpy()[:, None]
    wide["position_rates"] = [list(r) for r in rates] if len(wide) else []
    return wide.reset_index()[columns]


def over_time(long: pd.DataFrame, keys: list[str], positions: bool = True) -> pd.DataFrame:
    """figures() per step (`bucket`) and `keys`."""
    fig = figures(long, ["bucket", *keys], positions)
    return fig.sort_values(["bucket", *keys], kind="stable").reset_index(drop=True)


def position_rates(fig: pd.DataFrame) -> pd.DataFrame:
    """Long form of figures()'s per-position rates: keys, position (0-based), rate."""
    rows = fig.drop(columns=[c for c in fig.columns if c in (*COUNTS.values(), *FIGURES)])
    rows = rows.explode("position_rates").rename(columns={"position_rates": "rate"})
    rows["position"] = rows.groupby(level=0).cumcount()
    return rows.dropna(subset=["rate"]).astype({"rate": float}).reset_index(drop=True)


@dataclass(frozen=True)
class CostSplit:
    """The decode pool's $/M output tokens, split into what accepted output costs and what the
    rejected drafts' share of decode compute costs (module doc: the estimate and its basis)."""

    decode_cost_usd: float
    generated_tokens: float
    rejected_share: float

    @property
    def usd_per_mtok_output(self) -> float | None:
        return self.decode_cost_usd / (self.generated_tokens / 1e6) if self.generated_tokens > 0 else None

    def parts(self) -> dict[str, float | None]:
        whole = self.usd_per_mtok_output
        if whole is None or np.isnan(self.rejected_share):
            return {"usd_per_mtok_output": whole, "accepted_output": None, "rejected_drafts": None}
        return {
            "usd_per_mtok_output": whole,
            "accepted_output": whole * (1.0 - self.rejected_share),
            "rejected_drafts": whole * self.rejected_share,
        }


@dataclass(frozen=True)
class SpecReport:
    """`moemeter report spec`: the window's figures grouped by pool, instance or engine."""

    start: datetime
    end: datetime
    by: str
    rows: pd.DataFrame
    cost: CostSplit | None = None

    def as_json(self) -> dict[str, Any]:
        rows = []
        for r in self.rows.to_dict("records"):
            row: dict[str, Any] = {"pool": r["role"]}
            if "target" in r:
                row["instance"] = r["target"]
            if "engine" in r:
                row["engine"] = r["engine"]
            row.update({k: int(round(r[k])) for k in (*COUNTS.values(), "rejected_tokens")})
            row.update({k: _ratio(r[k]) for k in ("acceptance_rate", "mean_acceptance_length", "rejected_share")})
            row["position_rates"] = [_ratio(x) for x in r["position_rates"]]
            rows.append(row)
        out: dict[str, Any] = {
            "window": {"from": self.start.isoformat() + "Z", "to": self.end.isoformat() + "Z"},
            "by": self.by,
            "rows": rows,
            "rejected_share_basis": REJECTED_BASIS,
        }
        if self.cost is not None:
            out["decode_cost"] = {
                "cost_usd": round(self.cost.decode_cost_usd, 2),
                "generated_tokens": int(round(self.cost.generated_tokens)),
                **{k: _usd(v) for k, v in self.cost.parts().items()},
            }
        return out

    def as_csv(self) -> str:
        data, out = self.as_json(), io.StringIO()
        positions = max((len(r["position_rates"]) for r in data["rows"]), default=0)
        head = ["pool", "instance", "engine", *COUNTS.values(), "rejected_tokens"]
        head += ["acceptance_rate", "mean_acceptance_length", "rejected_share"]
        w = csv.writer(out)
        w.writerow(head + [f"position_{i}_rate" for i in range(positions)])
        for r in data["rows"]:
            rates = r["position_rates"] + [None] * (positions - len(r["position_rates"]))
            w.writerow([r.get(k, "") for k in head] + rates)
        return out.getvalue()

    def as_text(self) -> str:
        lines = [f"Speculative decoding, {self.start:%Y-%m-%d %H:%M} to {self.end:%Y-%m-%d %H:%M} UTC, by {self.by}"]
        for r in self.as_json()["rows"]:
            name = " ".join(str(r[k]) for k in ("pool", "instance", "engine") if k in r)
            rates = ", ".join("—" if x is None else f"{x:.3f}" for x in r["position_rates"])
            lines.append(
                f"  {name}: mean acceptance length {r['mean_acceptance_length']:.2f}, "
                f"acceptance rate {_percent(r['acceptance_rate'])}, "
                f"{r['accepted_tokens']:,} of {r['draft_tokens']:,} draft tokens accepted in {r['drafts']:,} drafts, "
                f"per position {rates}; rejected drafts {_percent(r['rejected_share'])} of decode compute"
            )
        if not self.as_json()["rows"]:
            lines.append("  no speculative decoding counted in the window")
        if self.cost is not None:
            parts = self.cost.parts()
            if parts["rejected_drafts"] is not None:
                lines.append(
                    f"  decode ${parts['usd_per_mtok_output']:,.4f}/M output tokens: ${parts['accepted_output']:,.4f} "
                    f"accepted output, ${parts['rejected_drafts']:,.4f} rejected drafts (estimate)"
                )
        return "\n".join(lines)


def _percent(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def _ratio(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else round(float(v), 6)


def _usd(v: float | None) -> float | None:
    return None if v is None else round(v, 6)


def spec_report(
    q: Query, start: datetime, end: datetime, by: str = "pool", decode_cost_usd: float | None = None
) -> SpecReport:
    """The window's figures by `by` (BY); with the decode pool's cost, its $/M output split."""
    if by not in BY:
        raise ValueError(f"--by must be one of {', '.join(BY)}, not {by!r}")
    long = counts(q, start, end)
    cost = None if decode_cost_usd is None else cost_split(long, decode_cost_usd)
    return SpecReport(start, end, by, figures(long, KEYS[by]), cost)


def cost_split(long: pd.DataFrame, decode_cost_usd: float, generated: float | None = None) -> CostSplit | None:
    """The decode pool's cost over the window of `long` (counts) split by its rejected drafts' share of
    decode compute, per `generated` output tokens (default: the pool's counter); None where it drafted
    nothing."""
    pool = figures(long[long["role"] == "decode"], ["role"])
    if pool.empty:
        return None
    tokens = float(pool["generated_tokens"].iloc[0]) if generated is None else generated
    return CostSplit(decode_cost_usd, tokens, float(pool["rejected_share"].iloc[0]))
