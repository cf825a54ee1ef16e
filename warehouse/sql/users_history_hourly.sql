-- Users: one user's (of $tenant) requests, errors, tokens and mean tokens/s per hour.
WITH /*requests_hourly*/
SELECT ts bucket, sum(requests)::BIGINT requests, sum(errors)::BIGINT errors,
       sum(prompt_tokens)::BIGINT prompt_tokens, sum(generated_tokens)::BIGINT generated_tokens,
       sum(timed) / nullif(sum(itl_sum_seconds), 0) tps_mean
FROM hourly WHERE tenant = $tenant AND user_id = $user GROUP BY ts ORDER BY ts
