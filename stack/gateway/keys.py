"""API keys -> tenants. The keys file holds SHA-256 hashes of keys, never the keys themselves.

    {"require_key": true,
     "keys": [{"sha256": "<hex of sha256(key)>", "tenant": "acme"}]}

`moemeter gateway --hash-key` reads a key on stdin and prints its entry. A request's user is a user
of its key's tenant (the body's `user` names one within it), so no key can name another tenant's
users; "anonymous", the tenant of requests without a key, is no key's tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import ANONYMOUS

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class KeysError(MoemeterError, ValueError):
    """The keys file is missing or malformed."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Keys:
    require_key: bool = False
    tenants: dict[str, str] = field(default_factory=dict)  # sha256 hex -> tenant

    def tenant_for(self, key: str | None) -> str | None:
        """The key's tenant; None for an unknown or missing key."""
        if not key:
            return None
        digest = hash_key(key)
        for known, tenant in self.tenants.items():
            if hmac.compare_digest(known, digest):
                return tenant
        return None


def load_keys(path: str | Path) -> Keys:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise KeysError(f"cannot read keys file {p}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise KeysError(f"{p}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("keys", []), list):
        raise KeysError(f'{p}: expected {{"require_key": bool, "keys": [{{"sha256", "tenant"}}, ...]}}')
    require = data.get("require_key", False)
    if not isinstance(require, bool):
        raise KeysError(f"{p}: require_key must be true or false")
    tenants: dict[str, str] = {}
    for i, entry in enumerate(data.get("keys", [])):
        if not isinstance(entry, dict):
            raise KeysError(f"{p}: keys[{i}] must be an object with sha256 and tenant")
        digest, tenant = entry.get("sha256"), entry.get("tenant")
        if not isinstance(digest, str) or not _HEX64.match(digest):
            raise KeysError(f"{p}: keys[{i}].sha256 must be 64 lowercase hex digits (a hash, not the key)")
        if not isinstance(tenant, str) or not tenant:
            raise KeysError(f"{p}: keys[{i}].tenant must be a non-empty string")
        if tenant == ANONYMOUS:
            raise KeysError(f"{p}: keys[{i}].tenant {ANONYMOUS!r} is the tenant of requests without a key")
        if digest in tenants:
            raise KeysError(f"{p}: keys[{i}] repeats a key already given to {tenants[digest]!r}")
        tenants[digest] = tenant
    if require and not tenants:
        raise KeysError(f"{p}: require_key is true but no keys are listed")
    return Keys(require, tenants)
