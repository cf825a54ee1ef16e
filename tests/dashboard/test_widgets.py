from datetime import date, datetime

from dashboard.widgets import day_span, refresh_every

D1, D2 = date(2026, 11, 3), date(2026, 11, 5)


def test_a_picked_range_covers_whole_days():
    assert day_span((D1, D2), D1) == (datetime(2026, 11, 3), datetime(2026, 11, 6))


def test_a_half_picked_range_or_none_falls_back_without_failing():
    assert day_span((D1,), D2) == (datetime(2026, 11, 3), datetime(2026, 11, 4))
    assert day_span((), D2) == (datetime(2026, 11, 5), datetime(2026, 11, 6))
    assert day_span(None, D2) == (datetime(2026, 11, 5), datetime(2026, 11, 6))
    assert day_span(D1, D2) == (datetime(2026, 11, 3), datetime(2026, 11, 4))


def test_a_reversed_range_is_put_in_order():
    assert day_span((D2, D1), D1) == (datetime(2026, 11, 3), datetime(2026, 11, 6))


def test_compact_counts_fit_a_metric_card():
    from dashboard.widgets import compact

    assert [compact(v) for v in (999, 20_384_912, 1_234_567_890, 4_500, 0)] == ["999", "20.4M", "1.23B", "4.5k", "0"]


def test_dollars_on_a_card_fit_it_from_a_million_up_and_stay_exact_below():
    from dashboard.widgets import usd_card

    values = (1_660_619.35, -2_500_000, 999_999.99, 12.5, None)
    assert [usd_card(v) for v in values] == ["$1.661M", "−$2.500M", "$999,999.99", "$12.50", "—"]


def test_live_refresh_slows_to_twice_the_render_time_and_speeds_up_only_when_well_within():
    """On one shared core a Live render took 5-8 s; refreshing every 5 s kept the machine busy
    redrawing, and the lower charts took 90 s to appear. Slow while vLLM loads, fast again after."""
    assert refresh_every(0.4, 5) == 5 and refresh_every(2.4, 5) == 5
    assert refresh_every(3.0, 5) == 10 and refresh_every(7.0, 5) == 15 and refresh_every(14.0, 5) == 30
    assert refresh_every(99.0, 5) == 60
    assert refresh_every(1.2, 15) == 5  # renders fast again: back to 5 s
    assert refresh_every(2.0, 10) == 10 and refresh_every(3.0, 10) == 10  # not yet: no flapping
