-- Per finishing hour, SLO class and tenant, the sums requests_slo_1h keeps: its rows for the hours
-- [$finished_from, $finished_until) and the same sums of the requests picked by request_slo.sql.
-- The roll-up passes the records stored in [$ingested_from, $ingested_until) and no hours or edges;
-- a report passes the window's whole hours, the records not rolled up yet, and the window's edges.
WITH /*request_slo*/
SELECT ts, class, tenant, sum(requests)::BIGINT AS requests, sum(held)::BIGINT AS held, sum(met)::BIGINT AS met,
       sum(failed)::BIGINT AS failed, sum(missed_ttft)::BIGINT AS missed_ttft, sum(missed_itl)::BIGINT AS missed_itl,
       sum(missed_e2e)::BIGINT AS missed_e2e, sum(prompt_tokens)::BIGINT AS prompt_tokens,
       sum(cached_prompt_tokens)::BIGINT AS cached_prompt_tokens, sum(generated_tokens)::BIGINT AS generated_tokens,
       sum(good_prompt_tokens)::BIGINT AS good_prompt_tokens,
       sum(good_cached_prompt_tokens)::BIGINT AS good_cached_prompt_tokens,
       sum(good_generated_tokens)::BIGINT AS good_generated_tokens
FROM (
    SELECT * FROM requests_slo_1h WHERE ts >= $finished_from::TIMESTAMP AND ts < $finished_until::TIMESTAMP
    UNION ALL BY NAME
    SELECT time_bucket(INTERVAL 1 HOUR, finished_at) AS ts, coalesce(slo_class, '') AS class, tenant,
           count(*) AS requests, count(*) FILTER (WHERE held) AS held, count(*) FILTER (WHERE met) AS met,
           count(*) FILTER (WHERE held AND outcome <> 'ok' AND NOT abandoned) AS failed,
           count(*) FILTER (WHERE missed_ttft) AS missed_ttft, count(*) FILTER (WHERE missed_itl) AS missed_itl,
           count(*) FILTER (WHERE missed_e2e) AS missed_e2e, sum(prompt_tokens) AS prompt_tokens,
           sum(cached) AS cached_prompt_tokens, sum(generated_tokens) AS generated_tokens,
           coalesce(sum(prompt_tokens) FILTER (WHERE met), 0) AS good_prompt_tokens,
           coalesce(sum(cached) FILTER (WHERE met), 0) AS good_cached_prompt_tokens,
           coalesce(sum(generated_tokens) FILTER (WHERE met), 0) AS good_generated_tokens
    FROM judged
    GROUP BY ALL
)
GROUP BY ALL
ORDER BY ts, class, tenant
