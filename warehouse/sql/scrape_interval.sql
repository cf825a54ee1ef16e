-- The collector's interval as stored: the median gap between a target's scrapes in the last 15 min.
SELECT median(epoch(ts) - epoch(prev)) AS seconds
FROM (SELECT ts, lag(ts) OVER (PARTITION BY target ORDER BY ts) AS prev FROM scrapes
      WHERE ts > (SELECT max(ts) FROM scrapes) - INTERVAL 15 MINUTE)
WHERE prev IS NOT NULL
