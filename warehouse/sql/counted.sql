-- When the pools' targets were observed in the window: the first scrape that found one up (its
-- counters count from there) and the last one in (start, end] (docs/definitions.md, Pools and cost).
SELECT greatest(min(ts), $start::TIMESTAMP) AS first_count, max(ts) FILTER (WHERE ts > $start::TIMESTAMP) AS last_count
FROM scrapes
WHERE up AND ts <= $end::TIMESTAMP AND list_contains($targets::VARCHAR[], target)
