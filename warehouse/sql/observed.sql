-- The first and the latest scrape that found a target up: when counting could start, and the latest count.
SELECT min(ts) AS first, max(ts) AS latest FROM scrapes WHERE up
