-- Gauge samples of [$start, $until) rolled up into minutes: mean, max and count per series and
-- minute, of the series whose values are read as levels (not counters, histograms or summaries).
INSERT INTO samples_1m
SELECT time_bucket(INTERVAL 1 MINUTE, x.ts), x.series_id, avg(x.value), max(x.value), count(x.value)
FROM samples x JOIN series s USING (series_id)
WHERE x.ts >= $start AND x.ts < $until AND s.kind IN ('gauge', 'unknown', 'untyped', 'info', 'stateset')
GROUP BY ALL
