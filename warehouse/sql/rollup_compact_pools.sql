-- A pool rollup's rows in [$start, $until) ({{table}}: pool_histograms_1m, _6m or _1h), one row per
-- period, pool, sample name and bucket bound, into the temp table `compacted`, stored hour by hour
-- and key by key (warehouse/rollup.py, _compact).
CREATE OR REPLACE TEMP TABLE compacted AS
SELECT ts, role, metric, le, sum(delta) AS delta, sum(seconds) AS seconds, sum(idle_seconds) AS idle_seconds
FROM {{table}} WHERE ts >= $start AND ts < $until
GROUP BY ts, role, metric, le ORDER BY time_bucket(INTERVAL 1 HOUR, ts), role, metric, le, ts
