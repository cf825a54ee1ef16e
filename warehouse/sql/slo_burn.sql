-- SLO burn (the alert pack's fast and slow burn, judged on the warehouse by warehouse/alerts.py):
-- per whole minute of [$since, $until) and class, the requests held to an objective and those that
-- met it: the per-minute roll-up, and the records stored since it ($ingested_from: its watermark)
-- that finished then. back 0 is the minute [$until - 1 min, $until), back 1 the one before.
WITH /*request_slo*/
SELECT (epoch_us($until::TIMESTAMP) - epoch_us(minute)) // 60000000 - 1 AS back, class,
       sum(held)::BIGINT AS held, sum(met)::BIGINT AS met
FROM (
    SELECT ts AS minute, class, held, met
    FROM requests_slo_1m WHERE ts >= $since::TIMESTAMP AND ts < $until::TIMESTAMP
    UNION ALL
    SELECT time_bucket(INTERVAL 1 MINUTE, finished_at), coalesce(slo_class, ''),
           count(*) FILTER (WHERE held), count(*) FILTER (WHERE met)
    FROM judged
    GROUP BY ALL
)
WHERE class <> ''
GROUP BY ALL
ORDER BY back, class
