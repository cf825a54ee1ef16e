-- Users: one user's (of $tenant) requests, errors, tokens and mean tokens/s per step of [$start, $end).
SELECT make_timestamp(epoch_us(finished_at) // $step_us * $step_us) bucket, count(*) requests,
       count(*) FILTER (WHERE outcome <> 'ok') errors, sum(prompt_tokens)::BIGINT prompt_tokens,
       sum(generated_tokens)::BIGINT generated_tokens,
       count(itl_mean_seconds) / nullif(sum(itl_mean_seconds), 0) tps_mean
FROM requests
WHERE tenant = $tenant AND user_id = $user AND finished_at >= $start::TIMESTAMP AND finished_at < $end::TIMESTAMP
GROUP BY ALL ORDER BY bucket
