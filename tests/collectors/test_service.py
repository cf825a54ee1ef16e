"""The collector loop keeps the warehouse consistent when a write fails."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from collectors.parse import parse_page
from collectors.service import Collector
from moemeter.contract import TargetInfo
from warehouse.db import Warehouse
from warehouse.ingest import Ingestor, ScrapeBatch

T0 = datetime(2026, 11, 30, 12, 0, 0)
TARGET = TargetInfo("decode-0", "http://x/metrics", "decode", 1)


def batch(value: float, at: datetime, extra: str = "") -> ScrapeBatch:
    text = f"# TYPE a_total counter\na_total {value}\n{extra}"
    return ScrapeBatch(TARGET, at, True, 0.0, parse_page(text.encode()))


def test_after_a_failed_write_no_sample_is_orphaned_and_no_increase_is_double_counted(tmp_path):
    (tmp_path / "t.json").write_text(
        json.dumps([{"name": "decode-0", "url": "http://x/metrics", "role": "decode", "gpus": 1}])
    )
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, tmp_path / "t.json")
    c.store([batch(10, T0)])
    # The write fails after the ingestor did its work, inside the transaction, which rolls back.
    original_write = c.ingestor.write_all

    calls = []

    def failing(con, batches):  # fails once, like a full disk that is then cleared
        original_write(con, batches)
        calls.append(batches)
        if len(calls) == 1:
            raise RuntimeError("No space left on device (named fake: a fault this test cannot provoke otherwise)")
        return 0

    c.ingestor.write_all = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="No space left"):
        c.store([batch(20, T0 + timedelta(seconds=5), "# TYPE b_total counter\nb_total 1\n")])
    c.store([batch(30, T0 + timedelta(seconds=10), "# TYPE b_total counter\nb_total 2\n")])
    orphans = wh.query_df("SELECT count(*) AS n FROM samples WHERE series_id NOT IN (SELECT series_id FROM series)")
    assert orphans["n"][0] == 0
    inc = wh.query_df("""SELECT s.metric, i.delta FROM increments i JOIN series s USING (series_id) ORDER BY i.ts""")
    assert inc.to_dict("records") == [{"metric": "a_total", "delta": 20.0}]  # 10 -> 30; nothing from the lost batch
    wh.close()


def test_a_write_held_up_past_the_warning_is_waited_for_and_stored_once(tmp_path, monkeypatch, caplog):
    import threading

    import warehouse.db

    monkeypatch.setattr(warehouse.db, "SLOW_WRITE_SECONDS", 0.2)
    (tmp_path / "t.json").write_text(
        json.dumps([{"name": "decode-0", "url": "http://x/metrics", "role": "decode", "gpus": 1}])
    )
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, tmp_path / "t.json")
    c.store([batch(10, T0)])
    ingestor = c.ingestor
    # A stalled machine, played by a job that holds the writer (named fake: the stall the real
    # stack once caused cannot be provoked on demand) until the round has waited past two warnings.
    release = threading.Event()
    wh.submit(lambda con: release.wait(30))
    stored: list[int] = []
    t = threading.Thread(target=lambda: stored.append(c.store([batch(30, T0 + timedelta(seconds=5))])))
    t.start()
    t.join(0.7)
    assert t.is_alive() and not stored  # still waiting, not given up
    release.set()
    t.join(10)
    assert stored == [1]
    warned = [r.getMessage() for r in caplog.records if "not stored yet" in r.getMessage()]
    assert len(warned) >= 2, warned
    assert warned[0].startswith(f"warehouse {wh.path}: a collector round not stored yet after "), warned
    assert c.ingestor is ingestor  # nothing was thrown away: the round was not lost
    c.store([batch(35, T0 + timedelta(seconds=10))])
    inc = wh.query_df("SELECT i.delta FROM increments i JOIN series s USING (series_id) ORDER BY i.ts")
    assert inc["delta"].tolist() == [20.0, 5.0]
    wh.close()


def _targets_file(tmp_path, *targets: TargetInfo):  # type: ignore[no-untyped-def]
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"name": t.name, "url": t.url, "role": t.role, "gpus": t.gpus} for t in targets]))
    return path


def test_an_input_that_breaks_the_round_is_refused_alone(tmp_path, monkeypatch):
    """Whatever the checks did not foresee (here a named fake: the expert ingestor raising for one
    target, a fault no real input is known to cause any more) costs that target's round only."""
    other = TargetInfo("decode-1", "http://y/metrics", "decode", 1)
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, _targets_file(tmp_path, TARGET, other))
    original = Ingestor.write_all

    def breaks_for_decode_0(self, con, batches):  # type: ignore[no-untyped-def]
        if any(b.target.name == "decode-0" and b.up for b in batches):
            raise ValueError("named fake: an input nobody foresaw")
        return original(self, con, batches)

    monkeypatch.setattr(Ingestor, "write_all", breaks_for_decode_0)
    for k in range(3):
        at = T0 + timedelta(seconds=5 * k)
        text = f"# TYPE a_total counter\na_total {10 * k}\n".encode()
        c.store(
            [ScrapeBatch(TARGET, at, True, 0.0, parse_page(text)), ScrapeBatch(other, at, True, 0.0, parse_page(text))]
        )
    stored = wh.query_df("SELECT target, count(*) AS n FROM readings JOIN series USING (series_id) GROUP BY 1")
    scrapes = wh.query_df("SELECT target, up, error FROM scrapes ORDER BY ts, target")
    rejected = wh.query_df("SELECT target, kind, reason, count FROM rejected")
    wh.close()
    assert stored.values.tolist() == [["decode-1", 3]]  # every round of the other target
    assert [(t, up) for t, up, _ in scrapes.values.tolist()] == [("decode-0", False), ("decode-1", True)] * 3
    assert all("scraped but not stored: ValueError: named fake" in e for t, _, e in scrapes.values if t == "decode-0")
    assert (
        rejected.values.tolist()
        == [["decode-0", "round", "ValueError: named fake: an input nobody foresaw: refused", 1]] * 3
    )
    h = c.health.as_json()
    assert (h["ok"], h["rounds"], h["rounds_failed"], h["targets_not_stored"], h["refused"]) == (True, 3, 0, 3, 3)


