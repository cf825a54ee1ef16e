-- SLO burn (the alert pack's fast and slow burn, judged on the warehouse by warehouse/alerts.py):
-- per minute back from $edges_end and class, the requests held to an objective and those that met
-- it, from the records that finished in [$edges_start, $edges_end). back 0 is
-- [$edges_end - $step_us, $edges_end), back 1 the minute before, and so on.
WITH /*request_slo*/
SELECT (epoch_us($edges_end::TIMESTAMP) - 1 - epoch_us(finished_at)) // $step_us AS back, slo_class AS class,
       count(*) FILTER (WHERE held) AS held, count(*) FILTER (WHERE met) AS met
FROM judged
WHERE slo_class IS NOT NULL
GROUP BY ALL
ORDER BY back, class
