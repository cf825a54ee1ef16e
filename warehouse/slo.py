"""SLO sheets: service classes with latency targets and an objective, and which users and tenants
belong to which class, versioned by effective time like price sheets (warehouse/slo_sheets/
default.toml is the default).

A class has targets for time to first token (`ttft_ms`), mean inter-token latency (`itl_ms`, or
`tokens_per_second_per_user`, its inverse) and end-to-end latency (`e2e_ms`), any of them; an
objective (the share of requests that must meet every target, e.g. 0.99) over a period
(`period_days`, 30 unless said). One class is the default: requests of users and tenants assigned
to none. A user is a user of a tenant (the gateway's `user` field names a user within the API
key's tenant): a user's assignment names both, `user = "alice"` and `tenant = "acme"`, and one
without a tenant (a sheet written before tenants) names that user of the tenant "anonymous", the
requests without a key. A user's own assignment wins over their tenant's. A request's own targets
(the gateway's SLO headers) only tighten its class's, unless the class says `own_targets = true`.
Loading a sheet into the warehouse (`moemeter slo load`) only adds versions: an entry already
stored with other values is refused, and so is a new entry effective before the newest request
stored (it would change attainment already rolled up), so past attainment never changes. The
default sheet is stored with the first request records when none was loaded before. Every mistake
is refused with the file and line of its entry.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from moemeter.contract.errors import MoemeterError
from moemeter.contract.requests import ANONYMOUS, SERVER_FAULTS, user_of_tenant
from warehouse.sheets import entry_at, known, lines, load_toml, read_sheet, when

from .sql import sql

log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CLASS_KEYS = {
    "name",
    "effective",
    "ttft_ms",
    "itl_ms",
    "tokens_per_second_per_user",
    "e2e_ms",
    "objective",
    "period_days",
    "default",
    "own_targets",
    "source",
}


class SloSheetError(MoemeterError, ValueError):
    """An SLO sheet that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class SloClass:
    name: str
    effective: datetime  # UTC, naive; in effect until the next entry of the same name
    ttft_seconds: float | None
    itl_seconds: float | None
    e2e_seconds: float | None
    objective: float
    period_days: float
    default: bool
    source: str = ""
    own_targets: bool = False  # a request's own targets may loosen this class's, not only tighten them

    def met(self, ttft: float | None, itl: float | None, e2e: float | None) -> bool:
        """Whether a request met every target this class sets. A target the request has no
        measure for (no inter-token latency of a one-token answer) does not apply to it."""
        return all(
            target is None or value is None or value <= target
            for target, value in ((self.ttft_seconds, ttft), (self.itl_seconds, itl), (self.e2e_seconds, e2e))
        )


@dataclass(frozen=True)
class Assignment:
    effective: datetime
    kind: str  # "user" | "tenant"
    name: str  # the user (of `tenant`), or the tenant
    slo_class: str | None  # None (stored by migration 020 only): no class of its own from then on
    tenant: str = ""  # a user's tenant; for a tenant's assignment, the tenant (the name)

    @property
    def who(self) -> str:
        """How messages name it: the user of its tenant, or the tenant."""
        return user_of_tenant(self.name, self.tenant) if self.kind == "user" else self.name


@dataclass(frozen=True)
class SloSheet:
    name: str
    classes: tuple[SloClass, ...]
    assignments: tuple[Assignment, ...]

    def class_at(self, name: str, t: datetime) -> SloClass | None:
        """The version of class `name` in effect at `t`."""
        current = None
        for c in sorted((c for c in self.classes if c.name == name), key=lambda c: c.effective):
            if c.effective <= t:
                current = c
        return current

    def classes_at(self, t: datetime) -> dict[str, SloClass]:
        """Each class in effect at `t`, at its version then, by name (in name order)."""
        versions = (self.class_at(n, t) for n in sorted({c.name for c in self.classes}))
        return {c.name: c for c in versions if c is not None}

    def default_at(self, t: datetime) -> SloClass | None:
        """The default class in effect at `t`: of the classes in effect then, the one whose latest
        version says default."""
        live = [c for c in self.classes_at(t).values() if c.default]
        return max(live, key=lambda c: c.effective) if live else None

    def class_of(self, user: str, tenant: str, t: datetime) -> SloClass | None:
        """The class a request of `user` (of `tenant`) that finished at `t` is held to."""
        for kind, who in (("user", user), ("tenant", tenant)):
            chosen = None
            for a in sorted(self.assignments, key=lambda a: a.effective):
                if a.kind == kind and a.name == who and a.tenant == tenant and a.effective <= t:
                    chosen = a.slo_class
            if chosen is not None:
                return self.class_at(chosen, t) or self.default_at(t)
        return self.default_at(t)


