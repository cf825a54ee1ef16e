-- increments_1m held about two rows per series and minute (an interval that straddles a minute's
-- start adds to it in two rolls), in the order the rolls stored them: a minute of every series,
-- then the next. Readers only sum a minute's rows (warehouse/sql/increase.sql), so one row per
-- series and minute, their sums, stands for them; stored hour by hour, series by series, a day's
-- read of a few series skips the blocks of rows of the others. From now on the writer compacts
-- each hour's minutes ten minutes after the hour has closed (warehouse/rollup.py, compact_minutes,
-- MINUTE_REACH); this compacts the minutes of the hours it would have, and the pool rollups'
-- minutes likewise.
CREATE TEMP TABLE compact_before AS
SELECT time_bucket(INTERVAL 1 HOUR, through - INTERVAL 10 MINUTE) AS until FROM rollup_state WHERE name = '1m';
CREATE TEMP TABLE compacted_minutes AS
SELECT ts, series_id, sum(delta) AS delta, sum(seconds) AS seconds, sum(idle_seconds) AS idle_seconds,
       sum(resets)::INTEGER AS resets
FROM increments_1m WHERE ts < (SELECT until FROM compact_before)
GROUP BY ts, series_id ORDER BY time_bucket(INTERVAL 1 HOUR, ts), series_id, ts;
DELETE FROM increments_1m WHERE ts < (SELECT until FROM compact_before);
INSERT INTO increments_1m BY NAME SELECT * FROM compacted_minutes;
DROP TABLE compacted_minutes;

CREATE TEMP TABLE compacted_minutes AS
SELECT ts, role, metric, le, sum(delta) AS delta, sum(seconds) AS seconds, sum(idle_seconds) AS idle_seconds
FROM pool_histograms_1m WHERE ts < (SELECT until FROM compact_before)
GROUP BY ts, role, metric, le
ORDER BY time_bucket(INTERVAL 1 HOUR, ts), role, metric, le, ts;
DELETE FROM pool_histograms_1m WHERE ts < (SELECT until FROM compact_before);
INSERT INTO pool_histograms_1m BY NAME SELECT * FROM compacted_minutes;
DROP TABLE compacted_minutes;
DROP TABLE compact_before;
