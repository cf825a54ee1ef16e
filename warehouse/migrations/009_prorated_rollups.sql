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
