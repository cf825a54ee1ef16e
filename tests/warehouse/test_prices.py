"""Price sheets: the default cites its source; every mistake is refused with its line; stored prices never change."""

from __future__ import annotations

from datetime import datetime, time

import duckdb
import pytest

from moemeter.cli import main
from warehouse.db import apply_migrations
from warehouse.prices import PriceSheetError, default_sheet, parse_sheet, store_sheet

GOOD = """name = "test"
[[gpu]]
effective = "2026-01-01T00:00:00Z"
pool = "*"
usd_per_gpu_hour = 3.0
source = "contract"
"""


def test_the_default_sheet_is_the_write_ups_price_with_its_source() -> None:
    s = default_sheet()
    [g] = s.gpu
    assert (g.pool, g.usd_per_gpu_hour) == ("*", 38.96) and "DeepSeek off-peak pricing" in g.source
    [t] = s.tokens
    assert t.prices_at(time(12, 0)) == (0.006, 0.30, 1.20)
    assert t.prices_at(time(17, 0)) == t.prices_at(time(0, 15)) == (0.003, 0.15, 0.60)  # off-peak wraps midnight
    assert t.prices_at(time(0, 30)) == (0.006, 0.30, 1.20)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("3.0", "-1.0"), "line 2 ([[gpu]] entry 1): usd_per_gpu_hour must be a finite number >= 0"),
        (GOOD.replace("usd_per_gpu_hour = 3.0\n", ""), "line 2 ([[gpu]] entry 1): usd_per_gpu_hour is missing"),
        (GOOD.replace('pool = "*"', 'pool = "training"'), "line 2 ([[gpu]] entry 1): unknown pool 'training'"),
        (GOOD + GOOD.split("\n", 1)[1].replace("3.0", "4.0"), "line 7 ([[gpu]] entry 2): a second price for pool '*'"),
        (GOOD.replace('source = "contract"\n', ""), "source is missing"),
        (GOOD.replace('"2026-01-01T00:00:00Z"', '"next week"'), "effective must be an ISO 8601 time"),
        (
            GOOD + '[[tokens]]\neffective = "2026-01-01"\nusd_per_mtok_input_cache_hit = 0.1\n'
            'usd_per_mtok_input_cache_miss = 0.2\nusd_per_mtok_output = 0.3\noff_peak_utc = "25:00-01:00"\n',
            "line 7 ([[tokens]] entry 1): off_peak_utc must look like",
        ),
        ("[[gpu]\n", "not valid TOML"),
        ('name = "x"\n', "no [[gpu]] or [[tokens]] entries"),
        (GOOD + "discount = 0.1\n", "unknown keys ['discount']"),
    ],
)
def test_mistakes_are_refused_with_their_line(text: str, message: str) -> None:
    with pytest.raises(PriceSheetError) as err:
        parse_sheet(text, "prices.toml")
    assert message in str(err.value) and str(err.value).startswith("prices.toml")


def test_a_pool_price_wins_over_the_every_gpu_price_from_its_effective_time() -> None:
    s = parse_sheet(
        GOOD + '[[gpu]]\neffective = "2026-06-01T00:00:00Z"\npool = "decode"\nusd_per_gpu_hour = 5.0\n'
        'source = "decode repriced"\n'
    )
    pieces = s.gpu_segments("decode", datetime(2026, 5, 31), datetime(2026, 6, 2))
    assert [(a.day, b.day, p.usd_per_gpu_hour) for a, b, p in pieces] == [(31, 1, 3.0), (1, 2, 5.0)]
    assert [p.usd_per_gpu_hour for *_, p in s.gpu_segments("prefill", datetime(2026, 5, 31), datetime(2026, 6, 2))] == [
        3.0
    ]


def test_stored_prices_are_never_edited_in_place() -> None:
    con = duckdb.connect()
    apply_migrations(con)
    now = datetime(2026, 11, 30)
    assert store_sheet(con, parse_sheet(GOOD), now) == 1
    assert store_sheet(con, parse_sheet(GOOD), now) == 0  # the same again: nothing new
    with pytest.raises(PriceSheetError, match="never edited in place"):
        store_sheet(con, parse_sheet(GOOD.replace("3.0", "2.5")), now)
    later = GOOD.replace("2026-01-01", "2026-12-01").replace("3.0", "2.5")
    assert store_sheet(con, parse_sheet(later), now) == 1
    assert con.execute("SELECT usd_per_gpu_hour FROM gpu_prices ORDER BY effective").fetchall() == [(3.0,), (2.5,)]


def test_prices_load_command(tmp_path, capsys) -> None:
    sheet = tmp_path / "p.toml"
    sheet.write_text(GOOD)
    db = str(tmp_path / "w.duckdb")
    assert main(["prices", "load", str(sheet), "--db", db]) == 0
    assert "1 new entries" in capsys.readouterr().out
    sheet.write_text(GOOD.replace("3.0", "9.0"))
    assert main(["prices", "load", str(sheet), "--db", db]) == 2
    assert "never edited in place" in capsys.readouterr().err
