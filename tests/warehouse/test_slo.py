"""SLO sheets: classes, assignments, versions, and every mistake refused with its line."""

from __future__ import annotations

import logging
from datetime import datetime

import duckdb
import pytest

from moemeter.cli import main
from warehouse.slo import SloSheetError, default_slo_sheet, parse_slo_sheet

SHEET = """
name = "acme-slos"

[[class]]
name = "chat"
effective = "2026-11-01T00:00:00Z"
default = true
ttft_ms = 1000
tokens_per_second_per_user = 50
objective = 0.99

[[class]]
name = "chat"
effective = "2026-12-01T00:00:00Z"
default = true
ttft_ms = 500
itl_ms = 20
objective = 0.995
period_days = 7

[[class]]
name = "batch"
effective = "2026-11-01T00:00:00Z"
e2e_ms = 600000
objective = 0.9

[[assign]]
effective = "2026-11-01T00:00:00Z"
tenant = "acme"
class = "batch"

[[assign]]
effective = "2026-11-15T00:00:00Z"
user = "alice"
tenant = "acme"
class = "chat"
"""


def test_classes_are_versions_and_assignments_pick_them():
    sheet = parse_slo_sheet(SHEET, "acme.toml")
    nov, dec = datetime(2026, 11, 20), datetime(2026, 12, 2)
    chat_nov = sheet.class_of("bob", "other", nov)
    assert chat_nov is not None
    assert (chat_nov.name, chat_nov.ttft_seconds, chat_nov.itl_seconds) == ("chat", 1.0, 0.02)  # 1 / 50 tok/s
    assert (chat_nov.objective, chat_nov.period_days) == (0.99, 30.0)
    chat_dec = sheet.class_of("bob", "other", dec)
    assert chat_dec is not None and (chat_dec.ttft_seconds, chat_dec.objective, chat_dec.period_days) == (0.5, 0.995, 7)
    batch = sheet.class_of("carol", "acme", nov)
    assert batch is not None and batch.name == "batch" and batch.e2e_seconds == 600.0
    # a user's own assignment wins over the tenant's, from its effective time on
    assert sheet.class_of("alice", "acme", datetime(2026, 11, 10)).name == "batch"  # type: ignore[union-attr]
    assert sheet.class_of("alice", "acme", nov).name == "chat"  # type: ignore[union-attr]
    assert sheet.class_of("bob", "other", datetime(2026, 10, 1)) is None  # before any class


def test_met_means_every_target_the_class_sets_that_has_a_measure():
    chat = parse_slo_sheet(SHEET).class_at("chat", datetime(2026, 12, 2))
    assert chat is not None
    assert chat.met(ttft=0.5, itl=0.02, e2e=99.0)  # both at the target; no e2e target
    assert not chat.met(ttft=0.51, itl=0.01, e2e=1.0)  # misses one target only
    assert not chat.met(ttft=0.1, itl=0.021, e2e=1.0)
    assert chat.met(ttft=0.2, itl=None, e2e=1.0)  # one-token answer: no inter-token latency


def test_the_default_sheet_parses_and_has_a_default_class():
    sheet = default_slo_sheet()
    c = sheet.default_at(datetime(2026, 12, 1))
    assert c is not None and c.name == "interactive" and c.objective == 0.99


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("objective = 0.99", "objective = 1.0"), "line 4 .*objective must lie strictly between 0 and 1"),
        (("ttft_ms = 1000", "ttft_ms = -1"), "line 4 .*ttft_ms must be a finite number > 0"),
        (("tokens_per_second_per_user = 50", "tokens_per_second_per_user = 50\nitl_ms = 20"), "not both"),
        (('class = "batch"', 'class = "gold"'), "line 27 .*no class 'gold' in this sheet"),
        (('tenant = "acme"\nclass = "batch"', 'class = "batch"'), "names a user .* or a tenant, got neither"),
        (('user = "alice"', 'user = ""'), "user must be a non-empty string"),
        (("period_days = 7", "period_days = 7\nlatency = 3"), "unknown keys \\['latency'\\]"),
        (('effective = "2026-12-01T00:00:00Z"', 'effective = "December"'), "line 12 .*ISO 8601"),
        (('name = "batch"', 'name = "batch"\ndefault = true\neffective2 = 1'), "unknown keys"),
        (("e2e_ms = 600000\n", ""), "class 'batch' has no target"),
    ],
)
def test_mistakes_are_refused_with_their_line(change, message):
    with pytest.raises(SloSheetError, match=message):
        parse_slo_sheet(SHEET.replace(*change), "acme.toml")


