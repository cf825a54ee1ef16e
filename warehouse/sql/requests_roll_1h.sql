-- Adds the requests stored in [$ingested_from, $ingested_until) to their finishing hour's per-user,
-- tenant and model sums (warehouse/requests.py, roll_requests_1h).
INSERT INTO requests_1h
/*requests_hour_sums*/
ON CONFLICT (ts, user_id, tenant, model) DO UPDATE SET
    requests = requests + excluded.requests, errors = errors + excluded.errors,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_prompt_tokens = cached_prompt_tokens + excluded.cached_prompt_tokens,
    generated_tokens = generated_tokens + excluded.generated_tokens,
    timed = timed + excluded.timed, itl_sum_seconds = itl_sum_seconds + excluded.itl_sum_seconds,
    ttft_sum_seconds = ttft_sum_seconds + excluded.ttft_sum_seconds,
    e2e_sum_seconds = e2e_sum_seconds + excluded.e2e_sum_seconds
