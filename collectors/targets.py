"""Read a targets file: the JSON list of endpoints to scrape, with role and GPU count.

The twin writes the same format (`moemeter twin --targets-out`), and so can an operator.
"""

from __future__ import annotations

import json
from pathlib import Path

from moemeter.contract import ROLES, TargetInfo
from moemeter.contract.columns import clean_text
from moemeter.contract.errors import MoemeterError


class TargetsError(MoemeterError, ValueError):
    """The targets file is missing or does not describe targets."""


def parse_targets(data: object, where: str = "targets") -> list[TargetInfo]:
    if not isinstance(data, list):
        raise TargetsError(f"{where}: expected a JSON list of targets, got {type(data).__name__}")
    out: list[TargetInfo] = []
    names: set[str] = set()
    for i, entry in enumerate(data):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise TargetsError(f"{at}: expected an object with name, url, role, gpus")
        missing = [k for k in ("name", "url", "role", "gpus") if k not in entry]
        if missing:
            raise TargetsError(f"{at}: missing {missing}")
        name, url, role, gpus = entry["name"], entry["url"], entry["role"], entry["gpus"]
        if not isinstance(name, str) or not name:
            raise TargetsError(f"{at}: name must be a non-empty string")
        if name in names:
            raise TargetsError(f"{at}: duplicate target name {name!r}")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise TargetsError(f"{at} ({name}): url must start with http:// or https://, got {url!r}")
        if role not in ROLES:
            raise TargetsError(f"{at} ({name}): role must be one of {list(ROLES)}, got {role!r}")
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise TargetsError(f"{at} ({name}): gpus must be a non-negative integer, got {gpus!r}")
        texts = [name, url, str(entry.get("stack", "")), str(entry.get("hostname", ""))]
        if any(clean_text(t) is not t for t in texts):
            raise TargetsError(f"{at}: name, url, stack and hostname must be valid UTF-8 (a lone surrogate escape?)")
        names.add(name)
        out.append(
            TargetInfo(
                name=name,
                url=url,
                role=role,
                gpus=gpus,
                stack=str(entry.get("stack", "")),
                hostname=str(entry.get("hostname", "")),
            )
        )
    return out


def load_targets(path: str | Path) -> list[TargetInfo]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TargetsError(f"cannot read targets file {p}: {exc.strerror}") from exc
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise TargetsError(f"{p}: not valid JSON: {exc}") from exc
    return parse_targets(data, str(p))
