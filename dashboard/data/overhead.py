"""Queries behind the CPU overhead page: where an engine step's time goes (performance engineer).

From the moemeter plugin's families (docs/metrics.md): `moemeter_step_phase_seconds` per phase,
`moemeter_step_seconds` (wall), `moemeter_api_output_seconds`; and vLLM's own request histograms
for the API-server delay. docs/definitions.md: CPU overhead = step wall time - device forward time.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd

from moemeter.contract.families import STEP_PHASES as PHASES

from .live import Query, Window, counters


def step_time(q: Query, w: Window) -> pd.DataFrame:
    """bucket, pool, target, engine, phase ('wall' for the step itself), seconds, steps."""
    return counters(q, "overhead_steps", w)


def per_step(steps: pd.DataFrame, by: tuple[str, ...] = ("bucket", "pool")) -> pd.DataFrame:
    """Mean milliseconds per engine step of each phase, plus `other` (wall not in any phase),
    `overhead` (wall - forward) and the device-idle fraction (1 - forward / wall), grouped `by`."""
    cols = [*by, *PHASES, "other", "wall", "overhead", "idle_fraction", "steps"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    keys = list(by)
    seconds = steps.pivot_table(index=keys, columns="phase", values="seconds", aggfunc="sum").fillna(0.0)
    count = steps[steps["phase"] == "wall"].groupby(keys)["steps"].sum()
    seconds = seconds[seconds.index.isin(count[count > 0].index)]
    if seconds.empty:
        return pd.DataFrame(columns=cols)
    n = count.reindex(seconds.index)
    out = pd.DataFrame(index=seconds.index)
    for p in (*PHASES, "wall"):
        out[p] = 1000.0 * (seconds[p] if p in seconds else 0.0) / n
    out["other"] = (out["wall"] - out[list(PHASES)].sum(axis=1)).clip(lower=0.0)
    out["overhead"] = out["wall"] - out["forward"]
    out["idle_fraction"] = (1.0 - out["forward"] / out["wall"].replace(0.0, np.nan)).clip(0.0, 1.0)
    out["steps"] = n
    return out.reset_index()[cols]


def long_phases(table: pd.DataFrame, by: str = "bucket") -> pd.DataFrame:
    """Stacked-chart form: by, phase, ms per step (phases plus `other`)."""
    if table.empty:
        return pd.DataFrame(columns=[by, "phase", "ms"])
    return table.melt(id_vars=[by], value_vars=[*PHASES, "other"], var_name="phase", value_name="ms")


def api_server_delay(q: Query, w: Window) -> pd.DataFrame:
    """Per bucket, milliseconds a prefill request spends outside the engine before its first
    token: mean TTFT - mean queue time - mean prefill time (each from vLLM's own histograms);
    and the API server's output handling per batch (the plugin's)."""
    cols = ["bucket", "api_delay_ms", "ttft_ms", "queue_ms", "prefill_ms", "api_output_ms"]
    df = counters(q, "overhead_api", w)
    if df.empty:
        return pd.DataFrame(columns=cols)
    wide = df.pivot_table(index="bucket", columns="metric", values="delta", aggfunc="sum")

    def mean_ms(family: str) -> pd.Series:
        s, c = f"{family}_sum", f"{family}_count"
        if s not in wide or c not in wide:
            return pd.Series(np.nan, index=wide.index)
        return 1000.0 * wide[s] / wide[c].where(wide[c] > 0)

    out = pd.DataFrame(
        {
            "ttft_ms": mean_ms("vllm:time_to_first_token_seconds"),
            "queue_ms": mean_ms("vllm:request_queue_time_seconds"),
            "prefill_ms": mean_ms("vllm:request_prefill_time_seconds"),
            "api_output_ms": mean_ms("moemeter_api_output_seconds"),
        }
    )
    out["api_delay_ms"] = (out["ttft_ms"] - out["queue_ms"] - out["prefill_ms"]).clip(lower=0.0)
    return out.reset_index()[cols]


def compare(q: Query, a: tuple[datetime, datetime], b: tuple[datetime, datetime]) -> pd.DataFrame:
    """Per pool and phase: ms per step in window A and B and the change (a deploy's before/after)."""
    rows = []
    for name, (start, end) in (("A", a), ("B", b)):
        w = Window(start, end, max(1, int((end - start).total_seconds())))
        t = per_step(step_time(q, w).assign(bucket=0))
        for r in t.itertuples():
            for p in (*PHASES, "other", "wall", "overhead"):
                rows.append({"pool": r.pool, "phase": p, "window": name, "ms": getattr(r, p)})
    if not rows:
        return pd.DataFrame(columns=["pool", "phase", "A_ms", "B_ms", "change_pct"])
    wide = pd.DataFrame(rows).pivot_table(index=["pool", "phase"], columns="window", values="ms").reset_index()
    for col in ("A", "B"):
        if col not in wide:
            wide[col] = np.nan
    wide["change_pct"] = 100.0 * (wide["B"] - wide["A"]) / wide["A"].where(wide["A"] > 0)
    order = {p: i for i, p in enumerate((*PHASES, "other", "wall", "overhead"))}
    wide = wide.sort_values(["pool", "phase"], key=lambda s: s.map(order) if s.name == "phase" else s)
    return wide.rename(columns={"A": "A_ms", "B": "B_ms"})[["pool", "phase", "A_ms", "B_ms", "change_pct"]]
