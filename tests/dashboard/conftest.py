"""A sick rack in a real warehouse, for the banner's alerts and the DP ranks page: the twin with a
straggler, failing NIXL transfers and a full KV cache on three decode engines, its prefill and
decode endpoints scraped every 10 s for 8 minutes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from collectors.parse import PageCache
from moemeter.contract import TargetInfo
from stack.twin.config import load_profile
from stack.twin.faults import Fault
from stack.twin.server import Twin
from warehouse.api import LocalQuery
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch

from .sick_rack import FAULTS, ROUNDS, START, T0


@pytest.fixture(scope="session")
def sick_rack(tmp_path_factory):
    wh = Warehouse(tmp_path_factory.mktemp("sick") / "w.duckdb")
    faults = tuple(map(Fault.parse, FAULTS))
    twin = Twin(
        load_profile("deepseek-v4.1-flash"), seed=6, start=START - 60, tick=0.5, faults=faults
    )  # 0.5 s ticks: 5x faster
    twin.pages(START)  # builds the model
    assert twin.model is not None
    pools = [e for e in twin.endpoints() if e.role in ("prefill", "decode")]
    ing, caches = Ingestor(), {e.name: PageCache() for e in pools}  # as a collector keeps them
    for k in range(ROUNDS):
        twin.model.advance(START + 10 * k)
        for e in pools:
            t = TargetInfo(e.name, f"http://twin/{e.name}", e.role, e.gpus, "twin:test", e.hostname)
            batch = ScrapeBatch(
                t, T0 + timedelta(seconds=10 * k), True, 0.01, caches[e.name].parse(e.render().encode())
            )
            wh.write(lambda con, b=batch: ing.write(con, b))
    yield wh
    wh.close()


@pytest.fixture(scope="session")
def sick(sick_rack):
    return LocalQuery(sick_rack.cursor())


@pytest.fixture(scope="session")
def sick_api(sick_rack):
    from warehouse.api import QueryServer

    api = QueryServer(sick_rack)
    api.start()
    yield api.url
    api.shutdown()
