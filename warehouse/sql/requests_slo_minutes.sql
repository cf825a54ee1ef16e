-- Per finishing minute, SLO class and tenant, the sums requests_slo_1m and requests_slo_1h keep
-- (migration 012) of the requests `judged` picked (warehouse/sql/request_slo.sql).
SELECT time_bucket(INTERVAL 1 MINUTE, finished_at) AS ts, coalesce(slo_class, '') AS class, tenant,
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