def test_sheet_level_mistakes():
    with pytest.raises(SloSheetError, match="not valid TOML"):
        parse_slo_sheet("[[class]\n", "x.toml")
    with pytest.raises(SloSheetError, match="no class says default = true"):
        parse_slo_sheet(SHEET.replace("default = true\n", ""), "x.toml")
    with pytest.raises(SloSheetError, match="a second entry for class 'chat'"):
        parse_slo_sheet(SHEET.replace('"2026-12-01T00:00:00Z"', '"2026-11-01T00:00:00Z"'), "x.toml")


def test_load_adds_versions_and_never_changes_a_stored_one(tmp_path, capsys):
    db, sheet = tmp_path / "w.duckdb", tmp_path / "acme.toml"
    sheet.write_text(SHEET)
    assert main(["slo", "load", str(sheet), "--db", str(db)]) == 0
    assert "5 new entries" in capsys.readouterr().out
    assert main(["slo", "load", str(sheet), "--db", str(db)]) == 0
    assert "0 new entries" in capsys.readouterr().out

    def stored() -> list[tuple]:
        with duckdb.connect(str(db), read_only=True) as con:
            return (
                con.execute("SELECT class, effective, ttft_seconds, objective FROM slo_classes ORDER BY ALL").fetchall()
                + con.execute("SELECT kind, name, class FROM slo_assignments ORDER BY ALL").fetchall()
            )

    before = stored()
    sheet.write_text(SHEET.replace("ttft_ms = 500", "ttft_ms = 400"))
    assert main(["slo", "load", str(sheet), "--db", str(db)]) == 2
    assert "already stored with other targets" in capsys.readouterr().err
    assert stored() == before
    sheet.write_text(SHEET.replace('tenant = "acme"\nclass = "chat"', 'tenant = "acme"\nclass = "batch"'))
    assert main(["slo", "load", str(sheet), "--db", str(db)]) == 2
    assert "user 'alice of acme' is already in class 'chat'" in capsys.readouterr().err
    assert stored() == before
    sheet.write_text("[[class]]\nname = 1\n")
    assert main(["slo", "load", str(sheet), "--db", str(db)]) == 2
    assert stored() == before


OLD_SHEET = """
name = "before-tenants"

[[class]]
name = "chat"
effective = "2026-12-01T00:00:00Z"
default = true
ttft_ms = 1000
objective = 0.99

[[assign]]
effective = "2026-12-01T00:00:00Z"
user = "carol"  # only keyed tenants' carol sent requests: warned
class = "chat"

[[assign]]
effective = "2026-12-01T00:00:00Z"
user = "dave"  # the keyless dave sent requests too: the entry holds someone
class = "chat"

[[assign]]
effective = "2026-12-01T00:00:00Z"
user = "erin"  # nobody of that name yet
class = "chat"

[[assign]]
effective = "2026-12-01T00:00:00Z"
user = "carol"
tenant = "acme"
class = "chat"
"""


def test_loading_a_user_without_a_tenant_warns_when_only_keyed_tenants_have_that_user(tmp_path, caplog):
    """An old sheet's `user = "carol"` holds the keyless carol only; when carol's requests all came
    with keys (the records, or the hourly sums once the records are gone), `slo load` says which
    tenants' carol the entry does not hold and how to name one."""
    from tests.hostile.test_tenants import ingest, record
    from warehouse.db import apply_migrations
    from warehouse.rollup import Rollups

    t = datetime(2026, 11, 30, 10)
    db = tmp_path / "w.duckdb"
    with duckdb.connect(str(db)) as con:
        apply_migrations(con)
        users = [("acme", "carol"), ("globex", "carol"), ("anonymous", "dave"), ("acme", "dave")]
        ingest(con, [record(n, tenant, user, t) for n, (tenant, user) in enumerate(users)], t)
        Rollups().advance(con, datetime(2026, 11, 30, 12))
        con.execute("DELETE FROM requests WHERE tenant = 'globex'")  # globex's carol in the hourly sums alone
    sheet = tmp_path / "old.toml"
    sheet.write_text(OLD_SHEET)
    with caplog.at_level(logging.WARNING, logger="warehouse.slo"):
        assert main(["slo", "load", str(sheet), "--db", str(db)]) == 0
    assert [r.getMessage() for r in caplog.records if r.name == "warehouse.slo"] == [
        'SLO sheet before-tenants: user = "carol" without a tenant holds carol of anonymous (the requests '
        "without a key), who sent none stored here, not carol of acme, carol of globex, who did: to hold one, "
        'assign user = "carol" with tenant = "acme"'
    ]
