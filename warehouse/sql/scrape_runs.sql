-- Every scrape in [$start, $end): when, whom, and whether it answered (target-down alerts).
SELECT ts, target, up FROM scrapes WHERE ts >= $start::TIMESTAMP AND ts < $end::TIMESTAMP ORDER BY target, ts