# --------------------------------------------------------------------------- parsing
def _positive(entry: dict[str, Any], key: str, where: str) -> float | None:
    v = entry.get(key)
    if v is None:
        return None
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise SloSheetError(f"{where}: {key} must be a finite number > 0, got {v!r}")
    return float(v)


def _name(entry: dict[str, Any], key: str, where: str) -> str:
    v = entry.get(key)
    if not isinstance(v, str) or not _NAME.match(v):
        raise SloSheetError(f"{where}: {key} must be a name of letters, digits, '_', '-' or '.', got {v!r}")
    return v


def _class(entry: dict[str, Any], where: str) -> SloClass:
    known(entry, CLASS_KEYS, where, SloSheetError)
    name = _name(entry, "name", where)
    itl = _positive(entry, "itl_ms", where)
    tps = _positive(entry, "tokens_per_second_per_user", where)
    if itl is not None and tps is not None:
        raise SloSheetError(f"{where}: give itl_ms or tokens_per_second_per_user, not both (one is 1000 / the other)")
    ttft, e2e = _positive(entry, "ttft_ms", where), _positive(entry, "e2e_ms", where)
    if ttft is None and itl is None and tps is None and e2e is None:
        raise SloSheetError(
            f"{where}: class {name!r} has no target (ttft_ms, itl_ms, tokens_per_second_per_user, e2e_ms)"
        )
    objective = entry.get("objective")
    if not isinstance(objective, int | float) or isinstance(objective, bool) or not 0 < objective < 1:
        raise SloSheetError(f"{where}: objective must lie strictly between 0 and 1 (e.g. 0.99), got {objective!r}")
    period = _positive(entry, "period_days", where) or 30.0
    default = entry.get("default", False)
    if not isinstance(default, bool):
        raise SloSheetError(f"{where}: default must be true or false, got {default!r}")
    own = entry.get("own_targets", False)
    if not isinstance(own, bool):
        raise SloSheetError(f"{where}: own_targets must be true or false, got {own!r}")
    return SloClass(
        name,
        when(entry.get("effective"), where, SloSheetError),
        ttft / 1000 if ttft is not None else None,
        itl / 1000 if itl is not None else (1 / tps if tps is not None else None),
        e2e / 1000 if e2e is not None else None,
        float(objective),
        period,
        default,
        str(entry.get("source") or ""),
        own,
    )


def _assignment(entry: dict[str, Any], where: str, classes: set[str]) -> Assignment:
    """A tenant's assignment (`tenant`), or a user's (`user` and the user's `tenant`; a user without
    a tenant is the user of that name in the tenant "anonymous", the requests without a key)."""
    known(entry, {"effective", "user", "tenant", "class"}, where, SloSheetError)
    if "user" not in entry and "tenant" not in entry:
        raise SloSheetError(f"{where}: an assignment names a user (and the user's tenant) or a tenant, got neither")
    slo_class = _name(entry, "class", where)
    if slo_class not in classes:
        raise SloSheetError(f"{where}: no class {slo_class!r} in this sheet; it has {', '.join(sorted(classes))}")
    for key in ("user", "tenant"):
        who = entry.get(key, ANONYMOUS)
        if not isinstance(who, str) or not who:
            raise SloSheetError(f"{where}: {key} must be a non-empty string, got {who!r}")
    effective = when(entry.get("effective"), where, SloSheetError)
    tenant = entry.get("tenant", ANONYMOUS)
    if "user" in entry:
        return Assignment(effective, "user", entry["user"], slo_class, tenant)
    return Assignment(effective, "tenant", tenant, slo_class, tenant)


