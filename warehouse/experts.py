"""Per-expert snapshots into the warehouse: increases of the logical-expert counters between
snapshots, the placement whenever it changes, and rebalance events (once each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb
import numpy as np
import pyarrow as pa

from moemeter.contract.errors import MoemeterError

from .db import insert_arrow
from .sql import sql


class SnapshotError(MoemeterError, ValueError):
    """A snapshot body does not follow schema moemeter.experts/1."""


@dataclass(frozen=True)
class RebalanceEvent:
    at: datetime
    duration_seconds: float
    moved_replicas: int
    balancedness_before: list[float]
    balancedness_planned: list[float]


@dataclass(frozen=True)
class ExpertSnapshot:
    logical_tokens_total: np.ndarray  # [layers, experts] cumulative
    phy2log: np.ndarray  # [layers, slots]
    ranks: int
    rebalances: list[RebalanceEvent] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: object) -> ExpertSnapshot:
        if not isinstance(data, dict) or data.get("schema") != "moemeter.experts/1":
            raise SnapshotError("not a moemeter.experts/1 snapshot")
        try:
            load = np.asarray(data["logical_tokens_total"], dtype=np.float64)
            phy2log = np.asarray(data["phy2log"], dtype=np.int64)
            ranks = int(data["ranks"])
            events = [
                RebalanceEvent(
                    datetime.fromtimestamp(float(r["time"]), UTC).replace(tzinfo=None),
                    float(r["duration_seconds"]),
                    int(r["moved_replicas"]),
                    [float(x) for x in r["balancedness_before"]],
                    [float(x) for x in r["balancedness_planned"]],
                )
                for r in data.get("rebalances", [])
            ]
        except (KeyError, TypeError, ValueError, OverflowError, OSError) as exc:  # OSError: a time out of range
            raise SnapshotError(f"malformed snapshot: {exc}") from exc
        layers = load.shape[0] if load.ndim == 2 else -1
        if load.ndim != 2 or phy2log.ndim != 2 or phy2log.shape[0] != layers or layers == 0:
            raise SnapshotError(f"matrix shapes disagree: load {load.shape}, phy2log {phy2log.shape}")
        if ranks <= 0 or phy2log.shape[1] % ranks:
            raise SnapshotError(f"{phy2log.shape[1]} slots do not divide over {ranks} ranks")
        if not np.isfinite(load).all() or (load < 0).any():
            raise SnapshotError("expert token counters must be finite and non-negative")
        if ((phy2log < 0) | (phy2log >= load.shape[1])).any():
            raise SnapshotError("phy2log names an expert that does not exist")
        if any(not 0 <= ev.moved_replicas < 2**31 or not np.isfinite(ev.duration_seconds) for ev in events):
            raise SnapshotError("a rebalance's moved_replicas or duration_seconds is out of range")
        return cls(load, phy2log, ranks, events)


class ExpertIngestor:
    def __init__(self) -> None:
        self._last: dict[str, tuple[datetime, np.ndarray]] = {}
        self._placement: dict[str, np.ndarray] = {}
        self._events_until: dict[str, datetime] = {}  # latest rebalance stored, per target

    def write(self, con: duckdb.DuckDBPyConnection, target: str, ts: datetime, snap: ExpertSnapshot) -> int:
        """Store one snapshot inside the caller's transaction; returns expert_load rows written."""
        layers, experts = snap.logical_tokens_total.shape
        prev = self._last.get(target)
        seconds = reset = None
        rows = 0
        if prev is not None and ts > prev[0] and prev[1].shape == snap.logical_tokens_total.shape:
            delta = snap.logical_tokens_total - prev[1]
            reset = bool((delta < 0).any())
            if reset:  # a restarted engine: its counters start again from zero
                delta = snap.logical_tokens_total
            seconds = (ts - prev[0]).total_seconds()
            layer_idx, expert_idx = np.indices(delta.shape)
            insert_arrow(
                con,
                "expert_load",
                {
                    "ts": pa.array([ts] * delta.size, type=pa.timestamp("us")),
                    "target": pa.array([target] * delta.size, type=pa.string()),
                    "layer": pa.array(layer_idx.ravel(), type=pa.int16()),
                    "expert": pa.array(expert_idx.ravel(), type=pa.int16()),
                    "tokens": pa.array(delta.ravel(), type=pa.float64()),
                },
            )
            rows = delta.size
        if prev is None or ts > prev[0]:
            self._last[target] = (ts, snap.logical_tokens_total)
        shape = {"layers": layers, "experts": experts, "slots": snap.phy2log.shape[1], "ranks": snap.ranks}
        con.execute(
            sql("experts_snapshot_store"),
            {"ts": ts, "target": target, "seconds": seconds, **shape, "reset": bool(reset)},
        )
        self._store_placement(con, target, ts, snap)
        self._store_rebalances(con, target, snap.rebalances)
        return rows

    def _store_rebalances(self, con: duckdb.DuckDBPyConnection, target: str, events: list[RebalanceEvent]) -> None:
        """Only the events newer than the last one stored: a snapshot repeats the recent ones every time."""
        if target not in self._events_until:
            row = con.execute(sql("experts_rebalances_until"), {"target": target}).fetchall()
            self._events_until[target] = row[0][0] if row and row[0][0] is not None else datetime.min
        new = [ev for ev in events if ev.at > self._events_until[target]]
        if not new:
            return
        rows = [
            (ev.at, ev.duration_seconds, ev.moved_replicas, layer, before, planned)
            for ev in new
            for layer, (before, planned) in enumerate(zip(ev.balancedness_before, ev.balancedness_planned))
        ]
        cols = list(zip(*rows))
        batch = {
            "ts": pa.array(cols[0], type=pa.timestamp("us")),
            "target": pa.array([target] * len(rows), type=pa.string()),
            "duration_seconds": pa.array(cols[1], type=pa.float64()),
            "moved_replicas": pa.array(cols[2], type=pa.int32()),
            "layer": pa.array(cols[3], type=pa.int16()),
            "balancedness_before": pa.array(cols[4], type=pa.float64()),
            "balancedness_planned": pa.array(cols[5], type=pa.float64()),
        }
        insert_arrow(con, "eplb_rebalances", batch, "experts_rebalances_store")  # events stored already kept
        self._events_until[target] = max(ev.at for ev in new)

    def _store_placement(self, con: duckdb.DuckDBPyConnection, target: str, ts: datetime, snap: ExpertSnapshot) -> None:
        known = self._placement.get(target)
        if known is None:  # after a restart: the latest placement stored for this target
            df = con.execute(sql("experts_placement_latest"), {"target": target}).df()
            rows, cols = snap.phy2log.shape
            if len(df) == rows * cols and df["layer"].max() < rows and df["slot"].max() < cols:
                known = np.full((rows, cols), -1, dtype=np.int64)
                known[df["layer"].to_numpy(), df["slot"].to_numpy()] = df["expert"].to_numpy()
        if known is not None and known.shape == snap.phy2log.shape and (known == snap.phy2log).all():
            return
        layer_idx, slot_idx = np.indices(snap.phy2log.shape)
        per_rank = snap.phy2log.shape[1] // snap.ranks
        n = snap.phy2log.size
        insert_arrow(
            con,
            "expert_placement",
            {
                "ts": pa.array([ts] * n, type=pa.timestamp("us")),
                "target": pa.array([target] * n, type=pa.string()),
                "layer": pa.array(layer_idx.ravel(), type=pa.int16()),
                "slot": pa.array(slot_idx.ravel(), type=pa.int16()),
                "rank": pa.array(slot_idx.ravel() // per_rank, type=pa.int16()),
                "expert": pa.array(snap.phy2log.ravel(), type=pa.int16()),
            },
        )
        self._placement[target] = snap.phy2log.copy()
