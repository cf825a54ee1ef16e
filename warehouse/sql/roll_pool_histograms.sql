-- The rows a roll adds to a per-series counter rollup (the temp table `rolled`), summed per pool,
-- sample name and bucket bound for the histogram and summary series
-- (warehouse/migrations/017_pool_histograms.sql).
SELECT r.ts, s.role, s.metric, s.le, sum(r.delta) AS delta, sum(r.seconds) AS seconds,
       sum(r.idle_seconds) AS idle_seconds
FROM rolled r JOIN series_targets s USING (series_id)
WHERE s.kind IN ('histogram', 'summary') GROUP BY ALL
