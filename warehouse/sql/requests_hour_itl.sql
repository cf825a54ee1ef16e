-- Per finishing hour, the histogram requests_itl_1h keeps: requests by mean inter-token latency in
-- log bins ($bin_scale = 100: bins 1% wide, bin = round(100 ln seconds)), of the same requests as
-- requests_hour_sums.sql.
SELECT time_bucket(INTERVAL 1 HOUR, finished_at) AS ts, CAST(round($bin_scale * ln(itl_mean_seconds)) AS INTEGER) AS bin,
       count(*) AS requests
FROM requests
WHERE ingested_at >= coalesce($ingested_from::TIMESTAMP,
                              (SELECT max(through) FROM rollup_state WHERE name = '1h'), '-infinity'::TIMESTAMP)
  AND ingested_at < coalesce($ingested_until::TIMESTAMP, 'infinity'::TIMESTAMP)
  AND finished_at >= coalesce($finished_from::TIMESTAMP, '-infinity'::TIMESTAMP)
  AND finished_at < coalesce($finished_until::TIMESTAMP, 'infinity'::TIMESTAMP)
  AND itl_mean_seconds > 0
GROUP BY ALL
