"""A targets file is validated entry by entry, with the entry and the reason in the error."""

from __future__ import annotations

import json

import pytest

from collectors.targets import TargetsError, load_targets

GOOD = {"name": "decode-0", "url": "http://127.0.0.1:9/metrics", "role": "decode", "gpus": 64}


def test_good_file_loads(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps([GOOD, {**GOOD, "name": "tray", "role": "gpu", "gpus": 4, "hostname": "h"}]))
    ts = load_targets(p)
    assert [(t.name, t.role, t.gpus, t.hostname) for t in ts] == [
        ("decode-0", "decode", 64, ""),
        ("tray", "gpu", 4, "h"),
    ]


@pytest.mark.parametrize(
    "data,match",
    [
        ({"name": "x"}, "expected a JSON list"),
        ([{"name": "x"}], r"missing \['url', 'role', 'gpus'\]"),
        ([{**GOOD, "role": "cache"}], "role must be one of"),
        ([{**GOOD, "gpus": -1}], "gpus must be a non-negative integer"),
        ([{**GOOD, "gpus": True}], "gpus must be a non-negative integer"),
        ([{**GOOD, "url": "ftp://x"}], "url must start with http"),
        ([GOOD, GOOD], "duplicate target name"),
    ],
)
def test_bad_entries_are_refused(tmp_path, data, match):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    with pytest.raises(TargetsError, match=match):
        load_targets(p)


def test_missing_and_non_json_files(tmp_path):
    with pytest.raises(TargetsError, match="cannot read targets file"):
        load_targets(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(TargetsError, match="not valid JSON"):
        load_targets(tmp_path / "bad.json")
