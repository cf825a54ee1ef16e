-- A per-series counter rollup's rows in [$start, $until) ({{table}}: increments_1m, _6m or _1h),
-- one row per period and series, into the temp table `compacted`, stored hour by hour and series by
-- series (warehouse/rollup.py, _compact; rollup_compact_delete.sql and rollup_compact_insert.sql
-- put them back).
CREATE OR REPLACE TEMP TABLE compacted AS
SELECT ts, series_id, sum(delta) AS delta, sum(seconds) AS seconds, sum(idle_seconds) AS idle_seconds,
       sum(resets)::INTEGER AS resets
FROM {{table}} WHERE ts >= $start AND ts < $until
GROUP BY ts, series_id ORDER BY time_bucket(INTERVAL 1 HOUR, ts), series_id, ts
