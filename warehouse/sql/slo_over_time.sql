-- SLO page: per step and class, the requests held to an objective and those that met it, of those
-- that finished in [$edges_start, $edges_end). A step of whole minutes reads the minutes
-- [$minutes_from, $minutes_until) from requests_slo_1m (and the records not rolled up into it yet),
-- the seconds at either edge from the records; any other step reads every record of the window
-- (no minutes). The caller passes no hours: warehouse/goodput.py, slo_window(hours=False).
WITH /*request_slo*/
SELECT make_timestamp(epoch_us(ts) // $step_us * $step_us) AS bucket, class,
       sum(held)::BIGINT AS held, sum(met)::BIGINT AS met
FROM (
    SELECT ts, class, held, met FROM requests_slo_1m
    -- a lake's rows published before migration 023 are read as requests_slo.sql reads them: not at all
    WHERE requests IS NOT NULL AND ts >= $minutes_from::TIMESTAMP AND ts < $minutes_until::TIMESTAMP
    UNION ALL
    SELECT finished_at, coalesce(slo_class, ''), held::BIGINT, met::BIGINT FROM judged
)
GROUP BY ALL
ORDER BY bucket, class
