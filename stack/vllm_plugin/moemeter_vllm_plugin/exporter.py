"""The API server's side: a Prometheus collector over every process's totals (on the registry
vLLM serves at /metrics), and the snapshot for /moemeter/experts."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from .state import Merged, Window, families, read_states, snapshot

_installed = False
_lock = threading.Lock()


class PluginCollector:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.window = Window()

    def collect(self) -> Any:
        from prometheus_client.core import Metric

        merged = Merged.of(read_states(self.directory))
        if not merged.model_name:
            return  # nothing measured yet: no series rather than empty ones
        with _lock:
            self.window.advance(merged)
            fams = families(merged, self.window)
        for name, kind, doc, samples in fams:
            metric = Metric(name[: -len("_total")] if kind == "counter" else name, doc, kind)
            for sample_name, labels, value in samples:
                metric.add_sample(sample_name, labels, value)
            yield metric


def install(directory: Path) -> None:
    global _installed
    if _installed:
        return
    from prometheus_client import REGISTRY

    REGISTRY.register(PluginCollector(directory))
    _installed = True


def experts_snapshot(directory: Path) -> dict[str, object] | None:
    merged = Merged.of(read_states(directory))
    return snapshot(merged, time.time()) if merged.logical_matrix() else None
