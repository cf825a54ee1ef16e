-- Users: the top $limit users (of their tenant) of [$start, $end) by $order, from the per-request
-- records (exact P90s).
WITH u AS (
    SELECT user_id, tenant, count(*) requests,
           count(*) FILTER (WHERE outcome <> 'ok') errors, sum(prompt_tokens)::BIGINT prompt_tokens,
           coalesce(sum(cached_prompt_tokens), 0)::BIGINT cached_prompt_tokens,
           sum(generated_tokens)::BIGINT generated_tokens, sum(prompt_tokens + generated_tokens)::BIGINT tokens,
           count(itl_mean_seconds) / nullif(sum(itl_mean_seconds), 0) tps_mean,
           1 / quantile_cont(itl_mean_seconds, 0.9) tps_p90,
           quantile_cont(ttft_seconds, 0.5) ttft_p50, quantile_cont(ttft_seconds, 0.9) ttft_p90
    FROM requests WHERE finished_at >= $start::TIMESTAMP AND finished_at < $end::TIMESTAMP GROUP BY user_id, tenant
)
SELECT * FROM u
ORDER BY CASE $order WHEN 'tokens' THEN tokens WHEN 'generated_tokens' THEN generated_tokens
                     WHEN 'requests' THEN requests ELSE errors END DESC, user_id, tenant
LIMIT $limit
