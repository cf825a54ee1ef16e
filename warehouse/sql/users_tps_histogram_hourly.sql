-- Users: requests by mean inter-token latency in bins $width times as wide as the hourly histogram's.
WITH /*requests_hourly*/
SELECT floor(bin / $width) k, sum(requests)::BIGINT requests FROM itl GROUP BY ALL ORDER BY k
