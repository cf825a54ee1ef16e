"""What price sheets and SLO sheets share: TOML files of `[[table]]` entries, versioned by an
`effective` time, every mistake refused with the file and line of the entry it is in."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def lines(text: str, table: str) -> list[int]:
    """Line numbers (1-based) of each `[[table]]` header, in order."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if line.strip().startswith(f"[[{table}]]")]


def entry_at(origin: str, table: str, at: list[int], i: int) -> str:
    """How an error names entry `i` of `[[table]]`."""
    return f"{origin}, line {at[i] if i < len(at) else '?'} ([[{table}]] entry {i + 1})"


def load_toml(text: str, origin: str, error: type[Exception]) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{origin}: not valid TOML: {exc}") from exc


def when(value: Any, where: str, error: type[Exception]) -> datetime:
    """An entry's `effective` time, as naive UTC."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as exc:
            raise error(f"{where}: effective must be an ISO 8601 time, got {value!r}") from exc
    else:
        raise error(f"{where}: effective is missing (an ISO 8601 time, e.g. 2026-12-01T00:00:00Z)")
    return dt.astimezone(UTC).replace(tzinfo=None) if dt.tzinfo else dt


def known(entry: dict[str, Any], keys: set[str], where: str, error: type[Exception]) -> None:
    unknown = set(entry) - keys
    if unknown:
        raise error(f"{where}: unknown keys {sorted(unknown)}; an entry has {sorted(keys)}")


def read_sheet(path: str | Path, what: str, error: type[Exception]) -> str:
    p = Path(path)
    try:
        return p.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror}") from exc
