-- Minute rows of gauges in [$start, $until) rolled up into hours: the mean weighted by samples, the
-- max of maxima and the samples counted, per series and hour.
INSERT INTO samples_1h
SELECT time_bucket(INTERVAL 1 HOUR, x.ts), x.series_id, sum(x.value * x.n) / nullif(sum(x.n), 0), max(x.max),
       sum(x.n)
FROM samples_1m x JOIN series s USING (series_id)
WHERE x.ts >= $start AND x.ts < $until
GROUP BY ALL
