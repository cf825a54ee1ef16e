"""`make bench`'s closing lines: each storage and ingest target against the figure its section measured."""

from __future__ import annotations

from benchmarks.run import targets

RUN = {"commit": "abc1234", "measured_at": "2026-12-05 17:00 UTC"}


def test_each_target_says_its_figure_its_bound_and_which_run_measured_it():
    result = {
        "storage": {**RUN, "raw_bytes_per_sample": 2.97},
        "vs_prometheus": {**RUN, "metrics_only_over_prometheus_cpu_per_sample": 2.2},
        "history": {
            **RUN,
            "span": "24h",
            "wall_seconds": 1130,
            "pages": {"live_24h_p95_seconds": 0.25, "cost_24h_p95_seconds": 0.31, "cost_7d_p95_seconds": 0.9},
        },
    }
    assert targets(result) == [
        "raw storage, bytes per scraped sample: 2.97 (at most 3: met) - abc1234, 2026-12-05 17:00 UTC",
        "ingest CPU per sample, metrics alone, x Prometheus's: 2.2 (at most 2: NOT met) - abc1234, 2026-12-05 17:00 UTC",
        "slowest page's p95 at 24 h, seconds: 0.31 (at most 0.3: NOT met) - abc1234, 2026-12-05 17:00 UTC",
        "a day fast-forwarded at 60 s, minutes: 18.8 (at most 20: met) - abc1234, 2026-12-05 17:00 UTC",
    ]


def test_a_target_whose_section_did_not_run_or_ran_shorter_is_not_measured():
    result = {"history": {**RUN, "span": "2h", "wall_seconds": 300, "pages": {"live_24h_p95_seconds": 0.1}}}
    assert all(
        line.endswith("not measured (run `python -m benchmarks.run " + s + "`)")
        for line, s in zip(targets(result), ["storage", "vs_prometheus", "history", "history"], strict=True)
    )
