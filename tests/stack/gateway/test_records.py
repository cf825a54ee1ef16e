"""A request record's JSON is its dataclass's fields, as `asdict` gives them; the log keeps its days."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, fields

import pytest

from moemeter.contract.requests import RequestRecord
from stack.gateway import records
from stack.gateway.records import RecordLog

time_monotonic = time.monotonic


def test_a_record_gives_every_field_as_asdict_does():
    values = {
        f.name: (f"{f.name}-x" if f.type == "str" else 3.5 if "float" in str(f.type) else 7)
        for f in fields(RequestRecord)
    }
    values |= {"stream": True, "usage_reported": True}
    record = RequestRecord(**values)  # type: ignore[arg-type]
    got = record.to_json()
    assert got == asdict(record) and list(got) == [f.name for f in fields(RequestRecord)]
    assert json.loads(json.dumps(got)) == got  # plain values only
    got["user"] = "someone else"
    assert record.user == "user-x"  # a copy


def _record(request_id: str, started_at: float) -> RequestRecord:
    return RequestRecord(request_id, started_at, "u", "anonymous", "m", "completions", False, 200, "ok")


def _ids(log: RecordLog) -> list[str]:
    return [r["request_id"] for r in log.page(0, 100)["records"]]  # type: ignore[index, union-attr]


def test_records_past_their_days_are_dropped_at_the_first_write_on_a_host_just_booted(tmp_path, monkeypatch):
    """The hourly prune runs at the writer's first batch too, whatever the host's uptime (its
    monotonic clock starts near 0 at boot); records younger than the log's days stay."""
    now = time.time()
    old = RecordLog(tmp_path / "gw.sqlite", keep_seconds=math.inf, batch_seconds=0.0)
    old.append(_record("eight-days-old", now - 8 * 86400))
    old.append(_record("six-days-old", now - 6 * 86400))
    old.close()
    booted = time.monotonic()
    monkeypatch.setattr(records.time, "monotonic", lambda: time_monotonic() - booted)
    log = RecordLog(tmp_path / "gw.sqlite", keep_seconds=7 * 86400, batch_seconds=0.0)
    log.append(_record("now", now))
    log.close()
    assert _ids(log) == ["six-days-old", "now"]


@pytest.mark.parametrize("keep", [0.0, -1.0, math.nan])
def test_a_log_kept_for_no_time_is_refused_and_no_file_made(tmp_path, keep):
    with pytest.raises(ValueError, match="more than 0 seconds"):
        RecordLog(tmp_path / "gw.sqlite", keep_seconds=keep)
    assert not (tmp_path / "gw.sqlite").exists()
