-- The per-request SLO sums (migration 012) of a group of `judged` rows (request_slo_judged.sql),
-- as a select list: requests, held, met, failed, the three targets' misses, and the tokens.
count(*) AS requests, count(*) FILTER (WHERE held) AS held, count(*) FILTER (WHERE met) AS met,
       count(*) FILTER (WHERE held AND outcome <> 'ok' AND NOT abandoned) AS failed,
       count(*) FILTER (WHERE missed_ttft) AS missed_ttft, count(*) FILTER (WHERE missed_itl) AS missed_itl,
       count(*) FILTER (WHERE missed_e2e) AS missed_e2e, sum(prompt_tokens) AS prompt_tokens,
       sum(cached) AS cached_prompt_tokens, sum(generated_tokens) AS generated_tokens,
       coalesce(sum(prompt_tokens) FILTER (WHERE met), 0) AS good_prompt_tokens,
       coalesce(sum(cached) FILTER (WHERE met), 0) AS good_cached_prompt_tokens,
       coalesce(sum(generated_tokens) FILTER (WHERE met), 0) AS good_generated_tokens
