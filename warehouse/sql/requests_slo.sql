-- Per finishing hour, SLO class and tenant, the sums requests_slo_1h keeps: its rows for the hours
-- [$finished_from, $finished_until), requests_slo_1m's for the minutes [$minutes_from,
-- $finished_from) and [$finished_until, $minutes_until), and the same sums of the requests picked
-- by request_slo.sql (those not rolled up into either yet, and the window's edges).
-- The roll-up passes the records stored in [$ingested_from, $ingested_until) and no hours, minutes
-- or edges; a report passes the window's whole hours, its whole minutes around them, and its edges.
WITH /*request_slo*/
SELECT time_bucket(INTERVAL 1 HOUR, ts) AS ts, class, tenant, sum(requests)::BIGINT AS requests,
       sum(held)::BIGINT AS held, sum(met)::BIGINT AS met,
       sum(failed)::BIGINT AS failed, sum(missed_ttft)::BIGINT AS missed_ttft, sum(missed_itl)::BIGINT AS missed_itl,
       sum(missed_e2e)::BIGINT AS missed_e2e, sum(prompt_tokens)::BIGINT AS prompt_tokens,
       sum(cached_prompt_tokens)::BIGINT AS cached_prompt_tokens, sum(generated_tokens)::BIGINT AS generated_tokens,
       sum(good_prompt_tokens)::BIGINT AS good_prompt_tokens,
       sum(good_cached_prompt_tokens)::BIGINT AS good_cached_prompt_tokens,
       sum(good_generated_tokens)::BIGINT AS good_generated_tokens
FROM (
    SELECT * FROM requests_slo_1h WHERE ts >= $finished_from::TIMESTAMP AND ts < $finished_until::TIMESTAMP
    UNION ALL BY NAME
    SELECT * FROM requests_slo_1m
    -- a lake's rows published before migration 023 have no tenant or sums: its minutes are not read
    WHERE requests IS NOT NULL
      AND (ts >= $minutes_from::TIMESTAMP AND ts < $finished_from::TIMESTAMP
           OR ts >= $finished_until::TIMESTAMP AND ts < $minutes_until::TIMESTAMP)
    UNION ALL BY NAME
    /*requests_slo_minutes*/
)
GROUP BY ALL
ORDER BY ts, class, tenant
