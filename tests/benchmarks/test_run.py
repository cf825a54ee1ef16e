"""`make bench`'s closing lines: each storage and ingest target against the figure its section measured."""

from __future__ import annotations

from benchmarks.run import targets

RUN = {"commit": "abc1234", "measured_at": "2026-12-05 17:00 UTC"}


def test_each_target_says_its_figure_its_bound_and_which_run_measured_it():
    result = {
        "storage": {**RUN, "raw_bytes_per_sample": 2.97, "request_bytes_per_record": 26.0},
        "vs_prometheus": {
            **RUN,
            "metrics_only_over_prometheus_cpu_per_sample": 0.9,
            "collector_over_prometheus_cpu_per_sample": 2.2,
        },
        "serve_memory": {**RUN, "serve_over_prometheus_peak_rss": 3.1, "serve_growth_after_10_minutes": 1.04},
        "history": {
            **RUN,
            "span": "24h",
            "wall_seconds": 1130,
            "peak_rss_megabytes": 3900,
            "pages": {"live_24h_p95_seconds": 0.12, "cost_24h_p95_seconds": 0.31, "cost_7d_p95_seconds": 0.9},
            "month": {
                "pages": {"users_30d_p95_seconds": 0.21, "cost_30d_p95_seconds": 0.18, "users_30d_p50_seconds": 1}
            },
        },
    }
    at = " - abc1234, 2026-12-05 17:00 UTC"
    assert targets(result) == [
        "raw storage, bytes per scraped sample: 2.97 (at most 1.5: NOT met)" + at,
        "a request record, bytes: 26 (at most 16: NOT met)" + at,
        "ingest CPU per sample, metrics alone, x Prometheus's: 0.9 (at most 1: met)" + at,
        "ingest CPU per sample, with the request feed, x Prometheus's: 2.2 (at most 1.5: NOT met)" + at,
        "serve's peak memory, x Prometheus's, side by side: 3.1 (at most 2: NOT met)" + at,
        "serve's memory after its first 10 minutes, x its most in them: 1.04 (at most 1.1: met)" + at,
        "slowest page's p95 at 24 h, seconds: 0.31 (at most 0.15: NOT met)" + at,
        "slowest page's p95 at 30 days, seconds: 0.21 (at most 0.25: met)" + at,
        "a day fast-forwarded at 60 s, minutes: 18.8 (at most 20: met)" + at,
        "a day fast-forwarded at 60 s, peak memory, GB: 3.9 (at most 4: met)" + at,
    ]


def test_a_target_whose_section_did_not_run_or_ran_shorter_is_not_measured():
    result = {
        "history": {**RUN, "span": "2h", "wall_seconds": 300, "pages": {"live_24h_p95_seconds": 0.1}},
        "serve_memory": {**RUN, "serve_over_prometheus_peak_rss": 2.5, "serve_growth_after_10_minutes": None},
    }
    lines = targets(result)
    sections = ["storage", "storage", "vs_prometheus", "vs_prometheus", None, None, *["history"] * 4]
    assert len(lines) == len(sections)
    for line, s in zip(lines, sections, strict=True):
        if s is not None:
            assert line.endswith("not measured (run `python -m benchmarks.run " + s + "`)")
    assert lines[4].startswith("serve's peak memory, x Prometheus's, side by side: 2.5 (at most 2: NOT met)")
    assert lines[5] == (
        "serve's memory after its first 10 minutes, x its most in them: not measured in the last run of serve_memory (its entry in latest.json says why)"
    )


def test_a_month_that_did_not_fit_on_the_disk_is_not_measured_and_the_day_still_is():
    day = {"wall_seconds": 1014, "peak_rss_megabytes": 2855, "pages": {"live_24h_p95_seconds": 0.1}}
    result = {"history": {**RUN, "span": "24h", **day, "month": {"not_made": "a month needs about 34 GB free"}}}
    lines = [line for line in targets(result) if "page" in line]
    assert lines == [
        "slowest page's p95 at 24 h, seconds: 0.1 (at most 0.15: met) - abc1234, 2026-12-05 17:00 UTC",
        "slowest page's p95 at 30 days, seconds: not measured in the last run of history (its entry in latest.json says why)",
    ]
