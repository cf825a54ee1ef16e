-- Users: requests that finished in [$start, $end) by mean inter-token latency, in log bins $width
-- times as wide as the hourly histogram's ($bin_scale per unit of ln seconds).
SELECT floor($bin_scale * ln(itl_mean_seconds) / $width) k, count(*) requests FROM requests
WHERE finished_at >= $start::TIMESTAMP AND finished_at < $end::TIMESTAMP AND itl_mean_seconds > 0
GROUP BY ALL ORDER BY k
