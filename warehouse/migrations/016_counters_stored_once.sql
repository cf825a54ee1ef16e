-- A counter was stored twice: its reading in `samples` and its increase in `increments`, every
-- scrape. From now on the writer stores it once, as its increase, and keeps a reading in `samples`
-- only where the increases cannot give it back exactly (warehouse/ingest.py): a series' first
-- reading, its first of each clock hour, and any reading that is not a whole number below 2^53 or
-- follows one. The view `readings` gives every sample back as it was read.
--
-- This drops the same rows from an existing file: a reading whose increase is stored with it, when
-- the reading and the increase are whole numbers below 2^53 (a reset's increase is the reading
-- itself), unless it is its series' first reading of the hour.
CREATE TEMP TABLE derived AS
WITH firsts AS (
    SELECT series_id, min(ts) AS ts FROM samples
    WHERE isfinite(value) AND value >= 0
    GROUP BY series_id, time_bucket(INTERVAL 1 HOUR, ts)
)
SELECT ts, series_id
FROM samples x JOIN increments i USING (ts, series_id)
WHERE x.value >= 0 AND x.value < 9007199254740992 AND x.value = trunc(x.value)
  AND (i.reset OR i.delta = trunc(i.delta))
  AND (ts, series_id) NOT IN (SELECT (ts, series_id) FROM firsts);

CREATE TEMP TABLE kept AS SELECT x.* FROM samples x ANTI JOIN derived USING (ts, series_id);
DELETE FROM samples;
INSERT INTO samples BY NAME SELECT * FROM kept ORDER BY ts, series_id;
DROP TABLE kept;
DROP TABLE derived;

-- Every sample as it was read. A stored row is its own reading; a reading that only `increments`
-- holds is its chain's anchor (the latest stored reading that is finite and not negative, or a
-- reset's increase) plus the increases since. NULL where retention has taken the anchor. For
-- exports and questions about raw readings; pages read `increments` and the rollups.
CREATE OR REPLACE VIEW readings AS
WITH marks AS (
    SELECT ts, series_id, value, TRUE AS stored, FALSE AS reset FROM samples
    UNION ALL
    SELECT i.ts, i.series_id, i.delta, FALSE, i.reset FROM increments i ANTI JOIN samples x USING (ts, series_id)
),
chained AS (
    SELECT *, sum(anchor::INTEGER) OVER (PARTITION BY series_id ORDER BY ts ROWS UNBOUNDED PRECEDING) AS chain
    FROM (SELECT *, coalesce(stored AND isfinite(value) AND value >= 0 OR reset, FALSE) AS anchor FROM marks)
)
SELECT ts, series_id,
       CASE WHEN stored THEN value
            WHEN chain > 0 THEN sum(CASE WHEN anchor OR NOT stored THEN value ELSE 0 END)
                                    OVER (PARTITION BY series_id, chain ORDER BY ts ROWS UNBOUNDED PRECEDING)
       END AS value
FROM chained;
