-- Users: the bins holding the median and the 90th percentile of mean inter-token latency, from the
-- hourly 1% histogram.
WITH /*requests_hourly*/,
h AS (SELECT bin, sum(requests) n FROM itl GROUP BY bin),
c AS (SELECT bin, sum(n) OVER (ORDER BY bin) cum, sum(n) OVER () total FROM h)
SELECT min(bin) FILTER (WHERE cum >= 0.5 * total) b50, min(bin) FILTER (WHERE cum >= 0.9 * total) b90 FROM c
