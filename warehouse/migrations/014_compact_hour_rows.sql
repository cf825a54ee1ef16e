-- increments_1h held a row per series for every minute rolled into an hour (sixty a closed hour,
-- as many as the raw table holds at a 60 s scrape interval). Readers only sum an hour's rows, so
-- one row per series and hour, their sums, stands for them; from now on the writer compacts each
-- hour as it closes (warehouse/rollup.py). This compacts the hours already there.
CREATE TEMP TABLE compacted_hours AS
SELECT ts, series_id, sum(delta) AS delta, sum(seconds) AS seconds, sum(resets)::INTEGER AS resets,
       sum(idle_seconds) AS idle_seconds
FROM increments_1h GROUP BY ts, series_id;
DELETE FROM increments_1h;
INSERT INTO increments_1h BY NAME SELECT * FROM compacted_hours;
DROP TABLE compacted_hours;
