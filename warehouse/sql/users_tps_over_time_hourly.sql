-- Users: per hour, the bins of the median and 90th-percentile mean inter-token latency, and requests.
WITH /*requests_hourly*/,
h AS (SELECT ts, bin, sum(requests) requests FROM itl GROUP BY ALL),
c AS (SELECT ts, bin, sum(requests) OVER (PARTITION BY ts ORDER BY bin) cum,
             sum(requests) OVER (PARTITION BY ts) total FROM h)
SELECT ts bucket, min(bin) FILTER (WHERE cum >= 0.5 * total) b50,
       min(bin) FILTER (WHERE cum >= 0.9 * total) b90, max(total)::BIGINT requests
FROM c GROUP BY ts ORDER BY ts
