"""The keys file: hashes only, each mistake named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stack.gateway.keys import KeysError, hash_key, load_keys


def write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "keys.json"
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_a_key_maps_to_its_tenant(tmp_path: Path) -> None:
    keys = load_keys(write(tmp_path, {"require_key": True, "keys": [{"sha256": hash_key("sk-a"), "tenant": "a"}]}))
    assert keys.require_key and keys.tenant_for("sk-a") == "a"
    assert keys.tenant_for("sk-b") is None and keys.tenant_for(None) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{nope", "not valid JSON"),
        ([1], "expected"),
        ({"require_key": "yes"}, "require_key must be true or false"),
        ({"keys": [{"sha256": "sk-plain", "tenant": "a"}]}, "a hash, not the key"),
        ({"keys": [{"sha256": hash_key("x")}]}, "tenant must be a non-empty string"),
        ({"keys": [{"sha256": hash_key("x"), "tenant": "a"}, {"sha256": hash_key("x"), "tenant": "b"}]}, "repeats"),
        ({"require_key": True, "keys": []}, "no keys are listed"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(KeysError, match=message):
        load_keys(write(tmp_path, data))


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KeysError, match="cannot read keys file"):
        load_keys(tmp_path / "none.json")
