-- Per finishing minute and SLO class, the requests held to an objective and those that met it, of
-- the requests picked by request_slo.sql (the roll-up passes those stored in [$ingested_from,
-- $ingested_until) and no edges).
WITH /*request_slo*/
SELECT time_bucket(INTERVAL 1 MINUTE, finished_at) AS ts, coalesce(slo_class, '') AS class,
       count(*) FILTER (WHERE held) AS held, count(*) FILTER (WHERE met) AS met
FROM judged
GROUP BY ALL
