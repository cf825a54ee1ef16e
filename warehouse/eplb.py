"""The warehouse's EPLB planner entry points: plan on observed load, compare with what is in place.

The placement policies themselves are moemeter/contract/eplb.py (pure numpy, shared with the twin,
whose decode instance rebalances with them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moemeter.contract.eplb import PlanInput, evaluate, plan


def what_if(
    load: np.ndarray, current: np.ndarray, ranks: int, redundant: int, policy: str, groups: int = 1, nodes: int = 1
) -> pd.DataFrame:
    """Predicted per-layer balancedness and max rank load of a new plan on the observed load,
    next to the current placement on the same load."""
    experts = load.shape[1]
    slots = experts + redundant
    slots -= slots % ranks  # every rank holds the same number of slots
    if slots < experts:
        slots += ranks
    cur_load, cur_bal = evaluate(load, current, ranks)
    new = plan(PlanInput(load, slots, groups if experts % groups == 0 else 1, nodes, ranks).validated(), policy)
    return pd.DataFrame(
        {
            "layer": np.arange(load.shape[0]),
            "current_balancedness": cur_bal,
            "planned_balancedness": new.balancedness,
            "current_max_rank_load": cur_load.max(axis=1),
            "planned_max_rank_load": new.rank_load.max(axis=1),
            "slots": slots,
        }
    )
