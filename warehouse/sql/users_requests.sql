-- Users: one user's (of $tenant) latest $limit requests that finished before $end, newest first.
SELECT finished_at, request_id, tenant, model, outcome, status, prompt_tokens, cached_prompt_tokens,
       generated_tokens, ttft_seconds, 1 / itl_mean_seconds AS tokens_per_second, e2e_seconds
FROM requests WHERE tenant = $tenant AND user_id = $user AND finished_at < $end::TIMESTAMP
ORDER BY finished_at DESC LIMIT $limit