def test_a_target_inventing_series_is_bounded_and_its_other_series_kept(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")
    c = Collector(wh, _targets_file(tmp_path, TARGET))
    c.ingestor = Ingestor(max_series=250, max_new_series=100)
    for k in range(5):  # each page: one steady counter and 120 series with new label values
        page = f"# TYPE steady_total counter\nsteady_total {k}\n# TYPE req gauge\n" + "".join(
            f'req{{id="{k}-{i}"}} 1\n' for i in range(120)
        )
        c.store([ScrapeBatch(TARGET, T0 + timedelta(seconds=5 * k), True, 0.0, parse_page(page.encode()))])
    series = wh.query_df("SELECT count(*) AS n FROM series").n[0]
    steady = wh.query_df(
        "SELECT count(*) AS n FROM readings JOIN series USING (series_id) WHERE metric = 'steady_total'"
    )
    rejected = wh.query_df(
        "SELECT reason, sum(count)::INT AS n FROM rejected WHERE kind = 'series' GROUP BY 1 ORDER BY 1"
    )
    wh.close()
    assert series == 250 and steady.n[0] == 5  # capped; the steady series stored every round
    assert rejected.values.tolist() == [
        ["new series over the limit of 100 per round: samples refused until a later round", 21 + 20],
        ["new series over the limit of 250 per target: samples refused", 70 + 120 + 120],
    ]


def test_a_target_name_stored_for_another_stack_is_warned_about(tmp_path, caplog):
    """`--db` shared by the twin and the local CPU stack: both have a decode-0, whose histories
    would mix under one name. Serve says so when it loads such a targets file, once."""
    import logging

    wh = Warehouse(tmp_path / "w.duckdb")
    twin = TargetInfo("decode-0", "http://x/metrics", "decode", 64, stack="deepseek-v4.1-flash")
    Collector(wh, tmp_path / "none.json").store([ScrapeBatch(twin, T0, True, 0.0, [])])
    (tmp_path / "t.json").write_text(
        json.dumps(
            [
                {"name": "decode-0", "url": "http://y/metrics", "role": "decode", "gpus": 1, "stack": "local-cpu"},
                {"name": "prefill-0", "url": "http://z/metrics", "role": "prefill", "gpus": 1, "stack": "local-cpu"},
            ]
        )
    )
    c = Collector(wh, tmp_path / "t.json")
    with caplog.at_level(logging.WARNING, logger="collectors.service"):
        c.refresh_targets()
        c.refresh_targets()  # the same file again: said once
    said = [r.getMessage() for r in caplog.records if "histories mix" in r.getMessage()]
    assert len(said) == 1 and "decode-0 was stack 'deepseek-v4.1-flash'" in said[0] and "'local-cpu'" in said[0]
    wh.close()
