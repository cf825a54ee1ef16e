"""The Cost page shows the numbers `moemeter report cost` gives for the same window (AppTest over
the query API, on the hand-computed warehouse of tests/warehouse/test_cost.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_page
from tests.warehouse.conftest import rack  # noqa: F401  (the fixture)
from warehouse.api import QueryServer
from warehouse.db import Warehouse

pytestmark = pytest.mark.integration
PAGE = str(Path(__file__).parents[2] / "dashboard" / "views" / "cost.py")


@pytest.fixture
def api(rack):  # noqa: F811
    db, _ = rack
    wh = Warehouse(db)
    srv = QueryServer(wh)
    srv.start()
    yield srv.url
    srv.shutdown()
    wh.close()


def metric(at, label: str) -> str:  # type: ignore[no-untyped-def]
    return next(m.value for m in at.metric if m.label == label)


def open_page(api_url: str, monkeypatch):  # type: ignore[no-untyped-def]
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("MOEMETER_API", api_url)
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params["from"] = "2026-11-29T10:00:00Z"
    at.query_params["to"] = "2026-11-29T12:00:00Z"
    at.run()
    assert not at.exception, at.exception
    return at


def test_the_page_shows_the_reports_numbers(api, monkeypatch) -> None:
    at = open_page(api, monkeypatch)
    assert metric(at, "Cost") == "$467.52"
    assert metric(at, "$/M input") == "$48.7000"
    assert metric(at, "$/M output") == "$311.68"  # cents above $100
    assert metric(at, "$/M blended") == "$85.0036"
    assert metric(at, "Idle cost") == "$77.49"
    assert metric(at, "Revenue") == "$2.17" and metric(at, "Margin") == "−$465.35"
    users = at.dataframe[0].value
    assert list(users.user) == ["bob", "alice"] and [round(c, 2) for c in users.cost_usd] == [285.71, 181.81]
    daily = at.dataframe[1].value
    assert list(daily.day) == ["2026-11-29"] and daily.cost_usd[0] == round(6 * 12 * 38.96, 2)  # 00:00 .. 12:00
    assert "$38.96 per GPU-hour" in at.caption[0].value  # the price's source is on screen


def test_the_usage_basis_and_the_cache_savings(api, monkeypatch) -> None:
    """The numbers tests/warehouse/test_cost.py computes by hand for the usage basis."""
    at = open_page(api, monkeypatch)
    assert metric(at, "Cache savings") == "$63.31" and "cost basis **allocation**" in at.caption[0].value
    at.segmented_control(key="cost_basis").set_value("usage").run()
    assert not at.exception, at.exception
    assert "cost basis **usage**" in at.caption[0].value
    assert metric(at, "Cost") == "$467.52"  # the bill is the same
    assert metric(at, "$/M output") == "$233.76" and metric(at, "Idle cost") == "$77.49"
    assert metric(at, "Cache savings") == "$63.22"
    users = at.dataframe[0].value
    assert list(users.user) == ["bob", "alice"] and [round(c, 2) for c in users.cost_usd] == [227.19, 162.19]
    daily = at.dataframe[1].value  # 00:00 .. 12:00: the hours before the first scrape are not busy
    assert daily.usd_per_mtok_output[0] == 233.76 and daily.idle_cost_usd[0] == 77.49


def test_what_if_price_and_utilisation(api, monkeypatch) -> None:
    at = open_page(api, monkeypatch)
    at.toggle(key="whatif_on").set_value(True).run()
    assert metric(at, "Cost") == "$467.52"  # the sheet's price to start from
    at.number_input(key="whatif_price").set_value(3.0).run()
    assert metric(at, "Cost") == "$36.00"  # (2 + 4) GPUs x 2 h x $3
    at.slider(key="whatif_util").set_value(2.0).run()
    assert metric(at, "$/M output") == f"${4 * 2 * 3.0 / 1.0 / 2:,.4f}"  # $24 / 1M tokens, served twice over


def test_a_window_without_data_says_so(api, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("MOEMETER_API", api)
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params["from"] = "2026-11-20T00:00:00Z"
    at.query_params["to"] = "2026-11-21T00:00:00Z"
    at.run()
    assert not at.exception and "nothing to cost in this window" in at.info[0].value
    assert not at.metric  # no zeros, no NaN


def test_an_empty_warehouse(empty_api, monkeypatch) -> None:
    at = run_page(PAGE, empty_api, monkeypatch)
    assert "No scrapes stored yet" in at.info[0].value


def test_a_query_the_api_refuses_is_a_message_on_the_page_not_a_traceback(rack, monkeypatch) -> None:  # noqa: F811
    from streamlit.testing.v1 import AppTest

    from warehouse.limits import Limits

    db, _ = rack
    wh = Warehouse(db)
    srv = QueryServer(wh, limits=Limits(max_result_rows=1))  # every query of more than one row gets 413
    srv.start()
    try:
        monkeypatch.setenv("MOEMETER_API", srv.url)
        at = AppTest.from_file(PAGE, default_timeout=60)
        at.query_params["from"] = "2026-11-29T10:00:00Z"
        at.query_params["to"] = "2026-11-29T12:00:00Z"
        at.run()
        assert not at.exception, at.exception
        errors = [e.value for e in at.error]
        assert any(
            "asked for more than the warehouse sends at once" in e and "Pick a shorter range" in e for e in errors
        ), errors
    finally:
        srv.shutdown()
        wh.close()
