-- Counter rollups hold each period's share of wall time (docs/definitions.md, Windows): from now
-- on the writer splits every raw increment by the minutes and hours its interval covers, and
-- fills the minute and hour tables together from the raw rows. Rows rolled before this migration
-- count each interval wholly in the minute its scrape closed; their idle seconds are unknown (0).
ALTER TABLE increments_1m ADD COLUMN idle_seconds DOUBLE DEFAULT 0;
ALTER TABLE increments_1h ADD COLUMN idle_seconds DOUBLE DEFAULT 0;
UPDATE increments_1m SET idle_seconds = 0;
UPDATE increments_1h SET idle_seconds = 0;
-- The hour table then holds every raw row before the minute watermark: add the minutes rolled up
-- since the last whole hour.
INSERT INTO increments_1h BY NAME
SELECT time_bucket(INTERVAL 1 HOUR, ts) AS ts, series_id, sum(delta) AS delta, sum(seconds) AS seconds,
       sum(resets)::INTEGER AS resets, 0.0 AS idle_seconds
FROM increments_1m
WHERE ts >= coalesce((SELECT through FROM rollup_state WHERE name = '1h'), '-infinity'::TIMESTAMP)
GROUP BY ALL;
-- The longest interval a stored increment covers: how far past a piece of a window a raw row may
-- still reach back into it (the read layer bounds its scans of the raw table with it).
CREATE TABLE IF NOT EXISTS longest_interval (seconds DOUBLE NOT NULL);
INSERT INTO longest_interval SELECT coalesce(max(seconds), 0) FROM increments;
