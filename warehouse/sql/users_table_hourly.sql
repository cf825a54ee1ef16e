-- Users: the top $limit users (of their tenant) of the window by $order (tokens, generated_tokens, requests, errors),
-- from the hourly sums (no P90s there).
WITH /*requests_hourly*/,
u AS (
    SELECT user_id, tenant, sum(requests)::BIGINT requests,
           sum(errors)::BIGINT errors, sum(prompt_tokens)::BIGINT prompt_tokens,
           sum(cached_prompt_tokens)::BIGINT cached_prompt_tokens, sum(generated_tokens)::BIGINT generated_tokens,
           sum(prompt_tokens + generated_tokens)::BIGINT tokens,
           sum(timed) / nullif(sum(itl_sum_seconds), 0) tps_mean, NULL::DOUBLE tps_p90,
           sum(ttft_sum_seconds) / nullif(sum(requests), 0) ttft_p50, NULL::DOUBLE ttft_p90
    FROM hourly GROUP BY user_id, tenant
)
SELECT * FROM u
ORDER BY CASE $order WHEN 'tokens' THEN tokens WHEN 'generated_tokens' THEN generated_tokens
                     WHEN 'requests' THEN requests ELSE errors END DESC, user_id, tenant
LIMIT $limit
