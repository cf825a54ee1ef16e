-- The time of the latest scrape round.
SELECT max(ts) AS ts FROM scrapes