def parse_slo_sheet(text: str, origin: str = "SLO sheet") -> SloSheet:
    data = load_toml(text, origin, SloSheetError)
    unknown = set(data) - {"name", "class", "assign"}
    if unknown:
        raise SloSheetError(f"{origin}: unknown keys {sorted(unknown)}; a sheet has name, [[class]] and [[assign]]")
    class_lines, assign_lines = lines(text, "class"), lines(text, "assign")
    classes: list[SloClass] = []
    for i, entry in enumerate(data.get("class", [])):
        where = entry_at(origin, "class", class_lines, i)
        c = _class(entry, where)
        if any(o.name == c.name and o.effective == c.effective for o in classes):
            raise SloSheetError(f"{where}: a second entry for class {c.name!r} effective {c.effective:%Y-%m-%d %H:%M}")
        clash = next((o for o in classes if o.default and c.default and o.effective == c.effective), None)
        if clash is not None:
            raise SloSheetError(f"{where}: {clash.name!r} is already the default from {c.effective:%Y-%m-%d %H:%M}")
        classes.append(c)
    if not classes:
        raise SloSheetError(f"{origin}: no [[class]] entries")
    if not any(c.default for c in classes):
        raise SloSheetError(f"{origin}: no class says default = true (the class of everyone not assigned)")
    names = {c.name for c in classes}
    assignments: list[Assignment] = []
    for i, entry in enumerate(data.get("assign", [])):
        where = entry_at(origin, "assign", assign_lines, i)
        a = _assignment(entry, where, names)
        if any((o.kind, o.tenant, o.name, o.effective) == (a.kind, a.tenant, a.name, a.effective) for o in assignments):
            raise SloSheetError(f"{where}: {a.kind} {a.who!r} is assigned twice effective {a.effective:%Y-%m-%d %H:%M}")
        assignments.append(a)
    return SloSheet(str(data.get("name", Path(origin).stem)), tuple(classes), tuple(assignments))


def load_slo_sheet(path: str | Path) -> SloSheet:
    return parse_slo_sheet(read_sheet(path, "SLO sheet", SloSheetError), str(Path(path)))


def default_slo_sheet() -> SloSheet:
    text = resources.files("warehouse").joinpath("slo_sheets/default.toml").read_text()
    return parse_slo_sheet(text, "warehouse/slo_sheets/default.toml")


# --------------------------------------------------------------------------- storage
# A class's targets as stored (warehouse/sql/slo_class_stored.sql's columns, slo_class_store.sql's parameters).
_CLASS_COLUMNS = ("ttft_seconds", "itl_seconds", "e2e_seconds", "objective", "period_days", "is_default", "own_targets")


def store_slo_sheet(con: duckdb.DuckDBPyConnection, sheet: SloSheet, now: datetime) -> int:
    """Add the sheet's entries to the warehouse; returns the entries added. Refuses one that would
    change a stored entry (same class or same user/tenant, same effective time, other values), and a
    new one effective at or before the newest stored request, whose attainment it would change.
    Warns (log) of each user of "anonymous" it assigns who sent nothing while keyed tenants' users
    of that name did (`unreached_users`)."""
    newest = con.execute(sql("slo_newest_request")).fetchall()[0][0]
    added = _store(con, sheet, now, newest)
    for warning in unreached_users(con, sheet):
        log.warning("%s", warning)
    return added


def unreached_users(con: duckdb.DuckDBPyConnection, sheet: SloSheet) -> list[str]:
    """A warning for each user the sheet assigns in the tenant "anonymous" (what a user without a
    tenant names) whose name has requests stored only in keyed tenants (the records and the hourly
    sums): a sheet written before tenants held them by that name, and the entry now holds none."""
    names = sorted({a.name for a in sheet.assignments if a.kind == "user" and a.tenant == ANONYMOUS})
    rows = con.execute(sql("slo_tenants_of_users"), {"names": names}).fetchall() if names else []
    tenants: dict[str, list[str]] = {}
    for user, tenant in rows:
        tenants.setdefault(user, []).append(tenant)
    return [
        f"SLO sheet {sheet.name}: user = {json.dumps(user)} without a tenant holds {user_of_tenant(user, ANONYMOUS)} "
        f"(the requests without a key), who sent none stored here, not "
        f"{', '.join(user_of_tenant(user, t) for t in keyed)}, who did: to hold one, assign "
        f"user = {json.dumps(user)} with tenant = {json.dumps(keyed[0])}"
        for user, keyed in tenants.items()
        if ANONYMOUS not in keyed
    ]


