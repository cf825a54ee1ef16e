"""Hostile and odd pages never crash the collector path and never corrupt what is stored."""

from __future__ import annotations

import string
from datetime import datetime, timedelta

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.parse import ExpositionError, parse_page
from moemeter.contract import TargetInfo
from tests.schema import fresh_schema
from warehouse.db import apply_migrations
from warehouse.ingest import Ingestor, ScrapeBatch

T0 = datetime(2026, 11, 30, 12, 0, 0)
TARGET = TargetInfo("t", "http://x/metrics", "decode", 1)
NAMES = st.text(string.ascii_letters + "_:", min_size=1, max_size=12).filter(lambda s: not s[0].isdigit())
LABELS = st.dictionaries(
    st.text(string.ascii_letters + "_", min_size=1, max_size=8).filter(lambda s: not s.startswith("__")),
    st.text(string.printable, max_size=30),
    max_size=3,
)
VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**20), 10**20))
KINDS = st.sampled_from(["counter", "gauge", "untyped", None])


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float | int) -> str:
    if isinstance(v, float) and v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


@st.composite
def pages(draw) -> str:  # type: ignore[no-untyped-def]
    lines = []
    for _ in range(draw(st.integers(1, 6))):  # families, possibly repeated (duplicate families)
        name, kind = draw(NAMES), draw(KINDS)
        if kind:
            lines.append(f"# TYPE {name} {kind}")
        for _ in range(draw(st.integers(1, 4))):
            labels = draw(LABELS)
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{inner}}} {_fmt(draw(VALUES))}")
    if draw(st.booleans()):
        lines.append(draw(st.text(string.printable, max_size=40)))  # a line of noise
    return "\n".join(lines) + "\n"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pages(), pages())
def test_generated_pages_never_crash_and_never_corrupt_stored_data(first, second):
    with fresh_schema() as con:
        never_crash_and_never_corrupt(con, first, second)


def never_crash_and_never_corrupt(con: duckdb.DuckDBPyConnection, first: str, second: str) -> None:
    ing = Ingestor()
    stored = []
    for k, page in enumerate((first, second)):
        try:
            samples = parse_page(page.encode())
        except ExpositionError:
            continue  # refused with a reason: the collector records it, stores nothing from it
        before = con.execute("SELECT count(*) FROM readings").fetchall()[0][0]
        n = ing.write(con, ScrapeBatch(TARGET, T0 + timedelta(seconds=5 * k), True, 0.0, samples))
        stored.append(n)
        assert con.execute("SELECT count(*) FROM readings").fetchall()[0][0] == before + n
        assert n == len({(s.name, s.labels) for s in samples})  # duplicates stored once
    # every stored sample belongs to a known series; no increase is negative
    assert (
        con.execute("SELECT count(*) FROM samples WHERE series_id NOT IN (SELECT series_id FROM series)").fetchall()[0][
            0
        ]
        == 0
    )
    assert con.execute("SELECT count(*) FROM increments WHERE delta < 0 OR isnan(delta)").fetchall()[0][0] == 0


def test_a_huge_label_value_is_refused_with_its_reason():
    page = f'a{{x="{"y" * 100_000}"}} 1\n'.encode()
    with pytest.raises(ExpositionError, match="label x of a has a 100000-character value"):
        parse_page(page)


def test_duplicate_families_and_series_keep_the_first_value():
    page = b"# TYPE a gauge\na 1\n# TYPE a gauge\na 2\n"
    con = duckdb.connect()
    apply_migrations(con)
    samples = parse_page(page)
    assert Ingestor().write(con, ScrapeBatch(TARGET, T0, True, 0.0, samples)) == 1
    assert con.execute("SELECT value FROM samples").fetchall() == [(1.0,)]
