-- Per target: up at its last scrape in [$start, $end), that scrape's duration, samples and error;
-- failures in the window; inputs refused or repaired in it and the latest reason.
WITH s AS (
    SELECT target, arg_max(up, ts) AS up, max(ts) AS last_scrape,
           -- _null: the last scrape's own values, NULL included (arg_max skips NULLs: a recovered
           -- target showed its old error beside up)
           arg_max_null(duration_seconds, ts) AS duration_seconds, arg_max_null(samples, ts) AS samples,
           arg_max_null(error, ts) AS error,
           count(*) FILTER (WHERE NOT up) AS failures, count(*) AS scrapes
    FROM scrapes WHERE ts >= $start::TIMESTAMP AND ts < $end::TIMESTAMP GROUP BY target),
r AS (
    SELECT target, sum(count) AS refused, arg_max(kind || ': ' || reason, ts) AS last_refusal
    FROM rejected WHERE ts >= $start::TIMESTAMP AND ts < $end::TIMESTAMP GROUP BY target)
SELECT s.*, coalesce(r.refused, 0)::BIGINT AS refused, r.last_refusal
FROM s LEFT JOIN r USING (target) ORDER BY up, target
