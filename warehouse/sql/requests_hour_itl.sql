-- Per finishing hour, the histogram requests_itl_1h keeps: requests by mean inter-token latency in
-- log bins ($bin_scale = 100: bins 1% wide, bin = round(100 ln seconds)), of the same requests as
-- requests_hour_sums.sql.
SELECT time_bucket(INTERVAL 1 HOUR, finished_at) AS ts, CAST(round($bin_scale * ln(itl_mean_seconds)) AS INTEGER) AS bin,
       count(*) AS requests
FROM requests
WHERE /*requests_hour_where*/
  AND itl_mean_seconds > 0
GROUP BY ALL
