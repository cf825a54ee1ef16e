"""A request record's JSON is its dataclass's fields, as `asdict` gives them."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

from moemeter.contract.requests import RequestRecord


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
