"""The fast-forward's twin in a process of its own: the same rounds as the twin in this process,
and its failures said, not hung on."""

from __future__ import annotations

import pytest

from moemeter.contract.requests import ColumnPage
from stack.twin.config import load_profile
from stack.twin.rounds import TwinProcessError, TwinRounds
from stack.twin.server import WARMUP_SECONDS, Twin

START = 1_780_000_000.0


@pytest.fixture(scope="module")
def profile():
    return load_profile("deepseek-v4.1-flash").with_workload(agents=400)


def test_the_rounds_are_the_twins_own_pages_snapshots_and_feed(profile):
    times = [START, START + 15, START + 30]
    with TwinRounds(profile, times, seed=5, tick=1.0, snapshot_every=2) as twin:
        rounds = list(twin)
        targets = twin.targets
    here = Twin(profile, seed=5, start=START - WARMUP_SECONDS, tick=1.0)
    here.pages(START)
    assert here.model is not None
    endpoints = here.endpoints()
    assert [(t.name, t.role, t.gpus, t.hostname) for t in targets] == [
        (e.name, e.role, e.gpus, e.hostname) for e in endpoints
    ]
    snapshots = {e.name: e.snapshot for e in endpoints if e.snapshot is not None}
    assert list(snapshots) == ["decode-0"]
    feed, after = here.model.gateway, 0
    for k, (at, r) in enumerate(zip(times, rounds, strict=True)):
        assert r.at == at
        assert r.pages == here.pages(at)
        assert r.snapshots == ({name: take() for name, take in snapshots.items()} if k % 2 == 0 else {})
        page = feed.column_page(after)
        after = page["next"]
        assert len(r.feed["fields"]["seq"]) == len(page["fields"]["seq"]) > 0  # type: ignore[index]
        # the same requests; only the log's id, new with each twin, differs
        assert type(r.feed) is ColumnPage
        assert {**r.feed, "log_id": None} == {**page, "log_id": None}
        assert str(r.feed["log_id"]).startswith("twin-seed-5-")


def test_a_twin_that_fails_says_why(profile):
    with pytest.raises(TwinProcessError, match=r"(?s)failed:\n.*IndexError: list index out of range"):
        TwinRounds(profile, [], seed=5, tick=1.0)


def test_a_twin_process_that_dies_is_said_to_have_ended_early(profile):
    with TwinRounds(profile, [START, START + 15], seed=5, tick=1.0) as twin:
        twin._child.kill()
        with pytest.raises(TwinProcessError, match=r"ended early \(exit code -9\)"):
            list(twin)
