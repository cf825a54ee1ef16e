-- Per finishing hour, user, tenant and model, the sums requests_1h keeps, of the requests stored in
-- [$ingested_from, $ingested_until) that finished in [$finished_from, $finished_until); a NULL bound
-- is open, and a NULL $ingested_from means "not rolled up yet" (stored since the hourly roll-up's
-- watermark). The roll-up adds these rows; readers add them for the records not rolled up yet.
SELECT time_bucket(INTERVAL 1 HOUR, finished_at) AS ts, user_id, tenant, model, count(*) AS requests,
       count(*) FILTER (WHERE outcome <> 'ok') AS errors, sum(prompt_tokens)::BIGINT AS prompt_tokens,
       coalesce(sum(cached_prompt_tokens), 0)::BIGINT AS cached_prompt_tokens,
       sum(generated_tokens)::BIGINT AS generated_tokens, count(itl_mean_seconds) AS timed,
       coalesce(sum(itl_mean_seconds), 0) AS itl_sum_seconds, coalesce(sum(ttft_seconds), 0) AS ttft_sum_seconds,
       sum(e2e_seconds) AS e2e_sum_seconds
FROM requests
WHERE /*requests_hour_where*/
GROUP BY ALL
