-- The temp table `rolled`: a roll's minute rows (`rolled_minutes`) summed into periods of $width
-- (an interval a minute divides: six minutes, an hour). A raw row's shares of the minutes of a
-- period add up to its share of the period, its reset to the period its scrape closed (migration
-- 019 fills the six-minute table from the minutes the same way; warehouse/rollup.py, _roll).
CREATE TEMP TABLE rolled AS
SELECT time_bucket($width::INTERVAL, ts) AS ts, series_id, sum(delta) AS delta, sum(seconds) AS seconds,
       sum(idle_seconds) AS idle_seconds, sum(resets)::INTEGER AS resets
FROM rolled_minutes GROUP BY ALL
