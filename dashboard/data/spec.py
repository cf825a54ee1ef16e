"""Queries behind the speculative-decoding views (the Speculative decoding page, the Live page's
acceptance length, the DP ranks page's per-engine acceptance, the Cost page's split): the
warehouse's figures (warehouse/spec.py, docs/definitions.md) over a page's window."""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from warehouse.read import Query, Window
from warehouse.spec import KEYS, REJECTED_BASIS, CostSplit, counts, figures, over_time, position_rates
from warehouse.spec import cost_split as split_of

__all__ = ["REJECTED_BASIS", "CostSplit", "Drafting", "cost_split", "drafting", "position_rates"]


class Drafting:
    """One window's spec-decode counts, read once, and the figures a page draws from them."""

    def __init__(self, long: pd.DataFrame) -> None:
        self.long = long

    @property
    def empty(self) -> bool:
        """Nothing drafted in the window: the stack runs without a speculative config, or with one
        and served nothing."""
        drafted = (self.long["metric"] == "vllm:spec_decode_num_drafts_total") & (self.long["delta"] > 0)
        return self.long.empty or not drafted.any()

    def window(self, by: str = "pool") -> pd.DataFrame:
        """The window's figures per pool, instance or engine (warehouse/spec.py's figures)."""
        return figures(self.long, KEYS[by])

    def over_time(self, by: str = "pool", positions: bool = True) -> pd.DataFrame:
        """Per step: the figures per pool, instance or engine (`positions=False`: no position rates)."""
        return over_time(self.long, KEYS[by], positions)

    def cost_split(self, decode_cost_usd: float, generated: float) -> CostSplit | None:
        """The decode pool's $/M output over the window split by its rejected drafts' share."""
        return split_of(self.long, decode_cost_usd, generated)


def drafting(q: Query, w: Window) -> Drafting:
    """The window's spec-decode counts per step."""
    return Drafting(counts(q, w.start, w.end, w.step_seconds))


def cost_split(q: Query, start: datetime, end: datetime, decode_cost_usd: float, generated: float) -> CostSplit | None:
    """The decode pool's $/M output over [start, end) split by its rejected drafts' share of decode
    compute (None: nothing drafted)."""
    return split_of(counts(q, start, end), decode_cost_usd, generated)
