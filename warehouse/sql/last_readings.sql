-- Each series' last reading, of those read in the hour before the newest stored row: what a writer
-- that restarts carries on from (warehouse/ingest.py). A counter's reading is its latest anchor (a
-- stored reading, finite and not negative, or a reset's increase, which is the reading itself) plus
-- every increase after it; the writer stores a series' first reading of each clock hour, so two
-- hours back holds an anchor for every series read in the last hour.
WITH newest AS (
    SELECT greatest((SELECT max(ts) FROM samples), (SELECT max(ts) FROM increments)) AS ts
),
anchors AS (
    SELECT series_id, ts, value FROM samples
    WHERE ts >= (SELECT ts FROM newest) - INTERVAL 2 HOUR AND isfinite(value) AND value >= 0
    UNION ALL
    SELECT series_id, ts, delta FROM increments
    WHERE ts >= (SELECT ts FROM newest) - INTERVAL 2 HOUR AND reset
),
latest AS (SELECT series_id, max(ts) AS ts, arg_max(value, ts) AS value FROM anchors GROUP BY series_id)
SELECT a.series_id, greatest(a.ts, max(i.ts)) AS ts, a.value + coalesce(sum(i.delta), 0) AS value
FROM latest a
LEFT JOIN increments i
    ON i.series_id = a.series_id AND i.ts > a.ts AND i.ts >= (SELECT ts FROM newest) - INTERVAL 2 HOUR
GROUP BY a.series_id, a.ts, a.value
HAVING greatest(a.ts, max(i.ts)) >= (SELECT ts FROM newest) - INTERVAL 1 HOUR