def ensure_slo_sheet(con: duckdb.DuckDBPyConnection, now: datetime) -> None:
    """Store the default sheet if the warehouse holds none: requests are always held to a stored sheet."""
    if not con.execute(sql("slo_classes_count")).fetchall()[0][0]:
        _store(con, default_slo_sheet(), now, None)


def _past(sheet: SloSheet, what: str, effective: datetime, newest: datetime | None) -> None:
    if newest is not None and effective <= newest:
        raise SloSheetError(
            f"{sheet.name}: {what} effective {effective:%Y-%m-%d %H:%M} would change the attainment of requests "
            f"already stored (the newest finished {newest:%Y-%m-%d %H:%M:%S} UTC); give it an effective time "
            "after that"
        )


def _store(con: duckdb.DuckDBPyConnection, sheet: SloSheet, now: datetime, newest: datetime | None) -> int:
    added = 0
    for c in sheet.classes:
        values = [c.ttft_seconds, c.itl_seconds, c.e2e_seconds, c.objective, c.period_days, c.default, c.own_targets]
        row = con.execute(sql("slo_class_stored"), {"slo_class": c.name, "effective": c.effective}).fetchall()
        if row and list(row[0]) != values:
            raise SloSheetError(
                f"{sheet.name}: class {c.name!r} effective {c.effective:%Y-%m-%d %H:%M} is already stored with "
                "other targets; targets are never edited in place: add an entry with a later effective time"
            )
        if not row:
            _past(sheet, f"class {c.name!r}", c.effective, newest)
            con.execute(
                sql("slo_class_store"),
                {"effective": c.effective, "slo_class": c.name, **dict(zip(_CLASS_COLUMNS, values, strict=True))}
                | {"sheet": sheet.name, "source": c.source, "loaded_at": now},
            )
            added += 1
    for a in sheet.assignments:
        who = {"kind": a.kind, "tenant": a.tenant, "name": a.name, "effective": a.effective}
        row = con.execute(sql("slo_assignment_stored"), who).fetchall()
        if row and row[0][0] != a.slo_class:
            raise SloSheetError(
                f"{sheet.name}: {a.kind} {a.who!r} is already in class {row[0][0]!r} from "
                f"{a.effective:%Y-%m-%d %H:%M}; add an assignment with a later effective time"
            )
        if not row:
            _past(sheet, f"the assignment of {a.kind} {a.who!r}", a.effective, newest)
            con.execute(
                sql("slo_assignment_store"), {**who, "slo_class": a.slo_class, "sheet": sheet.name, "loaded_at": now}
            )
            added += 1
    return added


def stored_slo_sheet(classes: list[tuple[Any, ...]], assignments: list[tuple[Any, ...]]) -> SloSheet | None:
    """The versions stored in the warehouse (rows of warehouse/sql/slo_stored_classes.sql and
    slo_stored_assignments.sql) as one sheet; None when none is stored."""
    if not classes:
        return None
    return SloSheet(
        "warehouse",
        tuple(
            SloClass(name, _naive(eff), ttft, itl, e2e, float(obj), float(days), bool(dflt), "", _flag(own))
            for name, eff, ttft, itl, e2e, obj, days, dflt, own in classes
        ),
        tuple(Assignment(_naive(eff), kind, name, cls, tenant) for eff, kind, name, cls, tenant in assignments),
    )


def _flag(v: Any) -> bool:
    """A stored BOOLEAN as read back: NULL (a lake's rows published before the column; pandas' NA)
    is false."""
    return v is True or (type(v).__name__ == "bool" and bool(v))


def _naive(v: Any) -> datetime:
    import pandas as pd

    return pd.Timestamp(v).to_pydatetime().replace(tzinfo=None)


def slo_params(
    edges_start: datetime | None,
    edges_end: datetime | None,
    minutes: tuple[datetime, datetime] | None = None,
) -> dict[str, Any]:
    """The parameters of /*request_slo*/ besides the hours': the server faults, the window's edges
    read from the records (None: none), and the whole minutes around its hours that
    warehouse/sql/requests_slo.sql reads from the per-minute sums (None: none; the edges then reach
    the hours)."""
    m0, m1 = minutes or (None, None)
    return {
        "server_faults": sorted(SERVER_FAULTS),
        "edges_start": edges_start,
        "edges_end": edges_end,
        "minutes_from": m0,
        "minutes_until": m1,
    }
