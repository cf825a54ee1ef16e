-- Users: the requests that finished in [$start, $end): counts, tokens, and exact quantiles of mean
-- inter-token latency and TTFT. A user is named within its tenant.
SELECT count(*) n, count(DISTINCT (tenant, user_id)) users, count(*) FILTER (WHERE outcome <> 'ok') errors,
       sum(prompt_tokens) p, coalesce(sum(cached_prompt_tokens), 0) c, sum(generated_tokens) g,
       quantile_cont(itl_mean_seconds, 0.5) itl50, quantile_cont(itl_mean_seconds, 0.9) itl90,
       quantile_cont(ttft_seconds, 0.5) ttft50, quantile_cont(ttft_seconds, 0.9) ttft90
FROM requests WHERE finished_at >= $start::TIMESTAMP AND finished_at < $end::TIMESTAMP
