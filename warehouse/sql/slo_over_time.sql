-- SLO page: per step and class, the requests held to an objective and those that met it, from the
-- records that finished in [$edges_start, $edges_end) (the caller passes no hours: $finished_from =
-- $finished_until = $edges_end, so request_slo.sql reads every record of the window once).
WITH /*request_slo*/
SELECT make_timestamp(epoch_us(finished_at) // $step_us * $step_us) AS bucket, coalesce(slo_class, '') AS class,
       count(*) FILTER (WHERE held) AS held, count(*) FILTER (WHERE met) AS met
FROM judged
GROUP BY ALL
ORDER BY bucket, class
